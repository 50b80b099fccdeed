"""Reading seed rows and model replies. Every failure is a `Rejected(reason)` with a stable reason name that the
pipeline counts; nothing here raises anything else on bad input."""

import json
import math
import re

from instella_recipes.core.paths import RECIPES_DIR

# The published prompts are data: recipes/synthetic_gsm8k/prompts/ (one file per step).
PROMPTS = RECIPES_DIR / "synthetic_gsm8k" / "prompts"
_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?"


class Rejected(ValueError):
    """Bad input or a reply that does not parse; `reason` is the counter it goes under."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def load_prompt(name: str) -> str:
    return (PROMPTS / name).read_text()


def fill(template: str, **values) -> str:
    """Replace `{{name}}` slots (prompt files use double braces so that JSON and `{param}` stay literal)."""
    for key, value in values.items():
        template = template.replace("{{" + key + "}}", str(value))
    return template


def to_number(text: str) -> int | float:
    """'1,234' / '$5' / '3.50' / '-2' -> a number; raises ValueError."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    value = float(cleaned)
    if not math.isfinite(value):
        raise ValueError(text)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def format_number(value) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else f"{value:.10g}"


def numbers_equal(a, b) -> bool:
    return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))


def parse_seed(row: dict) -> tuple[str, int | float]:
    """A GSM8K row -> (question, gold answer). Reasons: seed_unparsable, seed_missing_question, seed_no_answer_marker,
    seed_non_numeric_answer."""
    if "_unparsable_line" in row:
        raise Rejected("seed_unparsable", f"line {row['_unparsable_line']} is not a JSON object")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise Rejected("seed_missing_question", "no non-empty 'question' field")
    answer = row.get("answer")
    if not isinstance(answer, str) or "####" not in answer:
        raise Rejected("seed_no_answer_marker", "the 'answer' field has no '#### N' final answer")
    final = answer.rsplit("####", 1)[1].strip()
    try:
        return question.strip(), to_number(final)
    except ValueError:
        raise Rejected("seed_non_numeric_answer", f"final answer {final[:40]!r} is not a number") from None


def extract_json(reply: str):
    """The first JSON value in a reply: a ```json block, else the first balanced {...} or [...]."""
    block = re.search(r"```(?:json)?\s*\n(.*?)```", reply, re.S)
    candidates = [block.group(1)] if block else []
    starts = sorted(i for i in (reply.find("{"), reply.find("[")) if i >= 0)
    candidates += [reply[i:] for i in starts]  # whichever of {...} / [...] comes first
    decoder = json.JSONDecoder()
    for text in candidates:
        text = text.strip()
        try:
            return decoder.raw_decode(text)[0]
        except ValueError:
            continue
    raise ValueError("no JSON value found")


def _numeric_params(params, reason: str) -> dict:
    if not isinstance(params, dict) or not params:
        raise Rejected(reason, "parameters must be a non-empty JSON object")
    out = {}
    for name, value in params.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise Rejected(reason, f"parameter name {name!r} is not a Python identifier")
        if isinstance(value, bool):
            raise Rejected(reason, f"parameter {name} is not a number")
        if isinstance(value, str):
            try:
                value = to_number(value)
            except ValueError:
                raise Rejected(reason, f"parameter {name}={value!r} is not a number") from None
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise Rejected(reason, f"parameter {name} is not a finite number")
        out[name] = value
    return out


def parse_abstraction(reply: str) -> tuple[str, dict]:
    """Step 1 reply -> (masked question, {param: value}). Reasons: abstract_unparsable, abstract_invalid."""
    try:
        data = extract_json(reply)
    except ValueError:
        raise Rejected("abstract_unparsable", "no JSON object in the reply") from None
    if not isinstance(data, dict) or not isinstance(data.get("question"), str):
        raise Rejected("abstract_unparsable", "expected {'question': ..., 'parameters': {...}}")
    params = _numeric_params(data.get("parameters"), "abstract_invalid")
    masked = data["question"]
    slots = set(re.findall(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", masked))
    if slots != set(params):
        raise Rejected("abstract_invalid", f"placeholders {sorted(slots)} != parameters {sorted(params)}")
    return masked, params


def extract_code(reply: str) -> str:
    """Step 2 reply -> program source (the last ```python block, or the bare reply when it starts with code).
    Reason: program_unparsable."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", reply, re.S)
    source = blocks[-1] if blocks else reply
    if "def answer" not in source:
        raise Rejected("program_unparsable", "no `def answer(...)` in the reply")
    return source.strip() + "\n"


def parse_variants(reply: str, names: set[str], original: dict) -> tuple[list[dict], int]:
    """Step 3 reply -> (valid new parameter sets, number of invalid ones). Reason: variants_unparsable."""
    try:
        data = extract_json(reply)
    except ValueError:
        raise Rejected("variants_unparsable", "no JSON list in the reply") from None
    if isinstance(data, dict):
        data = next((v for v in data.values() if isinstance(v, list)), [data])
    if not isinstance(data, list):
        raise Rejected("variants_unparsable", "expected a JSON list of parameter sets")
    valid, invalid = [], 0
    for item in data:
        try:
            params = _numeric_params(item, "variant_invalid")
        except Rejected:
            invalid += 1
            continue
        if set(params) != names or params == original or params in valid:
            invalid += 1
            continue
        valid.append(params)
    return valid, invalid


def substitute(masked: str, params: dict) -> str:
    """Fill a masked question's `{param}` placeholders with values."""
    return re.sub(
        r"\{([A-Za-z_][A-Za-z0-9_]*)\}",
        lambda m: format_number(params[m.group(1)]) if m.group(1) in params else m.group(0),
        masked,
    )


def rewritten_ok(text: str, params: dict) -> bool:
    """A model's rewrite is accepted when every new value appears in it as a number and no placeholder is left."""
    if not text.strip() or re.search(r"\{[A-Za-z_]\w*\}", text):
        return False
    found = set()
    for token in re.findall(_NUMBER, text):
        try:
            found.add(float(to_number(token)))
        except ValueError:
            pass
    return all(float(v) in found for v in params.values())


def final_answer(solution: str):
    """The N of the last "The answer is N" in a chain of thought, or None."""
    matches = re.findall(r"[Tt]he (?:final )?answer is[:\s]*\$?\s*(" + _NUMBER + ")", solution)
    if not matches:
        return None
    try:
        return to_number(matches[-1])
    except ValueError:
        return None
