"""Generate a chat model's answers in the input formats of the two LLM-judged benchmarks of the instruct table:
AlpacaEval 2 (length-controlled win rate) and MT-Bench (0-10). The judging itself calls a proprietary judge model
(GPT-4 class) and is not done here; there is no stand-in judge. The judging commands (run where the judge's API is
reachable) are in docs/evaluation.md and printed at the end.

    python scripts/judge_inputs.py --model runs/dpo --model_id instella-3b-instruct-ours --output_dir runs/judge \
        --alpaca_eval alpaca_eval.json --mt_bench question.jsonl [--max_new_tokens 1024] [--limit N]

Inputs (the benchmarks' own question files, fetched where the Hub is reachable):
- AlpacaEval: `alpaca_eval.json` of `tatsu-lab/alpaca_eval` (a JSON list of {"instruction", "dataset", ...}).
- MT-Bench: FastChat's `fastchat/llm_judge/data/mt_bench/question.jsonl` ({"question_id", "category", "turns"}).
Outputs:
- `<output_dir>/alpaca_eval/<model_id>.json`: [{"instruction", "output", "generator", "dataset"}] (alpaca_eval's
  `--model_outputs` format); greedy decoding.
- `<output_dir>/mt_bench/model_answer/<model_id>.jsonl`: {"question_id", "answer_id", "model_id", "choices":
  [{"index": 0, "turns": [...]}], "tstamp"} (FastChat's answer format); turn 2 sees turn 1's answer; temperature per
  category as FastChat's `gen_model_answer.py` sets it (0.7 writing/roleplay, 0.1 stem/humanities, else greedy).
"""

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import torch

# FastChat llm_judge/common.py temperature_config
MT_BENCH_TEMPERATURE = {
    "writing": 0.7, "roleplay": 0.7, "extraction": 0.0, "math": 0.0, "coding": 0.0, "reasoning": 0.0,
    "stem": 0.1, "humanities": 0.1, "arena-hard-200": 0.0,
}  # fmt: skip

JUDGE_COMMANDS = """\
AlpacaEval 2 (length-controlled win rate vs GPT-4 Turbo; needs OPENAI_API_KEY):
  pip install alpaca-eval
  alpaca_eval --model_outputs {alpaca} --annotators_config weighted_alpaca_eval_gpt4_turbo
MT-Bench (GPT-4 single-answer grading; needs OPENAI_API_KEY):
  git clone https://github.com/lm-sys/FastChat && cd FastChat/fastchat/llm_judge
  cp {mt_bench} data/mt_bench/model_answer/
  python gen_judgment.py --model-list {model_id} --parallel 2
  python show_result.py --model-list {model_id}
Report them with: python scripts/eval_report.py --suite instella_instruct --results <lm-eval results> \\
  --judge AE2=<LC win rate %> MT-B=<score 0-10> --output_dir <dir>
"""


class JudgeInputError(ValueError):
    pass


def read_alpaca_eval(path) -> list[dict]:
    rows = json.loads(Path(path).read_text())
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "instruction" in r for r in rows):
        raise JudgeInputError(f"{path}: expected a JSON list of objects with an 'instruction' (alpaca_eval.json)")
    return rows


def read_mt_bench(path) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        if not {"question_id", "turns"} <= set(row):
            raise JudgeInputError(f"{path}:{i + 1}: expected 'question_id' and 'turns' (FastChat question.jsonl)")
    return rows


def load_chat_model(path):
    from transformers import AutoModelForCausalLM

    from instella_recipes.evaluation.preflight import check_model_dir

    _, tokenizer = check_model_dir(path)
    if not tokenizer.chat_template:
        raise JudgeInputError(f"{path}: the tokenizer has no chat template (judge benchmarks need a chat model)")
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    return model, tokenizer


def chat(model, tokenizer, messages, max_new_tokens, temperature=0.0) -> str:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": temperature > 0}
    if temperature > 0:
        kwargs["temperature"] = temperature
    with torch.inference_mode():
        out = model.generate(**ids, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **kwargs)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip()


def _write_atomic(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".partial")
    tmp.write_text(text)
    tmp.rename(path)
    return path


def alpaca_eval_outputs(model, tokenizer, rows, model_id, max_new_tokens) -> list[dict]:
    return [
        {
            "instruction": row["instruction"],
            "output": chat(model, tokenizer, [{"role": "user", "content": row["instruction"]}], max_new_tokens),
            "generator": model_id,
            "dataset": row.get("dataset", ""),
        }
        for row in rows
    ]


def mt_bench_answers(model, tokenizer, rows, model_id, max_new_tokens, seed=0) -> list[dict]:
    answers = []
    for row in rows:
        torch.manual_seed(seed)
        temperature = MT_BENCH_TEMPERATURE.get(row.get("category"), 0.7)
        messages, turns = [], []
        for question in row["turns"]:
            messages.append({"role": "user", "content": question})
            reply = chat(model, tokenizer, messages, max_new_tokens, temperature)
            messages.append({"role": "assistant", "content": reply})
            turns.append(reply)
        answers.append(
            {
                "question_id": row["question_id"],
                "answer_id": uuid.uuid4().hex,
                "model_id": model_id,
                "choices": [{"index": 0, "turns": turns}],
                "tstamp": time.time(),
            }
        )
    return answers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="chat model folder")
    parser.add_argument("--model_id", required=True, help="name the judges will show")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--alpaca_eval", default=None, help="alpaca_eval.json (tatsu-lab/alpaca_eval)")
    parser.add_argument("--mt_bench", default=None, help="FastChat mt_bench question.jsonl")
    parser.add_argument("--max_new_tokens", type=int, default=1024)
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions of each")
    args = parser.parse_args(argv)
    try:
        if not (args.alpaca_eval or args.mt_bench):
            raise JudgeInputError("give --alpaca_eval and/or --mt_bench question files")
        alpaca = read_alpaca_eval(args.alpaca_eval)[: args.limit] if args.alpaca_eval else None
        mt_bench = read_mt_bench(args.mt_bench)[: args.limit] if args.mt_bench else None
        model, tokenizer = load_chat_model(args.model)
    except (JudgeInputError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.output_dir)
    alpaca_path = out / "alpaca_eval" / f"{args.model_id}.json"
    mt_path = out / "mt_bench" / "model_answer" / f"{args.model_id}.jsonl"
    if alpaca is not None:
        rows = alpaca_eval_outputs(model, tokenizer, alpaca, args.model_id, args.max_new_tokens)
        _write_atomic(alpaca_path, json.dumps(rows, indent=2))
    if mt_bench is not None:
        rows = mt_bench_answers(model, tokenizer, mt_bench, args.model_id, args.max_new_tokens)
        _write_atomic(mt_path, "".join(json.dumps(r) + "\n" for r in rows))
    print(JUDGE_COMMANDS.format(alpaca=alpaca_path, mt_bench=mt_path, model_id=args.model_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
