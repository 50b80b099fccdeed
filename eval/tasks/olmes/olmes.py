"""How AI2's OLMES harness renders, samples and scores the benchmarks of the Instella tables, as plain functions.

The authors scored every published Instella number with OLMES (commit 38af8b6; AMD-AIG-AIMA/Instella
`scripts/evals/`). `olmes_task.OlmesTask` runs these functions inside lm-evaluation-harness; the task YAMLs beside
this file (written by `scripts/make_eval_tasks.py` from `instella_recipes/evaluation/olmes_settings.py`) choose which
function each task uses. This file imports only the standard library and lm-eval (lm-eval loads it next to the YAMLs
with our package not installed); the library reads it as `instella_recipes.evaluation.olmes`. Where each fact
comes from (an OLMES fork file, OLMES-rendered requests, or OLMES's own task code) is in docs/evaluation.md.

Doc processors turn a dataset row into `{"query", "choices", "gold", ...}`: `query` is OLMES's `doc_to_text`, each
choice is scored as the continuation `" " + choice` (OLMES `MultipleChoiceTask.doc_to_target`).
"""

import math
import random
import re
from functools import partial

UNCONDITIONED_PROMPT = "Answer:"  # OLMES MultipleChoiceTask.unconditioned_prompt for cloze tasks (acc_uncond)
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


# --- which documents ------------------------------------------------------------------------------------------------
def sample_positions(n_docs: int, limit: int | None, seed: int | None) -> list[int]:
    """Positions OLMES evaluates when a split has more than `limit` docs: `random.Random(seed).sample(docs, limit)`
    (seed = the task's `random_subsample_seed`, 1234 by default), or the first `limit` when the seed is None."""
    if limit is None or n_docs <= limit:
        return list(range(n_docs))
    if seed is None:
        return list(range(limit))
    return random.Random(seed).sample(range(n_docs), limit)


# --- prompts: the small helpers OLMES builds them from ---------------------------------------------------------------
def cloze_prompt(question: str, question_prefix: str = "Question: ", answer_prefix: str = "Answer:") -> str:
    return f"{question_prefix}{question}\n{answer_prefix}"


def mc_prompt(question: str, choices: list[str], label_prefix: str = " ") -> str:
    """The lettered form: "Question: q\\n A. a\\n B. b\\nAnswer:" (the space before each label avoids tokenizing
    the label together with the newline)."""
    options = "\n".join(f"{label_prefix}{LETTERS[i]}. {text}" for i, text in enumerate(choices))
    return f"Question: {question}\n{options}\nAnswer:"


def preprocess(text: str | None, title_after_period: bool = False) -> str:
    """Text clean-up of WikiHow artifacts: " [title]" becomes ". ", other bracketed tags go, double spaces collapse.
    `title_after_period`: HellaSwag's variant, where a period before " [title]" is not doubled (what OLMES renders
    for all 10,042 HellaSwag validation docs); GPQA's answers use the plain one."""
    if text is None:
        return " "
    text = re.sub(r"\.? \[title\]" if title_after_period else r" \[title\]", ". ", text.strip())
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


# --- doc processors (one row -> one OLMES doc) ---------------------------------------------------------------------
def arc_doc(row: dict) -> dict:
    key = {"1": "A", "2": "B", "3": "C", "4": "D", "5": "E"}.get(row["answerKey"], row["answerKey"])
    return {
        "query": cloze_prompt(row["question"]),
        "choices": list(row["choices"]["text"]),
        "gold": LETTERS.index(key),
    }


def boolq_doc(row: dict) -> dict:
    query = f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:"
    return {"query": query, "choices": ["yes", "no"], "gold": 0 if row["label"] else 1}


def hellaswag_doc(row: dict) -> dict:
    context = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    query = preprocess(row["activity_label"] + ": " + context, title_after_period=True)
    endings = [preprocess(e, title_after_period=True) for e in row["endings"]]
    return {"query": query, "choices": endings, "gold": int(row["label"])}


