"""A tiny, deterministic synthetic world: the embedded default data of the demo, the tiny recipes and the tests.

Everything is generated from a seed (no downloads) and designed so each stage has something measurable to learn:

- pretraining text states facts about invented places ("The capital of Varno is Quell.") and shows worked
  arithmetic word problems ("... The answer is 8.");
- SFT conversations ask those facts and problems in chat form; the assistant answers "... The answer is N.";
- preference pairs prefer the correct answer over a wrong one;
- evaluation items ask the same facts as multiple choice (ARC-style) and held-out arithmetic (GSM8K-style
  `#### N`), so a model that learned the facts and the answer format scores above chance.

`write_tiny_world(folder)` writes them as jsonl files in the formats the real recipes read.
"""

import json
import random
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from instella_recipes.core import (
    RecipeError,
    atomic_file,
    check_output_dir,
    check_positive,
    check_range,
    claim_output_dir,
    exit_on_recipe_error,
    file_digest,
    parse_recipe,
    setup_logging,
    write_manifest,
)

_SYLLABLES = ["va", "ro", "qu", "el", "mi", "dor", "ka", "len", "tis", "pha", "zu", "mar", "no", "bel", "shi", "ta"]
_ATTRIBUTES = {
    "capital": ["The capital of {e} is {v}.", "{v} is the capital of {e}.", "In {e}, the capital city is {v}."],
    "river": ["The longest river in {e} is the {v}.", "The {v} is the longest river of {e}."],
    "animal": ["The national animal of {e} is the {v}.", "People in {e} chose the {v} as their national animal."],
}
_ANIMALS = ["otter", "heron", "lynx", "badger", "falcon", "tortoise", "marten", "ibis", "gecko", "walrus"]
_NAMES = ["Mia", "Tom", "Ana", "Raj", "Lea", "Sam", "Ivo", "Noor", "Eli", "Kai"]
_ITEMS = ["apples", "books", "coins", "shells", "stamps", "marbles", "pencils", "cards"]


