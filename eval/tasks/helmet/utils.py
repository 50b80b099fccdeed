"""lm-eval hooks of the HELMET tasks Instella-Long was scored on (INSTELLA_LONG_MATH.md 1.7): RULER multi-value
needles, KILT RAG (NQ, TriviaQA, HotpotQA), InfiniteBench QA / MC and NarrativeQA.

Written after princeton-nlp/HELMET commit 4526dfb (`data.py`: load_qa, load_ruler, load_infbench, load_narrativeqa,
default_post_process; `utils.py`: normalize_answer, calculate_metrics, parse_output; `eval.py`: the system template
is prepended to the generation when no chat template is used). Prompts, demo choice (per-question sha256 seed),
sample selection (seed 42, 100 samples) and the metrics are HELMET's. Not reproduced: HELMET cuts the middle of the
context to fit `input_max_length` with the model's tokenizer (lm-eval truncates from the left instead; the files of
each length already fit it), and the Llama-2-tokenizer length filter of the 128K tasks (their files here are expected
already filtered, see docs).

Data: `HELMET_DATA_DIR` (environment) or `--metadata '{"data_dir": ...}'` names a folder laid out like HELMET's
`data/` (scripts/download_data.sh); without one the small stand-ins shipped in eval/data/offline/helmet/ are read
(made by the project, for tests; they are not the benchmark). This file imports nothing of instella_recipes: the
tasks load with lm-eval alone.
"""

import hashlib
import json
import os
import random
import re
import string
from collections import Counter
from pathlib import Path

import datasets

STANDINS = Path(__file__).resolve().parents[2] / "data" / "offline" / "helmet"

TEMPLATES = {  # kind -> (user template, system template, joiner), HELMET data.py
    "niah_mv": (
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will "
        "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} "
        "for {query} mentioned in the provided text?",
        "The special magic {type_needle_v} for {query} mentioned in the provided text are",
        "\n",
    ),
    "rag": (
        "Use the given documents to write a concise and short answer to the question. Write your answer in the "
        "following format:\nAnswer: [answer]\n\n{demos}{context}\n\nQuestion: {question}",
        "Answer:",
        "\n",
    ),
    "infbench_qa": (
        "You are given a story and a question. Answer the question as concisely as you can, using a single phrase "
        "if possible.\n\n{demo}{context}\n\nQuestion: {question}",
        "Answer:",
        "\n\n",
    ),
    "infbench_mc": (
        "You are given a story and a question with multiple choices. Choose the best answer from the options "
        "provided. Only one of the following options is correct, output the answer using one single letter (A, B, "
        "C, or D). Don't say anything else.\n\n{demo}{context}\n\nQuestion: {question}\nOptions:\n{options}",
        "Answer:",
        "\n\n",
    ),
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "as concisely as you can, using a single phrase if possible.\n\n{demo}{context}\n\nQuestion: {question}",
        "Answer:",
        "\n",
    ),
}


# --- data ----------------------------------------------------------------------------------------------------------
def _path(name: str, standin: str, data_dir: str | None) -> Path:
    """The HELMET file `name` under the data folder, or the shipped stand-in when no folder is given."""
    root = data_dir or os.environ.get("HELMET_DATA_DIR")
    path = Path(root) / name if root else STANDINS / standin
    if not path.is_file():
        raise FileNotFoundError(f"error: HELMET data file {path} is missing (HELMET_DATA_DIR={root or 'unset'})")
    return path


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _demo_text(sample: dict, demos: list[dict], shots: int, key: str) -> str:
    """HELMET load_qa: demos shuffled with a seed hashed from the sample's key, duplicates dropped, `shots` kept."""
    if not shots:
        return ""
    seed = int(hashlib.sha256(str(sample[key]).encode("utf-8")).hexdigest(), 16) % 2**31
    shuffled = datasets.Dataset.from_list(demos).shuffle(seed=seed)
    chosen, seen = [], set()
    for demo in shuffled:
        if demo[key] not in seen:
            seen.add(demo[key])
            chosen.append(demo)
    passages = ["\n\n".join(_passage(c) for c in d["ctxs"]) for d in chosen[:shots]]
    blocks = [f"{p}\n\nQuestion: {d['question']}\nAnswer: {d['answers'][0]}" for p, d in zip(passages, chosen)]
    return "\n\n".join(blocks) + "\n\n"


