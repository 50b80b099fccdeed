"""How fast does the demo's tiny model learn needle retrieval? A learnability probe, not a speed benchmark.

docs/instella_long.md ("What is not reached") quotes its runs: the demo's long-context branch does not raise needle
recall at 4K, and this probe measures why, outside the pipeline, in seconds per variant. It continues training a demo
checkpoint (default `runs/demo/long_start`, the merged tiny model reconfigured to 4,096 positions; run `make demo`
first) with AdamW on needle items and prints retrieval at four haystack sizes every `--eval_every` steps.

Two tasks:
- `needle` (default): TinyWorld-style items as in `data/tiny_world.py` (a haystack, one or more "The secret code of
  <key> is <code>." sentences, the question at the end); the loss is every token's (`--loss all`, pretraining's) or
  only the code's (`--loss answer`, an SFT-style completion loss). `--hay facts` keeps only the corpus documents
  without digits, so the needle's code is the only number (RULER's niah_single shape); `--hay noise` is RULER's
  repeated noise sentence; `--hay all` the whole corpus (arithmetic documents hold numbers too).
- `digit`: a bare content probe: one space-digit token somewhere in `--lo`..`--hi` tokens of corpus text (or random
  tokens with `--random_tokens`), "is" last, the loss on the digit only.

Printed per evaluation: `{mean context tokens: (whole code correct, first code token correct)}`, greedy under teacher
forcing as lm-eval's `is_greedy` scores `tiny_niah_4k`.

    python benchmarks/probe_niah_learning.py --task needle --hay facts --loss answer --steps 150 --batch 16 \
        --chars 20,300
"""

import argparse
import json
import random
import re
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import modeling_instella  # noqa: F401  (the demo checkpoints load with the installed model class)

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."  # RULER's noise
KEY_SYLLABLES = ["bra", "cot", "fen", "gu", "hal", "jor", "lu", "mek", "nir", "pol", "sav", "tor", "vex", "wim", "yo"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="runs/demo", help="a `make demo` run folder (data, tokenizer, long_start)")
    parser.add_argument("--start", default=None, help="checkpoint to train (default <run>/long_start)")
    parser.add_argument("--task", choices=["needle", "digit"], default="needle")
    parser.add_argument("--hay", choices=["facts", "noise", "all"], default="facts")
    parser.add_argument("--loss", choices=["all", "answer"], default="all")
    parser.add_argument("--code_digits", type=int, default=2, help="digits of the code (first one 2-9)")
    parser.add_argument("--queries", type=int, default=0, help="extra question + code sentences after the needle")
    parser.add_argument("--chars", default="100,1000", help="training haystack characters, lo,hi")
    parser.add_argument("--long_every", type=int, default=0, help="every N-th step: one row from --long_chars")
    parser.add_argument("--long_chars", default="1000,14000", help="long training haystack characters, lo,hi")
    parser.add_argument("--lo", type=int, default=16, help="digit task: shortest row, tokens")
    parser.add_argument("--hi", type=int, default=128, help="digit task: longest row, tokens")
    parser.add_argument("--random_tokens", action="store_true", help="digit task: random tokens, not corpus text")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight_decay", type=float, default=0.1)
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--eval_chars", default="200,1000,3500,13500", help="needle task: evaluation haystacks")
    parser.add_argument("--n_eval", type=int, default=10, help="items per evaluation size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--save", default=None, help="save the trained model here")
    return parser.parse_args()


class NeedleItems:
    """Token rows of the needle task: `(context ids, code ids)`; `item(None)` trains, `item(depth)` evaluates."""

    def __init__(self, args, tokenizer, corpus: list[str]):
        self.args, self.tokenizer = args, tokenizer
        if args.hay == "noise":
            self.docs = [NOISE]
        else:
            self.docs = [t.replace("\n", " ") for t in corpus if args.hay == "all" or not re.search(r"\d", t)]

    def code(self, rng: random.Random) -> tuple[str, str]:
        key = "".join(rng.choice(KEY_SYLLABLES) for _ in range(3)).capitalize()
        digits = [str(rng.randint(2, 9))] + [str(rng.randint(0, 9)) for _ in range(self.args.code_digits - 1)]
        return key, "".join(digits)

    def item(self, rng: random.Random, n_chars: int, depth: float | None = None) -> tuple[list[int], list[int]]:
        hay, size = [], 0
        while size < n_chars:
            hay.append(rng.choice(self.docs))
            size += len(hay[-1]) + 1
        key, code = self.code(rng)
        if depth is None:
            at = rng.randrange(len(hay) + 1)
        else:
            at = next(j for j in range(len(hay) + 1) if len(" ".join(hay[:j])) >= depth * n_chars or j == len(hay))
        hay.insert(at, f"The secret code of {key} is {code}.")
        question = f"What is the secret code of {key}? The secret code of {key} is"
        for _ in range(self.args.queries if depth is None else 0):
            hay.insert(rng.randrange(at + 1, len(hay) + 1), f"{question} {code}.")
        context = " ".join([*hay, question])
        ids = self.tokenizer(context)["input_ids"]
        target = self.tokenizer(f"{context} {code}")["input_ids"][len(ids) :]
        return [0, *ids], target


