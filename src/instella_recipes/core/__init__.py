"""What every entry point shares: the one bad-input error, the recipe parser, atomic outputs and the output-folder
rule, manifests, logging, `{placeholders}` and `--set VAR=VALUE` (`variables`), and the repository paths. Model
folders on disk are `instella_recipes.weights`."""

from .checks import check_choice, check_numbers, check_positive, check_range, check_training_length
from .errors import (
    EnvironmentFailure,
    RecipeError,
    did_you_mean,
    environment_cause,
    exit_on_recipe_error,
    naming_write_failures,
)
from .io import (
    MANIFEST,
    atomic_file,
    atomic_output_dir,
    atomic_write_text,
    check_output_dir,
    check_output_location,
    check_path_length,
    check_replaceable,
    claim_output_dir,
    complete_stage,
    empty_folder,
    iter_jsonl,
    partial_path,
    retract_manifest,
    swap_in_folder,
)
from .logs import get_logger, is_main_process, setup_logging
from .manifest import (
    FileHasher,
    fast_digest,
    file_digest,
    read_manifest,
    require_complete,
    resolved_arguments,
    verify_files,
    write_manifest,
)
from .recipe import check_recipe_keys, config_path, load_recipe_yaml, parse_recipe
from .variables import fill_placeholders, parse_assignments

__all__ = [
    "atomic_file",
    "check_choice",
    "check_numbers",
    "check_positive",
    "check_range",
    "check_training_length",
    "atomic_output_dir",
    "atomic_write_text",
    "check_output_dir",
    "check_replaceable",
    "check_output_location",
    "check_path_length",
    "claim_output_dir",
    "complete_stage",
    "empty_folder",
    "did_you_mean",
    "EnvironmentFailure",
    "environment_cause",
    "fast_digest",
    "FileHasher",
    "get_logger",
    "is_main_process",
    "iter_jsonl",
    "naming_write_failures",
    "partial_path",
    "retract_manifest",
    "setup_logging",
    "swap_in_folder",
    "MANIFEST",
    "RecipeError",
    "check_recipe_keys",
    "config_path",
    "exit_on_recipe_error",
    "file_digest",
    "fill_placeholders",
    "load_recipe_yaml",
    "parse_assignments",
    "parse_recipe",
    "read_manifest",
    "require_complete",
    "resolved_arguments",
    "verify_files",
    "write_manifest",
]
