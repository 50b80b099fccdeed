"""Small named converters from each published SFT source to TRL's conversational `{"messages": [...]}` rows, and
from chat rows to stage-2 pretraining text.

A converter is `fn(row, index) -> {"messages": [...]}`; the mixture (`mixture.py`) looks it up by the `converter`
name of a source in the recipe. Field names follow the sources' Hub cards; a row without the expected fields raises
`KeyError`, which the mixture reports with the source name and the columns it found.
"""

import random
from collections.abc import Callable

LETTERS = "ABCDEFGHIJ"


def _chat(user: str, assistant: str) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]}


def messages(row: dict, index: int) -> dict:
    """Already conversational (`messages` list of {role, content}): SmolTalk, Tulu-3 persona IF, TinyWorld SFT."""
    return {"messages": [{"role": m["role"], "content": m["content"]} for m in row["messages"]]}


def openmathinstruct2(row: dict, index: int) -> dict:
    """nvidia/OpenMathInstruct-2 (`problem`, `generated_solution`): the problem as the user turn, the solution as
    the assistant turn (the solution already ends with the boxed answer)."""
    return _chat(row["problem"], row["generated_solution"])


def mmlu_auxiliary_train(row: dict, index: int, seed: int = 0) -> dict:
    """cais/mmlu `auxiliary_train` (`question`, `choices`, `answer` index; older revisions nest them under `train`)
    as a question/answer prompt with the options shuffled (seeded by row index, so the answer letter is spread
    evenly and the mix is reproducible): user = question + lettered options, assistant = "The answer is X. <text>".

    The authors describe re-templating with shuffled options but did not publish the exact wording; this layout is
    our reconstruction (the same letter format as MMLU prompts)."""
    item = row.get("train", row)
    choices = list(item["choices"])
    correct = choices[int(item["answer"])]
    rng = random.Random(f"{seed}-{index}")
    rng.shuffle(choices)
    options = "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(choices))
    letter = LETTERS[choices.index(correct)]
    return _chat(f"{item['question'].strip()}\n{options}", f"The answer is {letter}. {correct}")


def o1_journey(row: dict, index: int) -> dict:
    """GAIR/o1-journey (`question` plus the long chain-of-thought `longCOT`; `answer` when there is none)."""
    for key in ("longCOT", "long_cot", "response", "answer"):
        if row.get(key):
            return _chat(row["question"], row[key])
    raise KeyError("longCOT")


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
    "mmlu_auxiliary_train": mmlu_auxiliary_train,
    "o1_journey": o1_journey,
    "preference": preference,
}


def chat_to_text(conversation: list[dict]) -> str:
    """Stage-2 pretraining text from a chat (SPEC.md section 2): each message's content stripped, plus "\\n", no role
    tags. The pretraining packer adds the EOS between documents."""
    return "".join(str(m["content"]).strip() + "\n" for m in conversation)
