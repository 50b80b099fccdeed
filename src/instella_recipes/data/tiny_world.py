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
from dataclasses import dataclass, field
from pathlib import Path

from instella_recipes.core import atomic_file

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
