"""The math reward gives the authors' Prime-RL verdicts (`prime_math.compute_score(...)[0]`, their VERL copy at
AMD-AIG-AIMA/Instella-Math 65534d3, copied test-only into tests/helpers/prime_math_oracle/) on handmade answers and
on completions built around 100 real ground truths from the authors' evaluation sets; and the TRL signature."""

import json
import threading
from pathlib import Path

import pytest

from instella_recipes.rewards import math_grader, math_reward, reward

GOLDS = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "instella_math_golds.json").read_text())

# (completion, ground truth): boxed nesting, fractions, units, percentages, intervals, tuples, pi, bases, text.
HANDMADE = [
    ("so the answer is \\boxed{5}.", "5"),
    ("\\boxed{\\frac{1}{2}}", "\\frac12"),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{1/2}", "\\frac{1}{2}"),
    ("\\boxed{2/4}", "\\frac{1}{2}"),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}"),
    ("\\boxed{\\tfrac{3}{4}}", "0.75"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}"),
    ("\\boxed{10\\%}", "10"),
    ("\\boxed{10\\%}", "0.1"),
    ("\\boxed{10%}", "10\\%"),
    ("\\boxed{25\\%}", "25"),
    ("\\boxed{0.25}", "25\\%"),
    ("\\boxed{5 \\text{ cm}}", "5"),
    ("\\boxed{5\\text{ cm}^2}", "5"),
    ("\\boxed{12 \\text{ inches}}", "12"),
    ("\\boxed{3 meters}", "3"),
    ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{90^{\\circ}}", "90"),
    ("\\boxed{90 degrees}", "90"),
    ("\\boxed{\\$18}", "18"),
    ("\\boxed{$18.00}", "18"),
    ("\\boxed{\\text{(A)}}", "A"),
    ("\\boxed{A}", "A"),
    ("\\boxed{B}", "A"),
    ("\\boxed{\\textbf{(C)}}", "C"),
    ("\\boxed{(0, 1)}", "(0,1)"),
    ("\\boxed{[0, 1)}", "[0,1)"),
    ("\\boxed{(0, 1]}", "[0,1)"),
    ("\\boxed{[-2, 3]}", "[-2,3]"),
    ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]"),
    ("\\boxed{(-\\infty, 3)}", "(-\\infty,3]"),
    ("\\boxed{(-\\infty,-2)\\cup(3,\\infty)}", "(-\\infty, -2) \\cup (3, \\infty)"),
    ("\\boxed{(1,2)\\cup(3,4)}", "(1,2)\\cup(3,5)"),
    ("\\boxed{(3, -4)}", "(3,-4)"),
    ("\\boxed{(3, 4)}", "(3,-4)"),
    ("\\boxed{3, 4}", "3,4"),
    ("\\boxed{4, 3}", "3,4"),
    ("\\boxed{x = 3}", "3"),
    ("\\boxed{k=7}", "7"),
    ("\\boxed{x=1 \\text{ or } x=2}", "1,2"),
    ("\\boxed{1 \\text{ and } 2}", "1, 2"),
    ("\\boxed{\\boxed{7}}", "7"),
    ("\\boxed{\\frac{\\boxed{3}}{4}}", "3"),
    ("First \\boxed{3}, then \\boxed{4}", "4"),
    ("First \\boxed{3}, then \\boxed{4}", "3"),
    ("\\boxed{{5}}", "5"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
    ("\\boxed{5", "5"),
    ("\\fbox{6}", "6"),
    ("\\boxed 5", "5"),
    ("The answer is 42.", "42"),
    ("The answer is: 42", "42"),
    ("Therefore the final answer is $42$.", "42"),
    ("42 is the answer.", "42"),
    ("We get x = 17", "17"),
    ("so x is 17. Done", "17"),
    ("no number here", "7"),
    ("", "0"),
    ("\\boxed{}", "0"),
    ("\\boxed{2\\pi}", "2\\pi"),
    ("\\boxed{6.28}", "2\\pi"),
    ("\\boxed{6.2832}", "2\\pi"),
    ("\\boxed{\\pi/2}", "\\frac{\\pi}{2}"),
    ("\\boxed{\\frac{\\pi}{2}}", "\\frac{\\pi}{2}"),
    ("\\boxed{1.5708}", "\\frac{\\pi}{2}"),
    ("\\boxed{3\\pi}", "9.42"),
    ("\\boxed{101_2}", "5"),
    ("\\boxed{101_2}", "101"),
    ("\\boxed{2516_8}", "2516_8"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{1{,}000}", "1000"),
    ("\\boxed{1,000,000}", "1000000"),
    ("\\boxed{1000000}", "1 million"),
    ("\\boxed{3.0}", "3"),
    ("\\boxed{3.00001}", "3"),
    ("\\boxed{2.99999}", "3"),
    ("\\boxed{0.3333}", "\\frac{1}{3}"),
    ("\\boxed{0.33333}", "\\frac{1}{3}"),
    ("\\boxed{1.39 \\times 10^9}", "1.39 \\times 10^9"),
    ("\\boxed{1.39e9}", "1.39 \\times 10^9"),
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{x^{2}+2x+1}", "(x+1)^{2}"),
    ("\\boxed{2x+1}", "1+2x"),
    ("\\boxed{a+b+c+d}", "d+c+b+a"),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}"),
    ("\\boxed{2\\sqrt2}", "2\\sqrt{2}"),
    ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}"),
    ("\\boxed{3+4i}", "3+4i"),
    ("\\boxed{4i+3}", "3+4i"),
    ("\\boxed{-5}", "-5"),
    ("\\boxed{- 5}", "-5"),
    ("\\boxed{5}", "-5"),
    ("\\boxed{7 \\frac{3}{4}}", "\\frac{31}{4}"),
    ("\\boxed{7 3/4}", "7.75"),
    ("\\boxed{\\left(3, \\frac{\\pi}{2}\\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\boxed{\\text{Monday}}", "\\text{Monday}"),
    ("\\boxed{monday}", "Monday"),
    ("\\boxed{\\text{yes}}", "yes"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("\\boxed{y = 2x + 3}", "y=2x+3"),
    ("\\boxed{2x+3}", "y=2x+3"),
    ("\\boxed{\\infty}", "\\infty"),
    ("\\boxed{10^{10}}", "10000000000"),
    ("\\boxed{2^{10}}", "1024"),
    ("\\boxed{2^10}", "1024"),
    ("\\boxed{e^{i\\pi}}", "-1"),
    ("\\boxed{\\ln 2}", "\\log 2"),
    ("\\boxed{\\binom{5}{2}}", "10"),
    ("\\boxed{5!}", "120"),
    ("\\boxed{\\$1.5 \\text{ million}}", "1500000"),
    ("The answer is \\boxed{12}. Thus 12 is right. Step 2: done", "12"),
    ("Step 1: x\nStep 2: \\boxed{8}", "8"),
    ("\\boxed{8} is the answer", "8"),
    ("answer: 9. So we're done", "9"),
    ("\\boxed{f(n) = 2n+1007}", "$f(n) = 2 n+1007$"),
    ("\\boxed{2n+1007}", "$f(n) = 2 n+1007$"),
    ("\\boxed{\\frac{9}{2}}", "$\\frac{9}{2}$"),
    ("\\boxed{4^\\circ}", "$4^{\\circ}$"),
    ("\\boxed{2^k}", "$2^{k}$"),
    ("\\boxed{\\frac{k(4k^2+k-1)}{2}}", "$k\\left(4 k^{2}+k-1\\right) / 2$"),
    ("\\boxed{\\frac{1}{2n+2}}", "$\\frac{1}{2 n+2}$"),
    ("\\boxed{9.6}", "9.6\n"),
    ("\\boxed{9.60}", "9.6\n"),
    ("\\boxed{4.4 \\times 10^7}", "4.4e7\n"),
    ("\\boxed{-\\tau\\ln\\Delta}", "-\\tau \\ln \\Delta\n"),
    ("\\boxed{142}", "142.0"),
    ("\\boxed{142.0}", "142"),
    ("\\boxed{x__import__}", "1"),
    ("\\boxed{__import__('os').getcwd()}", "1"),
    ("\\boxed{1e400}", "1e400"),
    ("\\boxed{inf}", "\\infty"),
    ("\\boxed{nan}", "nan"),
    ("\\boxed{3_}", "3"),
    ("\\boxed{a_1}", "a_1"),
    ("\\boxed{\\frac}", "1"),
    ("\\boxed{\\sqrt}", "1"),
    ("\\boxed{\\text{ cm}\\text{ m}}", "1"),
    ("\\boxed{Interval(0, 1)}", "[0,1]"),
    ("\\boxed{Point(1, 2)}", "(1,2)"),
    ("\\boxed{\\pi}", "3.14"),
    ("\\boxed{\\pi}", "3.1416"),
    ("\\boxed{2\\pi, 3}", "6.283, 3"),
]


