"""The 0/1 math answer check Instella-Math was trained with: the Prime-RL rules of VERL's `prime_math.compute_score`.

The authors' GRPO (AMD-AIG-AIMA/Instella-Math `verl/verl/utils/reward_score/__init__.py`) sends every sample to
`prime_math.compute_score(solution, ground_truth)` and rewards `float(is_correct)`. Those rules (OpenAI prm800k's
`grade_answer` and `math_normalize`, MIT; NVIDIA/Microsoft's `math_equal`; PRIME's `match_answer`, Apache-2.0) are
re-expressed here, step for step, so that the verdicts are the same; `tests/unit/rewards/test_math_grader.py`
checks that against a test-only copy of the authors' files on a few hundred answers.

Three deliberate differences, none of which changes a verdict on a real answer:
- **Budgets are CPU time, not wall-clock time.** Their sympy calls run under `SIGALRM` alarms (10 s for the
  normalised-string sympy check, 1 s for `math_equal`'s parse/simplify/evaluate steps, which `compute_score` calls
  with `timeout=True`, 10 s in its recursive calls), so a loaded machine could turn a right answer wrong. Ours use
  the same numbers as process CPU seconds (`ITIMER_PROF`): a step that runs out of budget counts as "not equal",
  exactly as their timeout does. Off the main thread (where no signal handler can be set) the steps run unbudgeted.
- **No `eval` of model text.** Their `\\pi` handling `eval`s the rewritten answer; ours evaluates only number
  literals and arithmetic (`+ - * / // % ** ^`, unary signs, tuples/lists/sets, comparisons) with Python's own
  operators, so arithmetic gives the same value; anything else stays a string (as a failing `eval` leaves it).
  Strings containing `__` are never handed to sympy's `parse_expr` (which `eval`s too): treated as unparsable.
- Their two `pmatrix` branches test for `"\\begin{pmatrix}"` written without a raw string, i.e. a backspace followed by
  `egin{pmatrix}`, which no real text contains; they are not reproduced.
"""

import ast
import contextlib
import math
import operator
import re
import signal
import threading
from collections.abc import Iterator

import sympy
from pylatexenc import latex2text
from sympy.parsing import sympy_parser
from sympy.parsing.latex import parse_latex

# --------------------------------------------------------------------------------------------- budgets

# CPU seconds, the numbers of their wall-clock alarms: prm800k's sympy check; `math_equal` as `compute_score` calls it
SYMPY_CHECK_BUDGET_S = 10.0
MATH_EQUAL_BUDGET_S = 1.0


class BudgetExceeded(Exception):
    """A sympy step used up its CPU-time budget; the comparison it belongs to counts as "not equal"."""