def _passage(ctx: dict) -> str:
    return f"Document (Title: {ctx['title']}): {ctx['text']}"


def _rag(rows, demos, shots, max_test_samples, seed):
    random.seed(seed)  # HELMET eval.py seeds python's random before loading; load_qa samples questions with it
    key = "id" if rows and "id" in rows[0] else "question"  # HELMET: "some datasets do not have id (e.g., nq)"
    keys = sorted({r[key] for r in rows})
    keep = set(random.sample(keys, min(max_test_samples, len(keys))))
    out = []
    for r in (r for r in rows if r[key] in keep):
        fields = {"demos": _demo_text(r, demos, shots, key), "question": r["question"]}
        fields["context"] = "\n\n".join(_passage(c) for c in r["ctxs"])
        out.append((fields, list(r["answers"])))
    return out


def _niah(rows, max_test_samples, seed):
    data = datasets.Dataset.from_list(rows).shuffle(seed).select(range(min(len(rows), max_test_samples)))
    return [
        ({**r, "query": r.get("query", r.get("question", ""))}, list(r.get("answer", r.get("outputs")))) for r in data
    ]


def _infbench(rows, kind, shots, max_test_samples, seed):
    items = []
    for r in rows:
        fields = {"id": r["id"], "context": r["context"], "question": r["input"], "demo": ""}
        answer = list(r["answer"])
        if kind == "infbench_mc":
            fields["options"] = "A. {}\nB. {}\nC. {}\nD. {}".format(*r["options"])
            letter = chr(ord("A") + r["options"].index(r["answer"][0]))
            answer = [letter, f"{letter}. {r['answer'][0]}"]
        items.append((fields, answer))
    if shots:
        for fields, _ in items:
            others = [(f, a) for f, a in items if f["id"] != fields["id"]]
            order = datasets.Dataset.from_list([{"i": i} for i in range(len(others))]).shuffle(seed=seed)
            picked = [others[i] for i in order["i"][:shots]]
            if kind == "infbench_mc":
                demo = [
                    f"[story text]\nQuestion: {f['question']}\nOptions:\n{f['options']}\nAnswer: {a[0]}"
                    for f, a in picked
                ]
            else:
                demo = [f"[story text]\nQuestion: {f['question']}\nAnswer: {a[0]}" for f, a in picked]
            fields["demo"] = "For example:\n\n" + "\n\n".join(demo) + "\n\nNow, read the following story:\n\n"
    order = datasets.Dataset.from_list([{"i": i} for i in range(len(items))]).shuffle(seed=seed)
    return [items[i] for i in order["i"][: min(len(items), max_test_samples)]]


def load(kind, test_file, standin, demo_file=None, standin_demos=None, shots=0, max_test_samples=100, seed=42,
         data_dir=None, **_metadata):  # fmt: skip
    """`custom_dataset` hook: the `test` split, one row per question with `prompt` (the user message),
    `system` (the assistant prefix), `text` (HELMET's completion prompt: user, joiner, system; used without a chat
    template), `answer` (the gold list)."""
    rows = _rows(_path(test_file, standin, data_dir))
    if kind == "rag":
        items = _rag(rows, _rows(_path(demo_file, standin_demos, data_dir)), shots, max_test_samples, seed)
    elif kind == "niah_mv":
        items = _niah(rows, max_test_samples, seed)
    elif kind in ("infbench_qa", "infbench_mc"):
        items = _infbench(rows, kind, shots, max_test_samples, seed)
    elif kind == "narrativeqa":  # rows already hold context / question / answer (+ demo) and are HELMET's selection
        items = [({"demo": "", **r}, list(r["answer"])) for r in rows[:max_test_samples]]
    else:
        raise ValueError(f"error: unknown HELMET task kind {kind!r}")
    user, system, join = TEMPLATES[kind]
    docs = []
    for fields, answer in items:
        prompt, prefix = user.format(**fields), system.format(**fields)
        docs.append({"prompt": prompt, "system": prefix, "text": prompt + join + prefix, "answer": answer})
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


