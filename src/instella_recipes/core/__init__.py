"""What every entry point shares: the one bad-input error, the recipe parser, atomic outputs, manifests, the
model-folder check, logging and the repository paths."""

from .checks import check_choice, check_positive, check_range
from .errors import RecipeError, did_you_mean, exit_on_recipe_error
from .io import atomic_file, atomic_output_dir, atomic_write_text, check_output_location, iter_jsonl, partial_path
from .logs import get_logger, is_main_process, setup_logging
from .manifest import MANIFEST, file_digest, read_manifest, require_complete, resolved_arguments, write_manifest
from .model_folder import check_model_folder, looks_like_hub_id
from .recipe import check_recipe_keys, config_path, load_recipe_yaml, parse_recipe

__all__ = [
    "atomic_file",
    "check_choice",
    "check_positive",
    "check_range",
    "atomic_output_dir",
    "atomic_write_text",
    "check_model_folder",
    "check_output_location",
    "did_you_mean",
    "get_logger",
    "is_main_process",
    "iter_jsonl",
    "looks_like_hub_id",
    "partial_path",
    "setup_logging",
    "MANIFEST",
    "RecipeError",
    "check_recipe_keys",
    "config_path",
    "exit_on_recipe_error",
    "file_digest",
    "load_recipe_yaml",
    "parse_recipe",
    "read_manifest",
    "require_complete",
    "resolved_arguments",
    "write_manifest",
]
