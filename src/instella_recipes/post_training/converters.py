"""Small named converters from each published SFT source to TRL's conversational `{"messages": [...]}` rows, and
from chat rows to stage-2 pretraining text.

A converter is `fn(row, index) -> {"messages": [...]}`, or, where the authors drew random choices row after row
from one generator (MMLU), a sequential `fn(rows, seed) -> iterator of rows` (`SEQUENTIAL_CONVERTERS`); the mixture
(`mixture.py`) looks it up by the `converter` name of a source in the recipe. Field names follow the sources' Hub
cards; a row without the expected fields raises `KeyError`, which the mixture reports with the source name and
the columns it found.
"""

import random
from collections.abc import Callable, Iterable, Iterator

from .template import ROLES


def _chat(user: str, assistant: str) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]}


def messages(row: dict, index: int) -> dict:
    """Already conversational (`messages` list of {role, content}): SmolTalk, Tulu-3 persona IF, TinyWorld SFT."""
    return {"messages": [{"role": m["role"], "content": m["content"]} for m in row["messages"]]}


def openmathinstruct2(row: dict, index: int) -> dict:
    """nvidia/OpenMathInstruct-2 (`problem`, `generated_solution`): the problem as the user turn, the solution as
    the assistant turn (the solution already ends with the boxed answer)."""
    return _chat(row["problem"], row["generated_solution"])


# The 11 question/answer templates of the authors' `scripts/prepare_sft_data.py` (`convert_mmlu`), verbatim.
_OPTIONS = "\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}"
MMLU_QA_TEMPLATES: tuple[tuple[str, str], ...] = (
    (
        "Given the following question and four candidate answers (A, B, C, and D), select the most appropriate "
        "answer." + _OPTIONS,
        "The most appropriate answer is {answer}.",
    ),
    (
        "Choose the correct answer from the options below (A, B, C, or D):" + _OPTIONS,
        "The correct answer is {answer}.",
    ),
    (
        "Based on the following question and options, identify the best answer (A, B, C, or D)." + _OPTIONS,
        "The best answer is {answer}.",
    ),
    (
        "Analyze the question and the four answer choices (A, B, C, and D). Then select the correct answer."
        + _OPTIONS,
        "After analysis, the correct answer is {answer}.",
    ),
    (
        "Consider the question below and choose the best option from A, B, C, or D." + _OPTIONS,
        "The best option is {answer}.",
    ),
    (
        "Select the correct response (A, B, C, or D) to the question provided below." + _OPTIONS,
        "The correct response is {answer}.",
    ),
    (
        "Determine the correct choice (A, B, C, or D) based on the question and information provided." + _OPTIONS,
        "The determined correct choice is {answer}.",
    ),
    (
        "From the following question and answer choices, identify the correct option (A, B, C, or D)." + _OPTIONS,
        "The identified correct option is {answer}.",
    ),
    (
        "Using the given question and four possible answers, select the best option (A, B, C, or D)." + _OPTIONS,
        "The selected best option is {answer}.",
    ),
    (
        "Read the question and options below, then determine the correct answer (A, B, C, or D)." + _OPTIONS,
        "The determined correct answer is {answer}.",
    ),
    (_OPTIONS.removeprefix("\n"), "{answer}."),
)
MMLU_DATA_SEED = 96  # prepare_sft_data.py's --seed default: random.seed(96) before converting


def mmlu_auxiliary_train(rows: Iterable[dict], seed: int = MMLU_DATA_SEED) -> Iterator[dict]:
    """cais/mmlu `auxiliary_train` (`question`, `choices`, `answer` index; older revisions nest them under `train`)
    exactly as the authors' `convert_mmlu`: one random generator seeded with `seed` walks the rows in order; for
    each row it shuffles the four options, then draws one of the 11 templates. `random.Random(seed)` replays the
    module-level `random` the authors seed, call for call. Sequential by nature: the mixture runs it in one process.
    """
    rng = random.Random(seed)
    for row in rows:
        item = row.get("train", row)
        options = list(item["choices"])
        correct_option = options[int(item["answer"])]
        rng.shuffle(options)
        shuffled = dict(zip("ABCD", options))
        letter = next(label for label, option in shuffled.items() if option == correct_option)  # first match
        question, answer = rng.choice(MMLU_QA_TEMPLATES)
        yield _chat(
            question.format(
                question=item["question"], option_a=shuffled["A"], option_b=shuffled["B"], option_c=shuffled["C"],
                option_d=shuffled["D"],
            ),
            answer.format(answer=letter),
        )  # fmt: skip