@contextlib.contextmanager
def cpu_budget(seconds: float) -> Iterator[None]:
    """Raise `BudgetExceeded` inside the block once this process has spent `seconds` of CPU time in it.

    Process CPU time (`ITIMER_PROF`, user + system), so a busy machine does not change the outcome; only possible on
    the main thread (signal handlers), elsewhere the block runs without a budget."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _expired(signum, frame):
        raise BudgetExceeded(f"sympy step over its {seconds} s CPU budget")

    previous = signal.signal(signal.SIGPROF, _expired)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


# ----------------------------------------------------------------------------------- answer extraction


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or, if none, `\\fbox{...}`), braces balanced, stripped; None if
    there is none or it never closes."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth, left = 0, None
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
            left = i if left is None else left
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return None if left is None else text[left + 1 : i].strip()
    return None


def _after_last(text: str, markers: tuple[str, ...]) -> str:
    """Each marker in turn: keep what follows its last (case-insensitive) occurrence."""
    for marker in markers:
        at = text.lower().rfind(marker)
        if at != -1:
            text = text[at + len(marker) :].strip()
    return text


def extract_answer(response: str) -> str:
    """The answer text Prime-RL's `match_answer` grades: after "answer:"/"answer is"/"answers are", before "is the
    answer", then the last `\\boxed{}` if any, then the tail after the last ". ", "=", "is ", ": ", ... ."""
    response = _after_last(response, ("answer:", "answer is", "answers are"))
    for marker in ("is answer", "is the answer", "are answers", "are the answers"):
        at = response.lower().rfind(marker)
        if at != -1:
            response = response[:at].strip()
    boxed = last_boxed(response)
    if boxed:
        response = boxed
    if ". " in response:
        response = response[: response.rfind(". ")].strip()
    return _after_last(response, ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n"))


# --------------------------------------------------------------------- MATH (Hendrycks) normalisation


def _braced_fracs(text: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`; unchanged if a `\\frac` has < 2 chars after."""
    head, *tails = text.split("\\frac")
    out = head
    for tail in tails:
        out += "\\frac"
        if tail[0] == "{":  # IndexError on a trailing "\frac": the caller keeps the input as it was
            out += tail
            continue
        if len(tail) < 2:
            return text
        a, b, rest = tail[0], tail[1], tail[2:]
        out += "{" + a + "}" + (b + rest if b == "{" else "{" + b + "}" + rest)
    return out


def _slash_to_frac(text: str) -> str:
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    return f"\\frac{{{a}}}{{{b}}}" if text == f"{a}/{b}" else text


def _drop_text_units(text: str) -> str:
    """`5 \\text{ cm}` -> `5 `: "\\text{ " marks units; raises if it occurs more than once (caller keeps input)."""
    if "\\text{ " not in text:
        return text
    parts = text.split("\\text{ ")
    if len(parts) != 2:
        raise ValueError("several \\text{ units")
    return parts[0]


def _braced_sqrt(text: str) -> str:
    if "\\sqrt" not in text:
        return text
    head, *tails = text.split("\\sqrt")
    # tail[0] raises IndexError on a trailing "\sqrt": the caller keeps the input as it was
    return head + "".join("\\sqrt" + (tail if tail[0] == "{" else "{" + tail[0] + "}" + tail[1:]) for tail in tails)


def _mathd_strip(text: str) -> str:
    text = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    text = text.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    text = _drop_text_units(text)
    text = text.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = _braced_sqrt(text).replace(" ", "")
    text = _braced_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_to_frac(text)


def mathd_normalize(answer: str | None) -> str | None:
    """Hendrycks' MATH `_strip_string` (prm800k `math_normalize.normalize_answer`); on any internal error the
    (stripped, `\\text{}`-unwrapped) input is returned as it was."""
    if answer is None:
        return None
    answer = answer.strip()
    try:
        m = re.search(r"^\\text\{(?P<text>.+?)\}$", answer)
        if m is not None:
            answer = m.group("text").strip()
        return _mathd_strip(answer)
    except Exception:
        return answer


# ------------------------------------------------------------------------------ prm800k normalisation

_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year")
_UNITS += ("foot", "feet", "inch", "yard", "liter")
_BAD_SUBSTRINGS = ("^{", "^(")
_BAD_REGEXES = (r"\^[0-9]+\^", r"\^[0-9][0-9]+")
_TUPLE_CHARS = "()[]"


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _is_int(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except Exception:
        return False


def _is_frac(text: str) -> bool:
    return bool(re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", text))


def _strip_thousands_commas(text: str) -> str:
    """`1,234,567` -> `1234567`, leaving tuple commas (`1,2`) alone."""
    pattern = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
    while True:
        changed = pattern.sub(r"\1\3\4", text)
        if changed == text:
            return changed
        text = changed


def _str_is_int(text: str) -> bool:
    try:
        x = float(_strip_thousands_commas(text))
        return abs(x - int(round(x))) <= 1e-7
    except Exception:
        return False


def _latex_to_plain(text: str) -> str:
    text = text.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    text = latex2text.LatexNodes2Text().latex_to_text(text)
    for symbol, name in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        text = text.replace(symbol, name)
    return text.strip()


def prm_normalize(expr: str | None, units: tuple[str, ...] = _UNITS, squeeze: bool = False) -> str | None:
    """prm800k `grader._normalize`: drop `\\text{}`, `$`, `%`, unit words, degrees, outer braces; LaTeX to plain
    text (pylatexenc); integers to canonical form; lower case. DeepScaleR's copy (the evaluation's) knows one unit
    less ("liter") and `squeeze`s: spaces and any braces left are dropped before lower-casing."""
    if expr is None:
        return None
    m = re.search(r"^\\text\{(?P<text>.+?)\}$", expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in units:
        expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if len(expr) > 0 and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _is_int(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        with contextlib.suppress(Exception):
            expr = _latex_to_plain(expr)
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", r"\1+\2", expr)  # a mixed number "7 3/4" -> "7+3/4"
    if squeeze:
        expr = expr.replace(" ", "").replace("{", "").replace("}", "")
    expr = expr.lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _sympy_parse(expr: str):
    if "__" in expr:  # sympy's parse_expr eval()s its input: never hand it dunder access from model text
        raise ValueError("refused: '__' in an expression")
    return sympy_parser.parse_expr(
        expr.replace("^", "**"),
        transformations=sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,),
    )


def _sympy_allowed(expr: str) -> bool:
    """Not more than two unknown letters, no `^{`/`^(` and no runs of big exponents (sympy may hang on those)."""
    if len({c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}) > 2:
        return False
    if any(bad in expr for bad in _BAD_SUBSTRINGS):
        return False
    return all(re.search(bad, expr) is None for bad in _BAD_REGEXES)


def _equal_under_sympy(truth: str, given: str) -> bool:
    """`sympy.simplify(truth - given) == 0`, within a 10 s CPU budget (prm800k's alarm was 10 s wall-clock)."""
    try:
        with cpu_budget(SYMPY_CHECK_BUDGET_S):
            expr = f"({truth})-({given})"
            return _sympy_allowed(expr) and sympy.simplify(_sympy_parse(expr)) == 0
    except Exception:
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if len(expr) > 2 and expr[0] in _TUPLE_CHARS and expr[-1] in _TUPLE_CHARS and not any(c in inner for c in "()[]"):
        return [elem.strip() for elem in inner.split(",")]
    return [expr]


def grade_answer(given: str | None, truth: str, normalize=prm_normalize) -> bool:
    """prm800k `grade_answer`: equal after MATH normalisation, or after prm800k normalisation (`normalize`), or element
    by element (tuples/intervals with the same brackets) where unreduced fractions must match as written, an integer
    truth needs an integer answer, and everything else is equal if sympy simplifies the difference to 0."""
    if given is None:
        return False
    if mathd_normalize(truth) == mathd_normalize(given):
        return True
    truth_n, given_n = normalize(truth), normalize(given)
    if truth_n is None:
        return False
    if truth_n == given_n:
        return True
    if not given_n:
        return False
    truth_elems, given_elems = _split_tuple(truth_n), _split_tuple(given_n)
    if len(truth_elems) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
        return False
    if len(truth_elems) != len(given_elems):
        return False
    correct = False  # an empty truth (no elements) is never matched
    for truth_elem, given_elem in zip(truth_elems, given_elems):
        if _is_frac(truth_elem) and _is_frac(given_elem):
            correct = truth_elem == given_elem  # unreduced fractions are not simplified into a match
        elif _str_is_int(truth_elem) != _str_is_int(given_elem):
            correct = False
        else:
            correct = _equal_under_sympy(truth_elem, given_elem)
        if not correct:
            break
    return correct


# -------------------------------------------------------------------- math_equal (ToRA / PRIME grader)

_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitXor: operator.xor,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_COMPARE = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


def _arith(node: ast.AST):
    """Evaluate a literal/arithmetic expression tree as Python would; ValueError for anything else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(right, int) and abs(right) > 10_000:
            raise ValueError("exponent too large to evaluate")
        return _ARITHMETIC[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_arith(node.operand))
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        values = [_arith(elt) for elt in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](values)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = _arith(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = _arith(comparator)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise ValueError(f"not arithmetic: {type(node).__name__}")


def _evaluate_arithmetic(text: str):
    """The value `eval(text)` would give for plain arithmetic; the text unchanged when it is anything else."""
    try:
        return _arith(ast.parse(text.strip(), mode="eval").body)
    except Exception:
        return text


def _as_number(value) -> tuple[bool, float | None]:
    try:
        text = str(value)
        return True, float(text.replace("{,}", "") if "{,}" in text else text.replace(",", ""))
    except ValueError:
        return False, None


def _replace_pi(text, pi: float):
    """`2\\pi` -> `2*pi`, `\\pi` -> `1*pi` (pi as a number), then evaluated if that is plain arithmetic."""
    if not (isinstance(text, str) and "\\pi" in text):
        return text
    at = text.find("\\pi")
    while at != -1:
        factor = "*" if at > 0 and text[at - 1].isdigit() else "1*"
        text = text[:at] + f"{factor}{pi}" + text[at + 3 :]
        at = text.find("\\pi", at + 1)
    return _evaluate_arithmetic(text)


def _math_equal_normalize(answer, pi: float):
    if isinstance(answer, str) and re.match(r"\$\d+(\.\d+)?", answer):
        return answer[1:]
    if isinstance(answer, str) and (re.match(r"^\d+(\.\d+)?%$", answer) or re.match(r"^\d+(\.\d+)?\\%$", answer)):
        return answer.replace("\\%", "").replace("%", "")
    if isinstance(answer, str) and "_" in answer:  # a base subscript: 101_2 -> 101 (raises on non-numbers)
        return int(float(answer.split("_")[0]))
    return _replace_pi(answer, pi)


def _interval_to_brackets(prediction: str) -> str:
    """sympy's `Interval(a, b)`, `Interval.Ropen(...)`, ... written as `[a, b]`, `[a, b)`, ... ."""
    for name, left, right in (("Interval", "[", "]"), ("Interval.Ropen", "[", ")"), ("Interval.Lopen", "(", "]")):
        m = re.match(rf"^{re.escape(name)}\((.*)\)$", prediction)
        if m:
            return f"{left}{m.group(1)}{right}"
    m = re.match(r"^Interval\.open\((.*)\)$", prediction)
    return f"({m.group(1)})" if m else prediction


def _parse_expr(text: str):
    """sympy's plain `parse_expr` (no `^` rewrite, no implicit multiplication: the PRIME grader's `symbolic_equal`)."""
    if "__" in text:  # parse_expr eval()s its input: never hand it dunder access from model text
        raise ValueError("refused: '__' in an expression")
    return sympy_parser.parse_expr(text)


def _parse_either(text: str, seconds: float):
    for parser in (_parse_expr, parse_latex):
        try:
            with cpu_budget(seconds):
                return parser(text)
        except Exception:
            pass
    return text


def _symbolic_equal(a: str, b: str, tolerance: float, seconds: float) -> bool:
    a, b = _parse_either(a, seconds), _parse_either(b, seconds)
    try:
        with cpu_budget(seconds):
            if sympy.simplify(a - b) == 0:
                return True
    except Exception:
        pass
    try:
        with cpu_budget(seconds):
            if math.isclose(sympy.N(a), sympy.N(b), rel_tol=tolerance):
                return True
    except Exception:
        pass
    return False


def _all_parts_equal(preds: list[str], refs: list[str], tolerance: float) -> bool:
    # every pair is compared (a list, not a generator): an error in any pair fails the whole answer, as theirs does
    return all([math_equal(p, r, tolerance=tolerance) for p, r in zip(preds, refs)])  # noqa: C419


def math_equal(prediction, reference, tolerance: float = 1e-4, seconds: float = 10.0, pi: float = math.pi) -> bool:
    """ToRA/PRIME `math_equal` (percentages included): equal as strings, as numbers within `tolerance` relative
    (also x/100 and x*100), element-wise for tuples/intervals/lists, or symbolically (sympy, then numerically).
    May raise on malformed input (a non-number before `_`); `math_reward` counts that as wrong."""
    prediction, reference = _math_equal_normalize(prediction, pi), _math_equal_normalize(reference, pi)
    if isinstance(prediction, str) and len(prediction) > 1000:
        prediction = prediction[:1000]
    if isinstance(prediction, str) and isinstance(reference, str):
        if prediction.strip().lower() == reference.strip().lower():
            return True
        if prediction.replace(" ", "") == reference.replace(" ", ""):
            return True
    try:
        pred_ok, pred_num = _as_number(prediction)
        ref_ok, ref_num = _as_number(reference)
        if pred_ok and ref_ok:
            return any(
                _close(item, pred_num, tolerance) for item in (ref_num / 100, ref_num, ref_num * 100)
            )  # overflow in ref_num * 100 is "not close", as in theirs
    except Exception:
        pass
    if not prediction and prediction not in [0, False]:
        return False
    reference, prediction = str(reference).strip(), _interval_to_brackets(str(prediction).strip())
    pred_str, ref_str = prediction, reference
    if (prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("(")) or (
        prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("[")
    ):
        pred_str, ref_str = pred_str.strip("[]()"), ref_str.strip("[]()")
    for brace in "{}()":
        ref_str, pred_str = ref_str.replace(brace, ""), pred_str.replace(brace, "")
    if pred_str == ref_str:
        return True
    if (
        prediction
        and reference
        and prediction[0] in "(["
        and prediction[-1] in ")]"
        and prediction[0] == reference[0]
        and prediction[-1] == reference[-1]
    ):
        preds, refs = prediction[1:-1].split(","), reference[1:-1].split(",")
        if len(preds) == len(refs) and _all_parts_equal(preds, refs, tolerance):
            return True
    if "," in prediction and "," in reference:
        preds, refs = [p.strip() for p in prediction.split(",")], [r.strip() for r in reference.split(",")]
        if len(preds) == len(refs):
            return _all_parts_equal(preds, refs, tolerance)
    if prediction.startswith("Point") and reference[0] == "(" and reference[-1] == ")":
        preds, refs = prediction[prediction.find("(") + 1 : -1].split(","), reference[1:-1].split(",")
        if len(preds) == len(refs) and _all_parts_equal(preds, refs, tolerance):
            return True
    return _symbolic_equal(prediction, reference, tolerance, seconds)


def _close(a: float, b: float, tolerance: float) -> bool:
    try:
        return math.isclose(a, b, rel_tol=tolerance)
    except Exception:
        return False


# --------------------------------------------------------------------------------------------- reward


_WARM: list[bool] = []


def _warm_up() -> None:
    """Load sympy's LaTeX parser (antlr) and pylatexenc once, outside any budget: their first use costs about half
    a CPU second, which would otherwise come out of the first answer's 1 s budget."""
    if not _WARM:
        try:
            parse_latex("1")
        except ImportError as err:  # without it every LaTeX parse would fail quietly and verdicts change
            raise ImportError(
                "the math grader needs sympy's LaTeX parser: pip install antlr4-python3-runtime==4.11.0"
            ) from err
        _latex_to_plain("\\frac{1}{2}")
        _WARM.append(True)


def is_correct(completion: str, ground_truth: str) -> bool:
    """Prime-RL `compute_score(...)[0]`: the extracted answer passes `grade_answer`, or `math_equal` (1 s CPU
    budgets; with `\\pi` in either side, pi taken as math.pi or as 3.14). Raises only where theirs does (an error
    inside `grade_answer`, e.g. none known on strings)."""
    _warm_up()
    answer = extract_answer(str(completion))
    ground_truth = str(ground_truth)
    if grade_answer(answer, ground_truth):
        return True
    try:
        if "\\pi" in answer or "\\pi" in ground_truth:
            budget = MATH_EQUAL_BUDGET_S
            return any([math_equal(answer, ground_truth, seconds=budget, pi=pi) for pi in (math.pi, 3.14)])  # noqa: C419
        return math_equal(answer, ground_truth, seconds=MATH_EQUAL_BUDGET_S)
    except Exception:
        return False


def math_reward(completion: str, ground_truth: str) -> float:
    """1.0 if `completion`'s final answer equals `ground_truth` by the Prime-RL rules, else 0.0."""
    return 1.0 if is_correct(completion, ground_truth) else 0.0


def _text(completion) -> str:
    """A TRL completion: a string (standard format) or a list of messages (conversational): the last message's text."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"] if completion else ""


def reward(completions: list, ground_truth: list[str], **kwargs) -> list[float]:
    """TRL reward function (`GRPOTrainer(reward_funcs=[reward])`): the dataset's `ground_truth` column is passed
    through by TRL as a keyword argument, one entry per completion."""
    if len(completions) != len(ground_truth):
        raise ValueError(f"reward: {len(completions)} completions but {len(ground_truth)} ground_truth entries")
    return [math_reward(_text(c), g) for c, g in zip(completions, ground_truth)]


def ground_truth_problem(truth: str) -> str | None:
    """What `reward` cannot read (`rewards.checked`): a GSM8K answer ("... #### 5") is a worked solution, which the
    grader would compare whole against the completion's final answer and never match."""
    if "####" in truth:
        return "a GSM8K worked answer ('... #### n'): the grader compares whole answers; use final_answer_reward"
    return None


reward.ground_truth_problem = ground_truth_problem
