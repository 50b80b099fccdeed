"""Prepare pretraining data: read the recipe's sources, tokenise (no BOS, EOS appended), mix, pack fixed windows.

    python recipes/prepare_data.py --config recipes/tiny/prepare_data.yaml [--output_dir D --tokenizer T ...]

Runs on CPU nodes before training; the output folder is what `recipes/pretrain.py --data_dir` reads.
"""

from recipes.data.prepare import PrepareArguments, prepare
from recipes.training.args import exit_on_recipe_error, parse_recipe


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> None:
    (args,) = parse_recipe([PrepareArguments], argv)
    prepare(args)


if __name__ == "__main__":
    main()