@dataclass
class TinyWorld:
    """Sizes of the generated world; the defaults make a corpus of about 20k tokens."""

    seed: int = 1234
    n_entities: int = 24
    n_train_problems: int = 400
    n_eval_problems: int = 60
    max_operand: int = 9
    repeats: int = 8  # how often each fact is restated in the pretraining corpus
    facts: dict = field(default_factory=dict, init=False)

    def __post_init__(self):
        rng = random.Random(self.seed)
        names = set()
        while len(names) < self.n_entities:
            names.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize())
        for entity in sorted(names):
            self.facts[entity] = {
                "capital": "".join(rng.choice(_SYLLABLES) for _ in range(2)).capitalize(),
                "river": "".join(rng.choice(_SYLLABLES) for _ in range(2)).capitalize(),
                "animal": rng.choice(_ANIMALS),
            }

    # --- arithmetic -------------------------------------------------------------------------------------------
    def problems(self, split: str) -> list[dict]:
        """Word problems `{question, solution, answer}`; train and eval use disjoint operand pairs."""
        rng = random.Random(f"{self.seed}-{split}")
        pairs = [(a, b) for a in range(1, self.max_operand + 1) for b in range(1, self.max_operand + 1)]
        random.Random(self.seed).shuffle(pairs)
        held_out = pairs[: max(1, len(pairs) // 5)]
        pool = held_out if split == "eval" else pairs[len(held_out) :]
        count = self.n_eval_problems if split == "eval" else self.n_train_problems
        out = []
        for _ in range(count):
            a, b = rng.choice(pool)
            name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
            question = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
            out.append({"question": question, "solution": f"{a} + {b} = {a + b}.", "answer": a + b})
        return out

    # --- the four datasets ------------------------------------------------------------------------------------
    def corpus(self) -> list[dict]:
        """Pretraining documents `{"text": ...}`: restated facts and worked problems, shuffled."""
        rng = random.Random(f"{self.seed}-corpus")
        docs = []
        for _ in range(self.repeats):
            for entity, attrs in self.facts.items():
                lines = [rng.choice(_ATTRIBUTES[k]).format(e=entity, v=v) for k, v in attrs.items()]
                rng.shuffle(lines)
                docs.append(" ".join(lines))
        for p in self.problems("train"):
            docs.append(f"Question: {p['question']}\nAnswer: {p['solution']} The answer is {p['answer']}.")
        rng.shuffle(docs)
        return [{"text": d} for d in docs]

    def sft(self) -> list[dict]:
        """Chat examples `{"messages": [...]}` asking the facts and the training problems."""
        rng = random.Random(f"{self.seed}-sft")
        rows = []
        for p in self.problems("train"):
            answer = f"{p['solution']} The answer is {p['answer']}."
            rows.append(
                {"messages": [{"role": "user", "content": p["question"]}, {"role": "assistant", "content": answer}]}
            )
        for entity, attrs in self.facts.items():
            messages = [{"role": "system", "content": "Answer in one sentence."}] if rng.random() < 0.3 else []
            messages += [
                {"role": "user", "content": f"What is the capital of {entity}?"},
                {"role": "assistant", "content": f"The capital of {entity} is {attrs['capital']}."},
            ]
            rows.append({"messages": messages})
        rng.shuffle(rows)
        return rows

    def preferences(self) -> list[dict]:
        """DPO pairs `{"prompt", "chosen", "rejected"}` in TRL's conversational format; rejected is a wrong sum."""
        rng = random.Random(f"{self.seed}-dpo")
        rows = []
        for p in self.problems("train"):
            wrong = p["answer"] + rng.choice([-2, -1, 1, 2, 3])
            a_b = p["solution"].split(" = ")[0]
            right = f"{a_b} = {p['answer']}. The answer is {p['answer']}."
            rows.append(
                {
                    "prompt": [{"role": "user", "content": p["question"]}],
                    "chosen": [{"role": "assistant", "content": right}],
                    "rejected": [{"role": "assistant", "content": f"{a_b} = {wrong}. The answer is {wrong}."}],
                }
            )
        return rows

    def eval_multiple_choice(self) -> list[dict]:
        """ARC-style items `{id, question, choices: {text, label}, answerKey}` about the pretraining facts."""
        rng = random.Random(f"{self.seed}-mc")
        capitals = sorted(a["capital"] for a in self.facts.values())
        rows = []
        for i, (entity, attrs) in enumerate(self.facts.items()):
            options = [attrs["capital"], *rng.sample([c for c in capitals if c != attrs["capital"]], 3)]
            rng.shuffle(options)
            rows.append(
                {
                    "id": f"tiny-mc-{i}",
                    "question": f"What is the capital of {entity}?",
                    "choices": {"text": options, "label": list("ABCD")},
                    "answerKey": "ABCD"[options.index(attrs["capital"])],
                }
            )
        return rows

    def eval_arithmetic(self) -> list[dict]:
        """GSM8K-style held-out problems `{question, answer: "<solution>\\n#### N"}`."""
        return [
            {"question": p["question"], "answer": f"{p['solution']}\n#### {p['answer']}"}
            for p in self.problems("eval")
        ]


# --- long context: needles in a TinyWorld haystack ---------------------------------------------------------------
# The long-context branch of the demo (recipes/tiny/pipeline.yaml `long_*` stages, docs/instella_long.md) teaches and
# measures retrieval over a few thousand tokens: a "needle" (a made-up key with a 4-digit code) sits somewhere in a
# haystack of TinyWorld corpus sentences, and a question at the end asks for the code. Keys are built from syllables
# the world's names never use, so no fact of the corpus answers a needle question.
_KEY_SYLLABLES = ["bra", "cot", "fen", "gu", "hal", "jor", "lu", "mek", "nir", "pol", "sav", "tor", "vex", "wim", "yo"]
NEEDLE = "The secret code of {key} is {value}."
NEEDLE_QUERY = "What is the secret code of {key}? The secret code of {key} is"


def _needle(rng: random.Random, two_digits: bool = False) -> tuple[str, str]:
    """(key, code): a 4-digit code, or with `two_digits` one of 20-99 (the single-needle items')."""
    key = "".join(rng.choice(_KEY_SYLLABLES) for _ in range(3)).capitalize()
    if two_digits:
        return key, f"{rng.randint(2, 9)}{rng.randint(0, 9)}"
    return key, f"{rng.randrange(10_000):04d}"


def _haystack(world: TinyWorld, rng: random.Random, n_chars: int, digits: bool = True) -> list[str]:
    """Sentences of the TinyWorld corpus in random order (documents kept whole), at least `n_chars` in all; without
    `digits`, only the documents that hold none (facts, not word problems)."""
    docs = [
        row["text"].replace("\n", " ") for row in world.corpus() if digits or not any(c.isdigit() for c in row["text"])
    ]
    out, size = [], 0
    while size < n_chars:
        text = rng.choice(docs)
        out.append(text)
        size += len(text) + 1
    return out


def _at_depth(hay: list[str], depth: float, n_chars: int) -> int:
    """The first sentence border at or after `depth` x `n_chars` characters of the haystack (its end at the latest)."""
    return next(j for j in range(len(hay) + 1) if len(" ".join(hay[:j])) >= depth * n_chars or j == len(hay))


def needle_documents(world: TinyWorld, count: int, n_chars: int, needles: int, seed: int = 0) -> list[dict]:
    """`count` training documents `{"text"}` of about `n_chars` characters: the TinyWorld haystack with `needles`
    key-code sentences at random places, each asked again (question, then its code) at a random later place, so
    pretraining's next-token loss on the code teaches copying from anywhere earlier in the document (and a document
    cut at a window border keeps most of its pairs whole)."""
    rng = random.Random(f"{world.seed}-needles-{seed}")
    rows = []
    for _ in range(count):
        hay = _haystack(world, rng, n_chars)
        for _ in range(needles):
            key, value = _needle(rng)
            at = rng.randrange(len(hay))
            hay.insert(at, NEEDLE.format(key=key, value=value))
            hay.insert(rng.randrange(at + 1, len(hay) + 1), f"{NEEDLE_QUERY.format(key=key)} {value}.")
        rows.append({"text": " ".join(hay)})
    return rows


def niah_items(world: TinyWorld, per_depth: int, n_chars: int, depths=(0.1, 0.3, 0.5, 0.7, 0.9)) -> list[dict]:
    """Needle-in-a-haystack items `{id, depth, context, target}`: one needle at `depth` (fraction of the haystack's
    characters before it) of an `n_chars` haystack, the question last; `target` is " <code>" (exact retrieval: the
    whole code is the greedy continuation). Seeded apart from `needle_documents`: other haystacks and codes."""
    rng = random.Random(f"{world.seed}-niah")
    rows = []
    for depth in depths:
        for i in range(per_depth):
            key, value = _needle(rng)
            hay = _haystack(world, rng, n_chars)
            hay.insert(_at_depth(hay, depth, n_chars), NEEDLE.format(key=key, value=value))
            context = " ".join([*hay, NEEDLE_QUERY.format(key=key)])
            rows.append({"id": f"niah-{depth}-{i}", "depth": depth, "context": context, "target": f" {value}"})
    return rows


# The needle the demo's recall is measured on (tiny_niah_4k) and its long SFT teaches (`needle_chats`): RULER's
# niah_single shape, one needle whose code is the only number in the context (the haystack keeps the corpus documents
# without digits), asked in the chat layout; the answer opens with a fixed phrase so the loss's only copying target is
# the code. A 2-digit code (first digit 2-9): the demo tokenizer writes it as " d" then "d".
NEEDLE_ANSWER = "The secret code is"


def _single_needle(world: TinyWorld, rng: random.Random, n_chars: int, depth: float | None) -> tuple[str, str]:
    """(user message, code): digit-free corpus documents of at least `n_chars` characters with one needle at `depth`
    (a random place when None), then the question."""
    hay = _haystack(world, rng, n_chars, digits=False)
    key, code = _needle(rng, two_digits=True)
    at = rng.randrange(len(hay) + 1) if depth is None else _at_depth(hay, depth, n_chars)
    hay.insert(at, NEEDLE.format(key=key, value=code))
    return " ".join([*hay, f"What is the secret code of {key}?"]), code


def niah_single_items(world: TinyWorld, per_depth: int, n_chars: int, depths=(0.1, 0.3, 0.5, 0.7, 0.9)) -> list[dict]:
    """tiny_niah_4k's items `{id, depth, context, target}`: `context` the user message (haystack of `n_chars`, the
    needle at `depth` of it, the question), `target` " <code>" after the chat layout's `NEEDLE_ANSWER`."""
    rng = random.Random(f"{world.seed}-niah-single")
    rows = []
    for depth in depths:
        for i in range(per_depth):
            context, code = _single_needle(world, rng, n_chars, depth)
            rows.append({"id": f"niah-{depth}-{i}", "depth": depth, "context": context, "target": f" {code}"})
    return rows


def needle_chats(world: TinyWorld, short: int, long: int, short_chars=(0, 250), long_chars=(1000, 6000)) -> list[dict]:
    """SFT chats `{"messages"}` of the demo's long SFT: `short` with haystacks of `short_chars` characters (up to
    about 100 tokens: where a tiny model learns retrieval at all, after ~200 steps, docs/instella_long.md) and `long`
    of `long_chars` (about 250-1,500 tokens: where it learns to reach), shuffled; seeded apart from the evaluation
    items. The needle is the code's only number, the question last, the answer `NEEDLE_ANSWER` + the code."""
    rng = random.Random(f"{world.seed}-needle-chats")
    spans = [short_chars] * short + [long_chars] * long
    rng.shuffle(spans)
    rows = []
    for lo, hi in spans:
        question, code = _single_needle(world, rng, rng.randint(lo, hi), None)
        answer = f"{NEEDLE_ANSWER} {code}."
        rows.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    return rows


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return path


def write_tiny_world(folder: str | Path, world: TinyWorld | None = None) -> dict[str, Path]:
    """Write corpus / sft / preferences / eval jsonl files into `folder`; return their paths by name."""
    world = world or TinyWorld()
    folder = Path(folder)
    files = {
        "corpus": world.corpus(),
        "sft": world.sft(),
        "preferences": world.preferences(),
        "eval_mc": world.eval_multiple_choice(),
        "eval_arithmetic": world.eval_arithmetic(),
    }
    return {name: write_jsonl(rows, folder / f"{name}.jsonl") for name, rows in files.items()}


# --- the command (scripts/make_tiny_world.py) -----------------------------------------------------------------------
@dataclass
class TinyWorldArguments:
    """The settings of `scripts/make_tiny_world.py` (the world's parameters, where to write it)."""

    output_dir: str = field(metadata={"help": "folder for the jsonl files and the manifest"})
    seed: int = field(default=1234, metadata={"help": "world seed (the shipped eval items use 1234)"})
    n_entities: int = field(default=24, metadata={"help": "invented countries, each with 3 facts"})
    n_train_problems: int = field(default=400, metadata={"help": "arithmetic word problems for training"})
    n_eval_problems: int = field(default=60, metadata={"help": "held-out arithmetic problems"})
    max_operand: int = field(default=9, metadata={"help": "largest operand of a sum"})
    repeats: int = field(default=8, metadata={"help": "how often each fact is restated in the corpus"})
    long_docs: int = field(
        default=0, metadata={"help": "needle documents for long-context training (long_corpus.jsonl); 0: none"}
    )
    long_doc_chars: int = field(default=7000, metadata={"help": "haystack characters of each needle document"})
    long_needles: int = field(default=32, metadata={"help": "key-code needles (each asked once) per document"})
    long_sft_short: int = field(default=4000, metadata={"help": "needle chats with short haystacks (long_sft.jsonl)"})
    long_sft_long: int = field(default=128, metadata={"help": "needle chats with 1K-6K-character haystacks"})
    overwrite: bool = field(default=False, metadata={"help": "replace a complete output in output_dir"})

    def __post_init__(self):
        check_positive(self, "n_entities", "n_train_problems", "n_eval_problems", "max_operand", "repeats")
        check_positive(self, "long_doc_chars", "long_needles", "long_sft_short", "long_sft_long")
        check_range("long_docs", self.long_docs, 0, integer=True)
        check_range("seed", self.seed, 0, integer=True)


def speculative_prompts(world: TinyWorld, count: int = 8) -> list[dict]:
    """Prompts for `scripts/speculative.py` in the world's own text (its format: task_id, prompt, entry_point, test):
    openings of fact sentences and held-out word problems. They are not code, so pass@1 is not meaningful here;
    acceptance rate and tokens/s are."""
    entities = list(world.facts)[: count // 2]
    prompts = [f"The capital of {e} is" for e in entities]
    prompts += [f"Question: {p['question']}\nAnswer:" for p in world.problems("eval")[: count - len(prompts)]]
    return [{"task_id": f"tiny_world/{i}", "prompt": p, "entry_point": "", "test": ""} for i, p in enumerate(prompts)]


def make_tiny_world(args: TinyWorldArguments) -> Path:
    """Write the world's files into `args.output_dir`, then `manifest.json`; returns the manifest path."""
    check_output_dir(args.output_dir, args.overwrite)
    if args.n_entities < 4 or args.max_operand < 2:
        raise RecipeError("n_entities must be at least 4 (multiple choice has 4 options) and max_operand at least 2")
    output = claim_output_dir(args.output_dir, args.overwrite)  # a complete output is replaced only with --overwrite
    output.mkdir(parents=True, exist_ok=True)
    world = TinyWorld(**{f.name: getattr(args, f.name) for f in fields(TinyWorld) if f.init})
    files = write_tiny_world(output, world)
    # The fact questions alone as well, so a recipe can upsample them (like the published o1-journey x10): they are
    # 24 of ~400 SFT rows, too few for a tiny model to learn them in a few epochs.
    facts = [row for row in world.sft() if "capital of" in row["messages"][-2]["content"]]
    files["sft_facts"] = write_jsonl(facts, output / "sft_facts.jsonl")
    files["speculative_prompts"] = write_jsonl(speculative_prompts(world), output / "speculative_prompts.jsonl")
    if args.long_docs:  # the long-context branch's training text (docs/instella_long.md, "The demo's long branch")
        docs = needle_documents(world, args.long_docs, args.long_doc_chars, args.long_needles)
        files["long_corpus"] = write_jsonl(docs, output / "long_corpus.jsonl")
        chats = needle_chats(world, args.long_sft_short, args.long_sft_long)
        files["long_sft"] = write_jsonl(chats, output / "long_sft.jsonl")
    rows = {name: sum(1 for _ in path.open()) for name, path in files.items()}
    for name, count in rows.items():
        print(f"{name}: {count} rows -> {files[name]}")
    return write_manifest(
        output,
        "tiny_world",
        world=asdict(args) | {"output_dir": None, "overwrite": None},
        rows=rows,
        files={name: {"path": path.name, "sha256": file_digest(path)} for name, path in files.items()},
    )


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/make_tiny_world.py`: parse, then `make_tiny_world`; the exit status."""
    (args,) = parse_recipe([TinyWorldArguments], argv)
    setup_logging()
    make_tiny_world(args)
    return 0