def piqa_doc(row: dict) -> dict:
    return {"query": f"Goal: {row['goal']}\nAnswer:", "choices": [row["sol1"], row["sol2"]], "gold": int(row["label"])}


def sciq_doc(row: dict) -> dict:
    support = row["support"].strip()
    query = (support + "\n" if support else "") + cloze_prompt(row["question"])
    choices = [row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"]]
    return {"query": query, "choices": choices, "gold": 3}


def winogrande_doc(row: dict) -> dict:
    """Partial scoring: one context per option (the sentence up to the blank, option filled in), the same
    continuation (the rest of the sentence) for both."""
    blank = row["sentence"].index("_")
    options = [row["option1"], row["option2"]]
    return {
        "query": row["sentence"],
        "choices": options,
        "gold": int(row["answer"]) - 1,
        "contexts": [row["sentence"][:blank] + option for option in options],
        "continuation": " " + row["sentence"][blank + 1 :].strip(),
    }


def openbookqa_doc(row: dict, no_prefix: bool = False) -> dict:
    stem = row["question_stem"]
    query = stem if no_prefix else cloze_prompt(stem)
    return {"query": query, "choices": list(row["choices"]["text"]), "gold": LETTERS.index(row["answerKey"].strip())}


def mmlu_doc(row: dict) -> dict:
    choices = list(row["choices"])
    return {
        "query": mc_prompt(row["question"], choices),
        "choices": list(LETTERS[: len(choices)]),
        "gold": row["answer"],
    }


def truthfulqa_doc(row: dict) -> dict:
    """MC1 choices first, then the MC2 choices not already among them; `mc2_indices` says which are MC2's."""
    choices, labels = list(row["mc1_targets"]["choices"]), list(row["mc1_targets"]["labels"])
    mc1_indices, mc2_indices = list(range(len(choices))), []
    for choice, label in zip(row["mc2_targets"]["choices"], row["mc2_targets"]["labels"], strict=True):
        if choice not in choices:
            choices.append(choice)
            labels.append(label)
        mc2_indices.append(choices.index(choice))
    return {
        "query": f"Q: {row['question']}\nA:",  # `short_prefix: True` in truthfulqa::tulu
        "choices": choices,
        "gold": 0,
        "labels": labels,
        "mc1_indices": mc1_indices,
        "mc2_indices": mc2_indices,
    }


def gsm8k_doc(row: dict) -> dict:
    return {"query": cloze_prompt(row["question"]), "gold": row["answer"].split("####")[-1].strip()}


def gpqa_doc(row: dict, index: int, shuffling_seed: int = 111) -> dict:
    """Choices are [incorrect 1-3, correct] cleaned, shuffled with `random.Random(111 + row index)`."""
    correct = preprocess(row["Correct Answer"])
    choices = [preprocess(row[f"Incorrect Answer {i}"]) for i in (1, 2, 3)] + [correct]
    random.Random(shuffling_seed + index).shuffle(choices)
    query = "Question: " + row["Question"] + "\nChoices:\n"
    query += "".join(f" ({LETTERS[i]}) {choice}\n" for i, choice in enumerate(choices))
    return {"query": query, "choices": choices, "gold": LETTERS[choices.index(correct)]}


def minerva_math_doc(row: dict) -> dict:
    """`cot_style: plain`: the problem, stripped (OLMES strips it); the gold answer is the last \\boxed{} of the
    solution, normalized as lm-eval 0.4.3 does (`normalize_final_answer_043`)."""
    from lm_eval.tasks.minerva_math.utils import last_boxed_only_string, remove_boxed

    boxed = last_boxed_only_string(row["solution"])
    return {"query": row["problem"].strip(), "gold": normalize_final_answer_043(remove_boxed(boxed)) if boxed else ""}


def bbh_doc(row: dict, short_prefix: bool) -> dict:
    """The question ends with the CoT lead-in; the gold answer of a test row is its target."""
    question_prefix, answer_prefix = ("Q: ", "A:") if short_prefix else ("Question: ", "Answer:")
    query = cloze_prompt(row["input"], question_prefix, answer_prefix) + " Let's think step by step."
    match = re.search("(?<=answer is )(.*)(?=.)", row["target"])
    return {"query": query, "gold": match[0] if match else row["target"]}


def bbh_shot_target(cot: str) -> str:
    """A few-shot answer: the original BBH CoT exemplar's reasoning ("<reasoning> So the answer is X.", the lead-in
    "Let's think step by step." already in the question) after OLMES's " " delimiter, on the same line (OLMES
    renders "Let's think step by step. Remember that...", not a line break after the lead-in)."""
    return " " + re.sub(r"^Let's think step by step\.", "", cot.strip()).lstrip()


def process_docs(dataset, doc_fn, with_index: bool = False):
    """`process_docs` hook: `doc_fn` over a datasets.Dataset, OLMES fields added beside the row's own. Mapped in
    memory and never from datasets' cache (a cached map would survive an edit of these functions)."""
    kwargs = {"keep_in_memory": True, "load_from_cache_file": False}
    if with_index:
        return dataset.map(lambda row, i: doc_fn(row, i), with_indices=True, **kwargs)
    return dataset.map(doc_fn, **kwargs)


# Every task also reports its primary metric (the number the published table shows) under this one name, so that an
# lm-eval group over single tasks with different primary metrics (the offline suites) can average them.
PRIMARY_SCORE = "primary_score"


def ifeval_results(doc: dict, results: list[str]) -> dict:
    """lm-eval's IFEval scoring (`lm_eval.tasks.ifeval.utils.process_results`, unchanged) plus `primary_score`, its
    `prompt_level_loose_acc` (OLMES's primary metric for `ifeval::tulu`)."""
    from lm_eval.tasks.ifeval.utils import process_results  # noqa: PLC0415 - needs IFEval's extras, only when scoring

    scores = process_results(doc, results)
    return {**scores, PRIMARY_SCORE: scores["prompt_level_loose_acc"]}


# The `process_docs` functions the task YAMLs name.
arc_docs = partial(process_docs, doc_fn=arc_doc)
boolq_docs = partial(process_docs, doc_fn=boolq_doc)
hellaswag_docs = partial(process_docs, doc_fn=hellaswag_doc)
piqa_docs = partial(process_docs, doc_fn=piqa_doc)
sciq_docs = partial(process_docs, doc_fn=sciq_doc)
winogrande_docs = partial(process_docs, doc_fn=winogrande_doc)
openbookqa_no_prefix_docs = partial(process_docs, doc_fn=partial(openbookqa_doc, no_prefix=True))
mmlu_docs = partial(process_docs, doc_fn=mmlu_doc)
truthfulqa_docs = partial(process_docs, doc_fn=truthfulqa_doc)
gsm8k_docs = partial(process_docs, doc_fn=gsm8k_doc)
gpqa_docs = partial(process_docs, doc_fn=gpqa_doc, with_index=True)
minerva_math_docs = partial(process_docs, doc_fn=minerva_math_doc)
bbh_docs = partial(process_docs, doc_fn=partial(bbh_doc, short_prefix=False))
bbh_short_docs = partial(process_docs, doc_fn=partial(bbh_doc, short_prefix=True))


# --- contexts -------------------------------------------------------------------------------------------------------
def plain_context(query: str, shots: list[tuple[str, str]], description: str = "", final_description: str = "") -> str:
    """Base-model prompt: description, the shots (question + answer) joined by blank lines, then the question."""
    labeled = "".join(q + a + "\n\n" for q, a in shots)
    return description + labeled + query + final_description


def _strip_suffix(text: str, suffix: str | None) -> str:
    return re.sub(r"\s*" + re.escape(suffix) + r"\s*$", "", text) if suffix else text


def chat_messages(
    query: str,
    shots: list[tuple[str, str]],
    *,
    multiturn: bool,
    description: str = "",
    final_description: str = "",
    assistant_prefix: str | None = None,
) -> list[dict]:
    """OLMES's chat layout. The description opens the first user message (there is no system message).
    `multiturn`: each shot is a user turn (its question) and an assistant turn (`assistant_prefix` + its answer,
    stripped); otherwise all shots and the question share one user message, laid out as `plain_context`. A question
    ending in `assistant_prefix` loses it (the prefix is put after the assistant header instead)."""
    if not shots:
        return [{"role": "user", "content": description + query + final_description}]
    if not multiturn:
        text = _strip_suffix(plain_context(query, shots, description), assistant_prefix)
        return [{"role": "user", "content": text + final_description}]
    messages = []
    for i, (question, answer) in enumerate(shots):
        text = _strip_suffix((description if i == 0 else "") + question, assistant_prefix)
        reply = " ".join(part for part in ((assistant_prefix or "").strip(), answer.strip()) if part)
        messages += [{"role": "user", "content": text + final_description}, {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": _strip_suffix(query, assistant_prefix) + final_description})
    return messages


# --- multiple-choice metrics ----------------------------------------------------------------------------------------
def _first_argmax(values: list[float]) -> int:
    return values.index(max(values))  # ties go to the first choice, as in OLMES (list.index of the max)


def mc_metrics(
    gold: int,
    logliks: list[float],
    num_tokens: list[int] | None = None,
    continuations: list[str] | None = None,
    uncond_logliks: list[float] | None = None,
) -> dict[str, int]:
    """OLMES MCAccuracy for one doc: the chosen answer by summed log-likelihood (`acc_raw`), per continuation token
    (`acc_per_token`), per continuation character (`acc_per_char`, the continuation includes its leading space), and
    by the log-likelihood given the question minus that given the unconditioned prompt (`acc_uncond`)."""
    out = {"acc_raw": int(_first_argmax(logliks) == gold)}
    if num_tokens is not None:
        per_token = [ll / max(n, 1) for ll, n in zip(logliks, num_tokens, strict=True)]
        out["acc_per_token"] = int(_first_argmax(per_token) == gold)
    if continuations is not None:
        per_char = [ll / max(len(c), 1) for ll, c in zip(logliks, continuations, strict=True)]
        out["acc_per_char"] = int(_first_argmax(per_char) == gold)
    if uncond_logliks is not None:
        pmi = [ll - u for ll, u in zip(logliks, uncond_logliks, strict=True)]
        out["acc_uncond"] = int(_first_argmax(pmi) == gold)
    return out


def mc1_mc2(logliks: list[float], labels: list[int], mc1_indices: list[int], mc2_indices: list[int]) -> dict:
    """TruthfulQA (OLMES MC1MC2Accuracy): mc1 = the label of the best MC1 choice; mc2 = probability mass of the true
    MC2 answers among all MC2 answers."""
    best, mc1 = -math.inf, 0
    true_mass = false_mass = 0.0
    for i, ll in enumerate(logliks):
        if i in mc1_indices and ll > best:
            best, mc1 = ll, labels[i]
        if i in mc2_indices:
            if labels[i]:
                true_mass += math.exp(ll)
            else:
                false_mass += math.exp(ll)
    return {"mc1": int(mc1), "mc2": true_mass / (true_mass + false_mass)}


# --- answer extraction of generation tasks --------------------------------------------------------------------------
def exact_match(prediction: str, reference: str, **kwargs) -> float:
    """HF `evaluate`'s exact_match (regexes_to_ignore, ignore_case, ignore_punctuation), as OLMES scores it."""
    from lm_eval.api.metrics import exact_match_hf_evaluate

    return float(exact_match_hf_evaluate([prediction], [reference], **kwargs)["exact_match"])


GSM8K_EXACT_MATCH = {"regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"]}


def gsm8k_answer(continuation: str) -> str:
    """The last number of the generation (thousands separators removed), else the whole generation."""
    text = re.sub(r"(\d),(\d)", r"\1\2", continuation)
    numbers = re.findall(r"[-+]?\d*\.\d+|\d+", text)
    return numbers[-1] if numbers else text


BBH_ANSWER_REGEX = {
    "boolean_expressions": "[tT]rue|[fF]alse",
    "causal_judgement": "[yY]es|[nN]o",
    "dyck_languages": "[\\]\\)\\}\\> ]+",
    "formal_fallacies": "[iI]nvalid|[vV]alid",
    "multistep_arithmetic_two": "-?\\d+",
    "navigate": "[nN]o|[yY]es",
    "object_counting": "\\d+",
    "sports_understanding": "[yY]es|[nN]o",
    "web_of_lies": "[yY]es|[nN]o",
    "word_sorting": "[a-z ]+",
}  # every other subtask is multiple choice: "(A)".."(Z)"
_BBH_TEMPLATES = ["(?i)So the answer is ($ANS$)\\.?", "(?i)answer is ($ANS$)", "(?i)answer:.*?($ANS$)",
                  "(?i)answer\\b.*?($ANS$)", "($ANS$)"]  # fmt: skip
_BBH_DELIMITERS = [("$", "$"), ("\\(", "\\)"), ("(", ")"), ("**", "**"), ("***", "***"), ("\\[", "\\]"),
                   ("'", "'"), ("`", "`"), ('"', '"')]  # fmt: skip


# OLMES's last-resort pattern for a bare letter of a multiple-choice subtask, as its source writes it: "\b([A-Z])\b"
# in a non-raw string, i.e. two backspace characters (\x08) around the group, which no generation contains, so it
# never matches ("So the answer is B." scores 0 there). The published numbers were made with it: the OLMES tasks keep
# it (`exact_match`); `exact_match_corrected` scores the same generation with the word-boundary pattern it meant.
BBH_LETTER_OLMES = "\b([A-Z])\b"  # noqa: ISC001 - deliberately not raw: \b is a backspace here, as in OLMES
BBH_LETTER_CORRECTED = r"\b([A-Z])\b"


def bbh_answer(continuation: str, subtask: str, corrected: bool = False) -> str:
    """BBH `answer_extract_fn: answer_regex` (the cot-v1 variants): the last match of the first of several
    increasingly loose patterns around the subtask's answer form, surrounding quotes/brackets removed; a bare
    letter of a multiple-choice subtask becomes "(X)". `corrected`: the bare-letter fallback matches a letter between
    word boundaries (OLMES's own pattern never matches, see BBH_LETTER_OLMES)."""
    answer = BBH_ANSWER_REGEX.get(subtask)
    is_mc = answer is None
    answer = "\\([A-Z]\\)" if is_mc else answer
    letter = BBH_LETTER_CORRECTED if corrected else BBH_LETTER_OLMES
    templates = _BBH_TEMPLATES + ([letter] if is_mc else []) + ["(?i)($ANS$)"]
    extracted = ""
    for template in templates:
        found = re.findall(template.replace("$ANS$", answer), continuation)
        if found:
            extracted = found[-1]
            break
    for left, right in _BBH_DELIMITERS:
        if re.match(answer, left):
            continue
        extracted = re.sub(f"^{re.escape(left)}(.*){re.escape(right)}$", "\\1", extracted).strip()
    return f"({extracted})" if is_mc and len(extracted) == 1 else extracted


def bbh_exact_match(prediction: str, gold: str, subtask: str) -> float:
    return exact_match(prediction, gold, ignore_case=True, ignore_punctuation=subtask != "dyck_languages")


GPQA_LLAMA31_FORMAT = "The best answer is (\\(?[A-D])"


def gpqa_answer(continuation: str, answer_format_regex: str = GPQA_LLAMA31_FORMAT) -> str:
    """The last match of the answer format; else the last "(X)", "The correct answer is: X", or a lone capital
    A-D; parentheses removed."""
    found = re.findall(answer_format_regex, continuation)
    answer = found[-1] if found else None
    if answer is None:
        parenthesized = re.findall(r"\(([A-D])\)", continuation)
        stated = re.search(r"(?<=The correct answer is: )([A-D])", continuation)
        if parenthesized:
            answer = parenthesized[-1]
        elif stated:
            answer = stated.group(1)
        else:
            lone = re.findall(".*\\b([A-D])\\b", continuation)
            answer = lone[-1] if lone else ""
    return re.sub("\\(|\\)", "", answer)


def normalize_final_answer_043(final_answer: str) -> str:
    """lm-eval 0.4.3's `normalize_final_answer` (Lewkowycz et al. 2022, appendix D), the version OLMES pins:
    plain substring removal of the unit words (0.4.13 removes them at word boundaries only, so "\\left" keeps its
    "ft" there and e.g. "5ft" normalizes differently). The substitution lists are lm-eval's own (unchanged since)."""
    from lm_eval.tasks.minerva_math.utils import REMOVED_EXPRESSIONS, SUBSTITUTIONS

    final_answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer


def math_answers(continuation: str) -> list[str]:
    """Every candidate answer OLMES reads from a MATH generation, normalized (lm-eval 0.4.3): the Minerva "Final
    Answer: The final answer is X. I hope it is correct." and the last \\boxed{}; failing both, the text between the
    last two "$"; failing that, the whole generation."""
    from lm_eval.tasks.minerva_math.utils import get_unnormalized_answer, last_boxed_only_string, remove_boxed

    answers = []
    minerva = normalize_final_answer_043(get_unnormalized_answer(continuation))
    if minerva and minerva != "[invalidanswer]":
        answers.append(minerva)
    boxed = last_boxed_only_string(continuation)
    if boxed is not None:
        try:
            answers.append(normalize_final_answer_043(remove_boxed(boxed)))
        except AssertionError:
            pass
    if not answers:
        dollars = [m.start() for m in re.finditer("\\$", continuation)]
        if len(dollars) > 1:
            answers.append(normalize_final_answer_043(continuation[dollars[-2] + 1 : dollars[-1]]))
    return answers or [normalize_final_answer_043(continuation)]


# The sympy check's budget. lm-eval (0.4.3 and now) gives it 5 s of wall clock (SIGALRM), so a correct answer scores
# 0 whenever the machine is busy; we give it 5 s of this process's CPU time (SIGPROF), which load does not shorten.
# On an idle machine the two agree; a comparison that exhausts the budget counts as "not equivalent", as in OLMES,
# and is logged with both strings. Off the main thread (signals cannot be set there) the check runs unbudgeted.
SYMPY_CPU_SECONDS = 5.0


class SympyBudgetExceeded(Exception):
    pass


def _raise_budget(signum, frame):
    raise SympyBudgetExceeded


def sympy_equiv(x1: str, x2: str, cpu_seconds: float = SYMPY_CPU_SECONDS) -> bool:
    """lm-eval 0.4.3's `is_equiv` (parse both LaTeX strings with sympy, equivalent when their difference simplifies
    to 0; any parse or sympy failure: not equivalent), under a CPU-time budget instead of a wall-clock alarm."""
    import signal
    import threading

    import sympy
    from sympy.parsing.latex import parse_latex

    budgeted = threading.current_thread() is threading.main_thread()
    if budgeted:
        previous = signal.signal(signal.SIGPROF, _raise_budget)
        signal.setitimer(signal.ITIMER_PROF, cpu_seconds)
    try:
        return bool(sympy.simplify(parse_latex(x1) - parse_latex(x2)) == 0)
    except SympyBudgetExceeded:
        import logging

        logging.getLogger(__name__).warning(
            f"Minerva MATH: sympy spent its {cpu_seconds:g} s CPU budget comparing {x1!r} with {x2!r}: "
            "counted not equivalent (as OLMES counts its timeouts)"
        )
        return False
    except Exception:  # noqa: BLE001 - lm-eval 0.4.3 counts every parse/simplify failure as "not equivalent"
        return False
    finally:
        if budgeted:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, previous)


def math_exact_match_flex(continuation: str, gold: str) -> int:
    """1 if any candidate answer equals the gold answer by lm-eval 0.4.3's sympy check or by the Hendrycks MATH
    string check (`strip_string` on both), as OLMES's `exact_match_flex` scores."""
    from lm_eval.tasks.hendrycks_math.utils import is_equiv as hendrycks_equiv

    return int(any(sympy_equiv(a, gold) or hendrycks_equiv(a, gold) for a in math_answers(continuation)))
