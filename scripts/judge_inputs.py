"""Generate a chat model's answers in the input formats of the two LLM-judged benchmarks of the instruct table:
AlpacaEval 2 (length-controlled win rate) and MT-Bench (0-10). The judging itself calls a proprietary judge model
(GPT-4 class) and is not done here; there is no stand-in judge. The judging commands (run where the judge's API is
reachable) are in docs/evaluation.md and printed at the end.

    python scripts/judge_inputs.py --model runs/dpo --model_id instella-3b-instruct-ours --output_dir runs/judge \
        --alpaca_eval alpaca_eval.json --mt_bench question.jsonl [--max_new_tokens 1024] \
        [--alpaca_max_new_tokens 8192] [--limit N]

Inputs (the benchmarks' own question files, fetched where the Hub is reachable):
- AlpacaEval: `alpaca_eval.json` of `tatsu-lab/alpaca_eval` (a JSON list of {"instruction", "dataset", ...}).
- MT-Bench: FastChat's `fastchat/llm_judge/data/mt_bench/question.jsonl` ({"question_id", "category", "turns"}).
Outputs:
- `<output_dir>/alpaca_eval/<model_id>.json`: [{"instruction", "output", "generator", "dataset"}] (alpaca_eval's
  `--model_outputs` format); as OLMES's `alpaca_eval_v2::tulu`: the model's chat template, greedy, up to 8,192 new
  tokens (bounded by the model's context window).
- `<output_dir>/mt_bench/model_answer/<model_id>.jsonl`: {"question_id", "answer_id", "model_id", "choices":
  [{"index": 0, "turns": [...]}], "tstamp"} (FastChat's answer format); as the authors' FastChat run: their
  `instella` conversation template (no `<|endoftext|>` after turn 1's answer, unlike the chat template), turn 2 after
  turn 1's answer, temperature per category as `gen_model_answer.py` sets it (0.7 writing/roleplay, 0.1
  stem/humanities, else greedy), at most 1,024 new tokens per turn.
"""

try:
    from instella_recipes.evaluation.judge_inputs import main
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