# --- metrics (HELMET utils.py) -------------------------------------------------------------------------------------
def normalize_answer(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def token_f1(prediction: str, truth: str) -> float:
    pred, gold = normalize_answer(prediction), normalize_answer(truth)
    if (pred in ("yes", "no", "noanswer") or gold in ("yes", "no", "noanswer")) and pred != gold:
        return 0.0
    common = sum((Counter(pred.split()) & Counter(gold.split())).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred.split()), common / len(gold.split())
    return 2 * precision * recall / (precision + recall)


def qa_metrics(prediction: str, answers: list[str]) -> dict:
    return {
        "exact_match": float(max(normalize_answer(prediction) == normalize_answer(a) for a in answers)),
        "substring_exact_match": float(max(normalize_answer(a) in normalize_answer(prediction) for a in answers)),
        "f1": max(token_f1(prediction, a) for a in answers),
    }


def parse_output(output: str, prefix: str = "Answer:") -> str | None:
    patterns = [re.compile(f"(?:{prefix})(.*)(?:\n|$)", flags=re.IGNORECASE), re.compile(r"(?:^)(.*)(?:\n|$)")]
    for pattern in patterns:
        match = pattern.search(output)
        if match is not None:
            return re.sub(f"^{re.escape(prefix)}", "", match[1].strip(), flags=re.IGNORECASE).strip()
    return None


def _scored(prediction: str, answers: list[str]) -> dict:
    """HELMET default_post_process: the metrics of the raw output and of the parsed answer, the larger of each."""
    metrics = qa_metrics(prediction, answers)
    parsed = parse_output(prediction)
    if parsed is not None:
        metrics = {k: max(v, qa_metrics(parsed, answers)[k]) for k, v in metrics.items()}
    return metrics


def _prediction(doc: dict, results: list[str], chat: bool) -> str:
    return results[0] if chat else doc["system"] + results[0]  # HELMET eval.py prepends the system template


def process_recall(doc: dict, results: list[str]) -> dict:
    """RULER multi-value needles: the fraction of the gold values found (case-insensitive substring)."""
    prediction = _prediction(doc, results, chat=False).lower()
    return {"ruler_recall": sum(a.lower() in prediction for a in doc["answer"]) / len(doc["answer"])}


def process_rag(doc: dict, results: list[str]) -> dict:
    """KILT RAG: HELMET reports substring exact match (SubEM)."""
    return {
        "substring_exact_match": _scored(_prediction(doc, results, chat=False), doc["answer"])["substring_exact_match"]
    }


def process_choice(doc: dict, results: list[str]) -> dict:
    """InfiniteBench MC (HELMET choice_post_process): exact match of output or parsed output with the letter or the
    "A. option" text; the "A. option" text as a substring also counts."""
    prediction = results[0]  # chat template in HELMET's longqa config: no prefix prepended
    metrics = qa_metrics(prediction, doc["answer"])
    parsed = parse_output(prediction)
    exact = max(metrics["exact_match"], qa_metrics(parsed, doc["answer"])["exact_match"] if parsed is not None else 0)
    if doc["answer"][1].lower() in prediction.lower():
        exact = 1.0
    return {"exact_match": float(exact)}


def process_judged(doc: dict, results: list[str]) -> dict:
    """InfiniteBench QA and NarrativeQA: the published number is a gpt-4o-mini judgement of the answer (HELMET's
    scripts/eval_gpt4_longqa.py); lm-eval's --log_samples file holds the answers for it. Reported here: HELMET's
    automatic metrics of the same answers (SubEM, token F1), not the judged score."""
    metrics = _scored(results[0], doc["answer"])
    return {"substring_exact_match": metrics["substring_exact_match"], "f1": metrics["f1"]}
