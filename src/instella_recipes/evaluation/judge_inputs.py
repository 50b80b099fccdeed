"""Answer files for the LLM-judged benchmarks (AlpacaEval 2, MT-Bench) from a chat model (`scripts/judge_inputs.py`);
the judging itself is left to the benchmarks' own tools (see that script's docstring for the formats)."""

import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch

from instella_recipes.core import (
    RecipeError,
    atomic_write_text,
    check_positive,
    check_range,
    exit_on_recipe_error,
    iter_jsonl,
    parse_recipe,
    setup_logging,
)
from instella_recipes.evaluation.preflight import check_model_dir

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


def read_alpaca_eval(path) -> list[dict]:
    rows = json.loads(Path(path).read_text())
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "instruction" in r for r in rows):
        raise RecipeError(f"{path}: expected a JSON list of objects with an 'instruction' (alpaca_eval.json)")
    return rows


def read_mt_bench(path) -> list[dict]:
    rows = []
    for number, row in iter_jsonl(path):
        if not {"question_id", "turns"} <= set(row):
            raise RecipeError(f"{path}:{number}: expected 'question_id' and 'turns' (FastChat question.jsonl)")
        rows.append(row)
    return rows


def load_chat_model(path):
    from transformers import AutoModelForCausalLM

    _, tokenizer = check_model_dir(path)
    if not tokenizer.chat_template:
        raise RecipeError(f"{path}: the tokenizer has no chat template (judge benchmarks need a chat model)")
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    return model, tokenizer


def generate(model, tokenizer, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0) -> str:
    """Greedy (temperature 0) or sampled generation until EOS, special tokens dropped, whitespace stripped (what
    FastChat's `gen_model_answer.py` keeps). At most the model's context window in all."""
    window = getattr(model.config, "max_position_embeddings", None)
    if window:
        max_new_tokens = max(1, min(max_new_tokens, window - input_ids.shape[1]))
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": temperature > 0}
    if temperature > 0:
        kwargs["temperature"] = temperature
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            **kwargs,
        )
    return tokenizer.decode(out[0, input_ids.shape[1] :], skip_special_tokens=True).strip()


def chat(model, tokenizer, messages, max_new_tokens, temperature=0.0) -> str:
    """One reply to `messages` rendered with the model's chat template (OLMES's AlpacaEval: `use_chat_format`)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return generate(model, tokenizer, ids["input_ids"], max_new_tokens, temperature)


def fastchat_instella_prompt(turns: list[tuple[str, str | None]], system: str = "") -> str:
    """The conversation as the authors' FastChat `instella` template renders it for MT-Bench (AMD-AIG-AIMA/Instella
    scripts/evals/README.md): the system prompt (empty by default) and a newline, then `<|endoftext|>`, then
    `<role>\n<message>\n` per message and `<|assistant|>\n` for the reply to generate. Unlike the model's chat
    template, an earlier assistant turn is not closed by `<|endoftext|>`."""
    text = (system + "\n" if system else "") + "<|endoftext|>"
    for role, message in turns:
        text += f"<|{role}|>\n" + (message + "\n" if message else "")
    return text


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
    """FastChat's `gen_model_answer.py` with the `instella` conversation: per question, seed 0, the category's
    temperature, turn 2 generated after turn 1's answer."""
    answers = []
    for row in rows:
        torch.manual_seed(seed)
        temperature = MT_BENCH_TEMPERATURE.get(row.get("category"), 0.7)
        turns, replies = [], []
        for question in row["turns"]:
            turns.append(("user", question))
            prompt = fastchat_instella_prompt([*turns, ("assistant", None)])
            input_ids = tokenizer([prompt], return_tensors="pt").input_ids
            reply = generate(model, tokenizer, input_ids, max_new_tokens, temperature)
            turns.append(("assistant", reply))
            replies.append(reply)
        answers.append(
            {
                "question_id": row["question_id"],
                "answer_id": uuid.uuid4().hex,
                "model_id": model_id,
                "choices": [{"index": 0, "turns": replies}],
                "tstamp": time.time(),
            }
        )
    return answers


# --- the command (scripts/judge_inputs.py) --------------------------------------------------------------------------
@dataclass
class JudgeInputsArguments:
    """The settings of `scripts/judge_inputs.py`."""

    model: str = field(default=None, metadata={"help": "Chat model folder."})
    model_id: str = field(default=None, metadata={"help": "Name the judges will show."})
    output_dir: str = field(default=None, metadata={"help": "Folder for alpaca_eval/ and mt_bench/ answers."})
    alpaca_eval: str | None = field(default=None, metadata={"help": "alpaca_eval.json (tatsu-lab/alpaca_eval)."})
    mt_bench: str | None = field(default=None, metadata={"help": "FastChat mt_bench question.jsonl."})
    max_new_tokens: int = field(default=1024, metadata={"help": "MT-Bench: longest answer per turn (FastChat)."})
    alpaca_max_new_tokens: int = field(default=8192, metadata={"help": "AlpacaEval: longest answer (OLMES)."})
    limit: int | None = field(default=None, metadata={"help": "Only the first N questions of each."})

    def __post_init__(self):
        if not (self.model and self.model_id and self.output_dir):
            raise ValueError("--model, --model_id and --output_dir are required")
        check_positive(self, "max_new_tokens")
        check_positive(self, "alpaca_max_new_tokens")
        check_range("limit", self.limit, 1, integer=True, allow_none=True)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/judge_inputs.py`: write the answer files, then print the judging commands."""
    (args,) = parse_recipe([JudgeInputsArguments], argv)
    setup_logging()
    if not (args.alpaca_eval or args.mt_bench):
        raise RecipeError("give --alpaca_eval and/or --mt_bench question files")
    try:
        alpaca = read_alpaca_eval(args.alpaca_eval)[: args.limit] if args.alpaca_eval else None
        mt_bench = read_mt_bench(args.mt_bench)[: args.limit] if args.mt_bench else None
    except (ValueError, OSError) as error:  # unreadable or not JSON: name the file
        raise RecipeError(f"question file: {error}") from error
    model, tokenizer = load_chat_model(args.model)
    out = Path(args.output_dir)
    alpaca_path = out / "alpaca_eval" / f"{args.model_id}.json"
    mt_path = out / "mt_bench" / "model_answer" / f"{args.model_id}.jsonl"
    if alpaca is not None:
        rows = alpaca_eval_outputs(model, tokenizer, alpaca, args.model_id, args.alpaca_max_new_tokens)
        _write(alpaca_path, json.dumps(rows, indent=2))
    if mt_bench is not None:
        rows = mt_bench_answers(model, tokenizer, mt_bench, args.model_id, args.max_new_tokens)
        _write(mt_path, "".join(json.dumps(r) + "\n" for r in rows))
    sys.stdout.write(JUDGE_COMMANDS.format(alpaca=alpaca_path, mt_bench=mt_path, model_id=args.model_id) + "\n")
    return 0