def _completions(gold: str) -> list[tuple[str, str]]:
    """Real-format completions around one real ground truth: right, wrong, unboxed."""
    g = gold.strip()
    return [
        (f"Let's compute. ... Therefore the final answer is \\boxed{{{g}}}.", gold),
        (f"Step 2: we get \\boxed{{{g}1}}", gold),
        (f"The answer is {g}", gold),
        ("So the result is \\boxed{7}.", gold),
    ]


CASES = HANDMADE + [case for row in GOLDS for case in _completions(row["ground_truth"])]


def test_there_are_at_least_200_cases_with_both_verdicts():
    assert len(CASES) >= 200
    verdicts = [math_reward(c, g) for c, g in CASES[:40]]
    assert 0.0 in verdicts and 1.0 in verdicts


def test_trl_reward_signature_plain_and_conversational():
    completions = ["\\boxed{4}", [{"role": "assistant", "content": "so \\boxed{\\frac{1}{2}}"}], "\\boxed{3}"]
    assert reward(completions, ground_truth=["4", "0.5", "5"], prompts=["a", "b", "c"]) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="2 completions but 1 ground_truth"):
        reward(["a", "b"], ground_truth=["1"])


def test_model_text_is_never_evaluated_as_python(tmp_path):
    marker = tmp_path / "pwned"
    evil = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    assert math_reward(f"\\boxed{{{evil}}}", "1") == 0.0
    assert math_reward(f"\\boxed{{\\pi + {evil}}}", "\\pi") == 0.0
    assert not marker.exists()


def test_a_step_over_its_cpu_budget_counts_as_not_equal(monkeypatch):
    def spin(expr):
        while True:
            pass

    monkeypatch.setattr(math_grader, "_sympy_parse", spin)
    monkeypatch.setattr(math_grader, "SYMPY_CHECK_BUDGET_S", 0.2)
    # "x+1" vs "1+x": no string rule matches, so the verdict rests on the sympy step, which never finishes
    assert math_grader._equal_under_sympy("x+1", "1+x") is False
    with math_grader.cpu_budget(0.05):
        pass  # budgets nest with nothing left armed afterwards


def test_off_the_main_thread_the_check_still_grades():
    results = []
    worker = threading.Thread(target=lambda: results.append(math_reward("\\boxed{x^2+2x+1}", "(x+1)^2")))
    worker.start()
    worker.join()
    assert results == [1.0]