def o1_journey(row: dict, index: int) -> dict:
    """GAIR/o1-journey (`question` plus the long chain-of-thought `longCOT`): the target is
    `longCOT.split("\\n####")[0]`, the reasoning without the trailing "####" answer line (the authors'
    `convert_o1journey`). Other dumps: `long_cot`, `response` or `answer`, unchanged."""
    if row.get("longCOT"):
        return _chat(row["question"], row["longCOT"].split("\n####")[0])
    for key in ("long_cot", "response", "answer"):
        if row.get(key):
            return _chat(row["question"], row[key])
    raise KeyError("longCOT")


def am_deepseek_r1_distilled(row: dict, index: int) -> dict:
    """a-m-team/AM-DeepSeek-R1-Distilled-1.4M (`am_0.5M`, `am_0.9M`): its `messages` with role and content only
    (each message's `info` dict of source / reference answer / think and answer parts is dropped; the content
    already holds the `<think>...</think> <answer>...</answer>` text the authors trained on)."""
    return messages(row, index)


def first_message_is_english(row: dict) -> bool:
    """The authors' English-only rule for Instella-Math SFT stage 2 (`sft/prepare_ammath_dataset.py` `is_english`):
    `langdetect.detect` of the first message's content is "en"; undetectable text (no letters) is not English.

    langdetect samples n-grams at random; the authors left it unseeded, so a borderline row could go either way
    between two of their runs. Seeded here (`DetectorFactory.seed = 0`, langdetect's documented way) so the same
    rows are kept every time."""
    # langdetect loads its 55 language profiles on first use: imported here, only by the source that needs it
    from langdetect import DetectorFactory, detect
    from langdetect.lang_detect_exception import LangDetectException

    DetectorFactory.seed = 0
    try:
        return detect(row["messages"][0]["content"]) == "en"
    except LangDetectException:
        return False


def preference(row: dict, index: int) -> dict:
    """A preference row (allenai/olmo-2-1124-7b-preference-mix style): `chosen` / `rejected` full conversations
    (optionally with a conversational `prompt`). A string `prompt` beside conversational chosen/rejected is dropped
    (the conversations already hold the prompt; TRL derives it as their shared prefix)."""
    out = {"chosen": row["chosen"], "rejected": row["rejected"]}
    if isinstance(row.get("prompt"), list):
        out["prompt"] = row["prompt"]
    return out


CONVERTERS: dict[str, Callable[..., dict]] = {
    "messages": messages,
    "smoltalk": messages,
    "tulu3_persona_if": messages,
    "openmathinstruct2": openmathinstruct2,
    "o1_journey": o1_journey,
    "preference": preference,
    "am_deepseek_r1_distilled": am_deepseek_r1_distilled,
}

# Rows a converter's source keeps, applied before converting (`fn(row) -> bool`).
ROW_FILTERS: dict[str, Callable[[dict], bool]] = {
    "am_deepseek_r1_distilled": first_message_is_english,
}


# Converters over the whole source in order (a shared random state across rows): `fn(rows, seed) -> iterator`.
SEQUENTIAL_CONVERTERS: dict[str, Callable[..., Iterator[dict]]] = {
    "mmlu_auxiliary_train": mmlu_auxiliary_train,
}


def chat_to_text(conversation: list[dict]) -> str:
    """Stage-2 pretraining text from a chat (SPEC.md section 2): each message's content stripped, plus "\\n", no role
    tags. The pretraining packer adds the EOS between documents. A content that is not a string (a number, a list)
    is a `ValueError` saying what it is: its Python repr is not the text of a chat; so is a role other than system /
    user / assistant (`template.ROLES`, what SFT accepts): a "wizard" turn is a broken or foreign source, whose text
    would enter pretraining unnoticed."""
    for i, m in enumerate(conversation):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else m
            raise ValueError(f"message {i}'s role is {role!r:.40}, not one of {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            shown = repr(m["content"])
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise ValueError(f"message {i}'s content is {type(m['content']).__name__} ({shown}), not text")
    return "".join(m["content"].strip() + "\n" for m in conversation)
