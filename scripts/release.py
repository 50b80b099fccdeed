"""Turn any stage output into a Hub-ready folder (shards + index, remote code, tokenizer with chat template,
generation config, model card with the resolved hyperparameters and the eval table); the work is in
`instella_recipes.checkpoint.release`.

    python scripts/release.py --model_dir runs/demo/dpo --output_dir runs/demo/release \
        [--eval_results runs/demo/eval_dpo ...] [--push_to_hub --repo_id org/name]
"""

from pathlib import Path

from instella_recipes.checkpoint.release import ReleaseArguments, release
from instella_recipes.core import exit_on_recipe_error, parse_recipe, setup_logging


@exit_on_recipe_error
def main(argv=None) -> Path:
    (args,) = parse_recipe([ReleaseArguments], argv)
    setup_logging()
    return release(args)


if __name__ == "__main__":
    main()
