"""Synthetic GSM8K (amd/Instella-GSM8K-synthetic, SPEC.md 2): the published 4-step method with a real sandbox.

    python scripts/synthetic_gsm8k.py --config recipes/synthetic_gsm8k/qwen_vllm.yaml [--seeds S --output_dir O ...]

Killed half way, the same command resumes. See docs/synthetic_gsm8k.md.
"""

from instella_recipes.core import exit_on_recipe_error, parse_recipe, setup_logging
from instella_recipes.synthetic_gsm8k.run import SyntheticArgs, format_summary, run


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_recipe([SyntheticArgs], argv)
    setup_logging()
    summary = run(args)
    print(format_summary(summary))
    return summary


if __name__ == "__main__":
    main()
