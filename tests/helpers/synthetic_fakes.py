"""Test doubles for the synthetic GSM8K pipeline: an oracle that answers every prompt of the shipped seed problems
correctly (content-only, deterministic), a scripted backend that injects known-bad replies by round, and a minimal
OpenAI-compatible HTTP server on 127.0.0.1 that serves the oracle."""

import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from instella_recipes.synthetic_gsm8k.backends import Request
from instella_recipes.synthetic_gsm8k.parsing import format_number, substitute

ROOT = Path(__file__).resolve().parents[2]


def bwrap_problem() -> str | None:
    """Why bubblewrap cannot sandbox on this machine (missing, or namespaces not allowed), or None when it can.
    Probed with bwrap alone, so a bug in our sandbox code still fails the tests instead of skipping them."""
    import shutil
    import subprocess

    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (apt-get install -y bubblewrap)"
    probe = subprocess.run(
        [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {probe.stderr.strip()[:200]}"
    return None


BWRAP_PROBLEM = bwrap_problem()
SEEDS = ROOT / "recipes" / "synthetic_gsm8k" / "prompts" / "seeds_sample.jsonl"

# For each shipped seed: the masked question, the original values, a correct program and five new value sets.
TABLE = [
    {
        "masked": "Nora buys {packs} packs of pencils. Each pack has {per_pack} pencils. She gives {given} pencils to "
        "her brother. How many pencils does Nora have now?",
        "params": {"packs": 4, "per_pack": 12, "given": 9},
        "program": "def answer(packs, per_pack, given):\n    return packs * per_pack - given\n",
        "variants": [[5, 10, 7], [3, 20, 15], [6, 8, 12], [2, 24, 5], [7, 6, 30]],
    },
    {
        "masked": "A farmer has {chickens} chickens. Each chicken lays {eggs_per_day} eggs a day. How many eggs does "
        "the farmer collect in {days} days?",
        "params": {"chickens": 35, "eggs_per_day": 2, "days": 6},
        "program": "def answer(chickens, eggs_per_day, days):\n    return chickens * eggs_per_day * days\n",
        "variants": [[20, 1, 7], [12, 3, 5], [40, 2, 3], [25, 2, 4], [18, 1, 10]],
    },
    {
        "masked": "Leo saves ${weekly} every week. He wants to buy a bike that costs ${price}. How many weeks does he "
        "need to save?",
        "params": {"weekly": 15, "price": 240},
        "program": "def answer(weekly, price):\n    return math.ceil(price / weekly)\n",
        "variants": [[20, 300], [12, 180], [25, 400], [10, 130], [30, 450]],
    },
    {
        "masked": "A bus carries {start} passengers. At the first stop {off} people get off and {on} get on. How many "
        "passengers are on the bus now?",
        "params": {"start": 48, "off": 13, "on": 7},
        "program": "def answer(start, off, on):\n    return start - off + on\n",
        "variants": [[50, 20, 5], [30, 10, 12], [60, 25, 9], [40, 15, 3], [55, 30, 10]],
    },
    {
        "masked": "Mia bakes {trays} trays of cookies with {per_tray} cookies on each tray. She packs them into bags "
        "of {per_bag}. How many bags does she fill?",
        "params": {"trays": 3, "per_tray": 16, "per_bag": 8},
        "program": "def answer(trays, per_tray, per_bag):\n    return trays * per_tray / per_bag\n",
        "variants": [[4, 12, 6], [2, 15, 10], [5, 10, 5], [3, 14, 7], [6, 8, 4]],
    },
    {
        "masked": "A shop sells notebooks for ${price} each. Sam buys {count} notebooks and pays with a ${paid} bill. "
        "How much change does he get?",
        "params": {"price": 3, "count": 7, "paid": 50},
        "program": "def answer(price, count, paid):\n    return paid - price * count\n",
        "variants": [[4, 6, 50], [2, 9, 20], [5, 5, 100], [3, 8, 30], [6, 3, 20]],
    },
]


def compute(entry: dict, params: dict):
    import math

    namespace = {"math": math}
    exec(entry["program"], namespace)  # trusted: the test's own programs
    return namespace["answer"](**params)


def variant_sets(entry: dict) -> list[dict]:
    return [dict(zip(entry["params"], values)) for values in entry["variants"]]


def _template_regex(masked: str) -> re.Pattern:
    pattern = re.escape(masked)
    pattern = re.sub(r"\\\{(\w+)\\\}", lambda m: f"(?P<{m.group(1)}>-?[0-9.]+)", pattern)
    return re.compile(pattern)


class Oracle:
    """Correct replies to every prompt the pipeline sends about the shipped seeds. Chain-of-thought requests get
    `n` samples where every fourth one (index 3, 7, ...) has a wrong final number."""

    def __init__(self):
        self.questions = [json.loads(line)["question"] for line in SEEDS.read_text().splitlines() if line.strip()]
        self.regexes = [_template_regex(e["masked"]) for e in TABLE]

    def entry_for(self, text: str) -> int:
        for index, (question, entry) in enumerate(zip(self.questions, TABLE)):
            if question in text or entry["masked"] in text:
                return index
        raise KeyError(text[:200])

    def step(self, messages: list[dict]) -> str:
        if len(messages) > 1:
            return "cot"
        text = messages[-1]["content"]
        for key, step in (
            ("Replace every number", "abstract"),
            ("Write a Python function", "program"),
            ("Propose", "variants"),
            ("Rewrite the math word problem", "rewrite"),
        ):
            if key in text:
                return step
        raise KeyError(text[:200])

    def reply(self, messages: list[dict], n: int = 1, seed: int | None = None) -> list[str]:
        step = self.step(messages)
        text = messages[-1]["content"]
        if step == "cot":
            return self.cot(text, n, seed or 0)
        entry = TABLE[self.entry_for(text)]
        if step == "abstract":
            return [json.dumps({"question": entry["masked"], "parameters": entry["params"]})]
        if step == "program":
            return ["Here is the program:\n```python\n" + entry["program"] + "```\n"]
        if step == "variants":
            return ["```json\n" + json.dumps(variant_sets(entry)) + "\n```"]
        params = json.loads(text.split("New parameter values: ", 1)[1].split("\n", 1)[0])
        return [substitute(entry["masked"], params)]

    def answer_of(self, question: str):
        for entry, regex in zip(TABLE, self.regexes):
            match = regex.search(question)
            if match:
                return compute(entry, {k: float(v) if "." in v else int(v) for k, v in match.groupdict().items()})
        raise KeyError(question)

    def cot(self, text: str, n: int, seed: int) -> list[str]:
        question = text.split("Question: ", 1)[1].split("\nLet's think", 1)[0]
        value = float(self.answer_of(question))
        out = []
        for i in range(n):
            shown = value + 1 if i % 4 == 3 else value
            out.append(f"Working it out (draft {seed % 997}-{i}): the result is {format_number(shown)}. "
                       f"The answer is {format_number(shown)}.")  # fmt: skip
        return out


class ScriptedBackend:
    """The oracle, with known-bad replies injected per seed and per call of each step (see BAD)."""

    BAD = {
        # (seed index, step, call number) -> reply list
        (1, "abstract", 0): ["I am not able to abstract this problem."],
        (2, "program", 0): ["```python\ndef answer(weekly, price):\n    return price / weekly + 1\n```"],
        (2, "program", 1): ["```python\ndef answer(weekly, price):\n    return price / weekly + 1\n```"],
        (2, "program", 2): ["```python\ndef answer(weekly, price):\n    return price / weekly + 1\n```"],
        (3, "program", 0): ["```python\ndef answer(start, off, on):\n    while True:\n        pass\n```"],
        (3, "program", 1): ["```python\ndef answer(start, off, on):\n    raise ValueError('no')\n```"],
        (4, "variants", 0): [
            json.dumps(
                [
                    {"trays": 4, "per_tray": 12, "per_bag": 6},
                    {"trays": 3, "per_tray": 10, "per_bag": 4},  # 7.5 bags: variant_bad_answer
                    {"trays": 1, "per_tray": 5, "per_bag": 0},  # ZeroDivisionError: variant_exception
                    {"trays": 2},  # missing parameters: variant_invalid
                    {"trays": 5, "per_tray": 10, "per_bag": 5},
                ]
            )
        ],
        (5, "program", 0): [
            "```python\ndef answer(price, count, paid):\n    print('garbage ' * 50)\n    return 'x'\n```"
        ],
        (5, "program", 1): [
            "```python\ndef answer(price, count, paid):\n    print('thinking...')\n"
            "    return paid - price * count\n```"
        ],
        (5, "rewrite", 0): ["A shop sells notebooks for some dollars each."],  # values missing: rewrite_mismatch
    }

    def __init__(self):
        self.oracle = Oracle()
        self.calls: Counter = Counter()
        self.requests = 0

    def generate(self, requests: list[Request]) -> list[list[str]]:
        out = []
        for req in requests:
            self.requests += 1
            step = self.oracle.step(req.messages)
            if step == "cot":
                texts = self.oracle.reply(req.messages, req.n, req.seed)
                question = req.messages[-1]["content"]
                if "farmer" in question:  # seed 1: the third sample has no final answer
                    texts[2] = "Each chicken lays eggs, so there are many eggs in the end."
                out.append(texts)
                continue
            seed = self.oracle.entry_for(req.messages[-1]["content"])
            key = (seed, step, self.calls[(seed, step)])
            self.calls[(seed, step)] += 1
            out.append(self.BAD.get(key) or self.oracle.reply(req.messages, req.n, req.seed))
        return out


class _Handler(BaseHTTPRequestHandler):
    oracle: Oracle
    delay: float = 0.0
    max_n: int = 1 << 30
    log: list
    failures: list

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        time.sleep(self.delay)
        self.log.append(body)
        if self.failures:  # a flaky server: the first requests get 503
            self.failures.pop()
            self.send_error(503)
            return
        texts = self.oracle.reply(body["messages"], min(body.get("n", 1), self.max_n), body.get("seed"))
        payload = json.dumps(
            {
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
                    for i, t in enumerate(texts)
                ],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


class OracleServer:
    """A minimal OpenAI-compatible chat-completions server on 127.0.0.1 (ephemeral port), in a thread."""

    def __init__(self, delay: float = 0.0, max_n: int = 1 << 30, fail_first: int = 0, port: int = 0):
        """`max_n`: most choices per response (servers without `n` give 1); `fail_first`: 503 on that many;
        `port`: a fixed port (0: any free one)."""
        attrs = {"oracle": Oracle(), "delay": delay, "log": [], "max_n": max_n, "failures": [503] * fail_first}
        handler = type("Handler", (_Handler,), attrs)
        self.log = handler.log
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
