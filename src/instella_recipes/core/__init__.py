"""What every entry point shares: one bad-input error, the recipe parser, manifests, repository paths."""

from .errors import RecipeError, exit_on_recipe_error
from .manifest import MANIFEST, file_digest, read_manifest, require_complete, write_manifest
from .recipe import check_recipe_keys, load_recipe_yaml, parse_recipe

__all__ = [
    "MANIFEST",
    "RecipeError",
    "check_recipe_keys",
    "exit_on_recipe_error",
    "file_digest",
    "load_recipe_yaml",
    "parse_recipe",
    "read_manifest",
    "require_complete",
    "write_manifest",
]