class DigitItems:
    """Token rows of the digit task: `n` tokens with one space-digit token among them, then " is"; the digit last."""

    def __init__(self, args, tokenizer, corpus: list[str]):
        vocab = tokenizer.get_vocab()
        self.digits = [vocab[f"Ġ{d}"] for d in range(1, 10)]
        self.others = [i for t, i in vocab.items() if not re.search(r"\d", t) and i > 1]
        self.stream = tokenizer(" ".join(t for t in corpus if not re.search(r"\d", t)))["input_ids"]
        self.marker, self.random_tokens = vocab["Ġis"], args.random_tokens

    def item(self, rng: random.Random, n: int) -> tuple[list[int], list[int]]:
        if self.random_tokens:
            row = [rng.choice(self.others) for _ in range(n)]
        else:
            start = rng.randrange(len(self.stream) - n)
            row = list(self.stream[start : start + n])
        digit = rng.choice(self.digits)
        row[rng.randrange(n)] = digit
        return [0, *row, self.marker], [digit]


@torch.no_grad()
def evaluate(model, sets: dict[int, list]) -> dict[int, tuple[float, float]]:
    """{mean context tokens: (share of items whose whole target is greedy, share whose first token is)}."""
    model.eval()
    scores = {}
    for items in sets.values():
        whole = first = tokens = 0
        for context, target in items:
            logits = model(torch.tensor([context + target])).logits[0, len(context) - 1 : -1]
            predicted = logits.argmax(-1).tolist()
            whole += predicted == target
            first += predicted[0] == target[0]
            tokens += len(context)
        scores[tokens // len(items)] = (round(whole / len(items), 2), round(first / len(items), 2))
    model.train()
    return scores


def training_batch(args, items, rng: random.Random, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows (pad id 1, label -100); EOS after the target; `--loss answer` labels the target only; every
    `--long_every`-th step one long row instead of `--batch` short ones (a padded batch is as wide as its longest)."""
    if args.task == "digit":
        n = rng.randint(args.lo, args.hi)
        rows = [items.item(rng, n) for _ in range(args.batch)]
    else:
        long = args.long_every and step % args.long_every == 0
        lo, hi = map(int, (args.long_chars if long else args.chars).split(","))
        rows = [items.item(rng, rng.randint(lo, hi)) for _ in range(1 if long else args.batch)]
    width = max(len(c) + len(t) + 1 for c, t in rows)
    ids, labels = [], []
    for context, target in rows:
        row = [*context, *target, 0]
        ids.append(row + [1] * (width - len(row)))
        keep = len(context) if args.loss == "answer" or args.task == "digit" else 0
        labels.append([-100] * keep + row[keep:] + [-100] * (width - len(row)))
    return torch.tensor(ids), torch.tensor(labels)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    run = Path(args.run)
    tokenizer = AutoTokenizer.from_pretrained(run / "tokenizer")
    model = AutoModelForCausalLM.from_pretrained(args.start or run / "long_start", attn_implementation="sdpa")
    corpus = [json.loads(line)["text"] for line in (run / "data" / "corpus.jsonl").open()]
    items = (NeedleItems if args.task == "needle" else DigitItems)(args, tokenizer, corpus)
    eval_rng = random.Random("eval")
    if args.task == "needle":
        depths = (0.1, 0.3, 0.5, 0.7, 0.9)
        sizes = [int(n) for n in args.eval_chars.split(",")]
        sets = {n: [items.item(eval_rng, n, d) for d in depths for _ in range(args.n_eval // 5)] for n in sizes}
    else:
        sets = {n: [items.item(eval_rng, n) for _ in range(args.n_eval)] for n in (32, 256, 1024)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    rng, started = random.Random("train"), time.time()
    print("step 0", evaluate(model, sets), flush=True)
    for step in range(1, args.steps + 1):
        ids, labels = training_batch(args, items, rng, step)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % args.eval_every == 0 or step == args.steps:
            seconds = time.time() - started
            print(f"step {step} loss {loss.item():.3f} {seconds:.0f}s", evaluate(model, sets), flush=True)
    if args.save:
        model.save_pretrained(args.save)


if __name__ == "__main__":
    main()
