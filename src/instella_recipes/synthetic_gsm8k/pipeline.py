"""The published 4-step synthetic GSM8K method (SPEC.md 2), run in waves over chunks of seed problems.

Per seed problem:
1. abstract: the model replaces the question's numbers with named parameters (masked question + values);
2. program: the model writes `answer(<params>)`; it runs in the sandbox on the original values and is kept only if
   it reproduces the gold answer; otherwise steps 1-2 are retried, at most `max_program_rounds` rounds;
3. variants: the model proposes `num_variants` new parameter sets; the program (refused when it has an unbounded
   `while True` loop) computes each new answer; the question is rewritten with the new values;
4. solutions: 8-shot chain-of-thought samples ("The answer is N.") are kept when N equals the program's answer,
   until `target_per_seed` are kept or `max_cot_rounds` rounds are spent.

Each step of a chunk is one batched call to the backend (so a local model batches and an HTTP server sees
`max_concurrency` requests in flight) and one `run_many` on the sandbox pool. Every finished step is journaled per
seed (journal.py); the final dataset is assembled from the journals, so a resumed run gives the same dataset.

A request the backend could not serve (after its retries) is not a rejection: the seed's step is left undone and
unjournaled, the seed is set aside for the rest of this run (`Generator.deferred`, with the error's text), and the
next run asks the very same requests again.
"""

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from instella_recipes.sandbox import SandboxPool, program_hash, unbounded_loop

from .backends import Backend, Request, failure_text
from .journal import Journal
from .parsing import (
    Rejected,
    extract_code,
    fill,
    final_answer,
    format_number,
    load_prompt,
    numbers_equal,
    parse_abstraction,
    parse_variants,
    rewritten_ok,
    substitute,
)


@dataclass
class GeneratorArguments:
    """The knobs of the method that `Generator` reads (a subset of the recipe's `run.SyntheticGSM8KArguments`)."""

    max_program_rounds: int = 3
    num_variants: int = 5
    target_per_seed: int = 20
    cot_samples_per_request: int = 8
    max_cot_rounds: int = 4
    rewrite: str = "model"  # "model" (as published) or "template" (fill the masked question)
    natural_answers_only: bool = True  # variants whose answer is not a non-negative integer are dropped
    temperature: float = 0.7
    cot_temperature: float = 0.8
    max_tokens: int = 1024
    chunk_size: int = 64
    seed: int = 1234


@dataclass
class SeedState:
    seed_id: str
    question: str
    gold: float
    rounds: int = 0
    abstraction: dict | None = None
    program: dict | None = None
    variants: list | None = None
    solutions: dict = field(default_factory=dict)  # variant index (str) -> kept solution texts
    cot_rounds: int = 0
    status: str | None = None  # "solved" / "failed"
    rejections: Counter = field(default_factory=Counter)

    def kept(self) -> int:
        return sum(len(v) for v in self.solutions.values())


def request_seed(base: int, *parts) -> int:
    """A deterministic per-request sampling seed, so a redone step asks the backend the very same thing."""
    digest = hashlib.sha256(json.dumps([base, *parts]).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def replay(state: SeedState, events: list[dict]) -> SeedState:
    """Rebuild a seed's state from its journal."""
    for event in events:
        state.rejections.update(event.get("rejections", {}))
        kind = event["event"]
        if kind == "round":
            state.rounds = event["round"] + 1
            if event.get("program"):
                state.abstraction, state.program = event["abstraction"], event["program"]
        elif kind == "variants":
            state.variants = event["variants"]
        elif kind == "cot_round":
            state.cot_rounds = event["round"] + 1
            for key, texts in event["kept"].items():
                state.solutions.setdefault(key, []).extend(texts)
        elif kind == "done":
            state.status = event["status"]
    return state


class Generator:
    """Runs the 4 steps for a list of seed problems with one backend and one sandbox pool."""

    def __init__(self, backend: Backend, pool: SandboxPool, journal: Journal, settings: GeneratorArguments):
        self.backend, self.pool, self.journal, self.s = backend, pool, journal, settings
        self.deferred: dict[str, str] = {}  # seed_id -> the backend error that stopped it in this run
        self.prompts = {name: load_prompt(f"{name}.txt") for name in ("abstract", "program", "variants", "rewrite")}
        self.cot_user = load_prompt("cot_user.txt")
        shots = [json.loads(line) for line in load_prompt("cot_8shot.jsonl").splitlines() if line.strip()]
        self.cot_shots = []
        for shot in shots:
            self.cot_shots += [
                {"role": "user", "content": fill(self.cot_user, question=shot["question"]).strip()},
                {"role": "assistant", "content": shot["solution"]},
            ]

    # -- bookkeeping ------------------------------------------------------------------------------------------
    def _log(self, state: SeedState, event: dict, rejections: Counter | None = None) -> None:
        if rejections:
            event["rejections"] = dict(rejections)
            state.rejections.update(rejections)
        self.journal.append(state.seed_id, event)

    def _defer(self, state: SeedState, reply: list[str]) -> None:
        """Set a seed aside for this run after a backend failure; its step is neither applied nor journaled."""
        self.deferred.setdefault(state.seed_id, failure_text(reply))

    def _active(self, states: list[SeedState]) -> list[SeedState]:
        return [s for s in states if s.status is None and s.seed_id not in self.deferred]

    def _finish(self, state: SeedState, status: str) -> None:
        state.status = status
        self._log(state, {"event": "done", "status": status})

    def _settle(self, state: SeedState) -> None:
        """Record the final status once the state says the seed is finished. Decided from the state alone, so a
        resumed run settles a seed exactly where an uninterrupted one did."""
        if state.status is not None:
            return
        if state.program is None:
            if state.rounds >= self.s.max_program_rounds:
                self._finish(state, "failed")
        elif state.variants is not None:
            if not state.variants:
                self._finish(state, "failed")
            elif state.kept() >= self.s.target_per_seed or state.cot_rounds >= self.s.max_cot_rounds:
                self._finish(state, "solved" if state.kept() else "failed")

    def _ask(self, prompt: str, state: SeedState, step: str, n: int = 1, temperature: float | None = None) -> Request:
        return Request(
            messages=[{"role": "user", "content": prompt}],
            n=n,
            temperature=self.s.temperature if temperature is None else temperature,
            max_tokens=self.s.max_tokens,
            seed=request_seed(self.s.seed, state.seed_id, step, state.rounds, state.cot_rounds),
        )

    # -- driver -----------------------------------------------------------------------------------------------
    def run(self, states: list[SeedState], progress: tqdm | None = None) -> None:
        """Advance every seed of `states` to a final status, one chunk at a time."""
        for start in range(0, len(states), self.s.chunk_size):
            chunk = self._active(states[start : start + self.s.chunk_size])
            for state in chunk:  # a run killed between a step's record and its "done" record
                self._settle(state)
            chunk = self._active(chunk)
            while chunk:
                need_program = [s for s in chunk if s.program is None]
                need_variants = [s for s in chunk if s.program is not None and s.variants is None]
                need_cot = [s for s in chunk if s.variants is not None]
                if need_program:
                    self.program_round(need_program)
                if need_variants:
                    self.variants_step(need_variants)
                if need_cot:
                    self.cot_round(need_cot)
                for state in chunk:
                    if state.status is not None and progress is not None:
                        progress.update(1)
                chunk = self._active(chunk)
                if progress is not None:
                    progress.set_postfix(kept=sum(x.kept() for x in states), refresh=False)

    # -- steps 1 + 2 ------------------------------------------------------------------------------------------
    def program_round(self, states: list[SeedState]) -> None:
        replies = self.backend.generate(
            [self._ask(fill(self.prompts["abstract"], question=s.question), s, "abstract") for s in states]
        )
        rejections = {s.seed_id: Counter() for s in states}
        parsed = {}
        for state, reply in zip(states, replies):
            if not reply:
                self._defer(state, reply)
                continue
            try:
                parsed[state.seed_id] = parse_abstraction(reply[0])
            except Rejected as err:
                rejections[state.seed_id][err.reason] += 1
        with_abstraction = [s for s in states if s.seed_id in parsed]
        program_requests = []
        for state in with_abstraction:
            masked, params = parsed[state.seed_id]
            prompt = fill(
                self.prompts["program"],
                masked_question=masked,
                parameters=json.dumps(params),
                signature=", ".join(params),
            )
            program_requests.append(self._ask(prompt, state, "program"))
        replies = self.backend.generate(program_requests) if program_requests else []
        sources, jobs = {}, []
        for state, reply in zip(with_abstraction, replies):
            if not reply:
                self._defer(state, reply)
                continue
            try:
                source = extract_code(reply[0])
                if unbounded_loop(source):
                    raise Rejected("program_unbounded_loop", "while True")
                sources[state.seed_id] = source
                jobs.append((source, [parsed[state.seed_id][1]]))
            except Rejected as err:
                rejections[state.seed_id][err.reason] += 1
        ran = [s.seed_id for s in with_abstraction if s.seed_id in sources]
        reports = dict(zip(ran, self.pool.run_many(jobs)))
        for state in self._active(states):
            verified = None
            report = reports.get(state.seed_id)
            if report is not None:
                result = report.results[0]
                if not result.ok:
                    rejections[state.seed_id][f"program_{result.reason}"] += 1
                elif not numbers_equal(result.value, state.gold):
                    rejections[state.seed_id]["program_wrong_answer"] += 1
                else:
                    source = sources[state.seed_id]
                    masked, params = parsed[state.seed_id]
                    verified = {"source": source, "hash": program_hash(source)}
                    abstraction = {"masked": masked, "params": params}
            event = {"event": "round", "round": state.rounds}
            if verified:
                event.update(program=verified, abstraction=abstraction)
                state.program, state.abstraction = verified, abstraction
            state.rounds += 1
            self._log(state, event, rejections[state.seed_id])
            self._settle(state)

    # -- step 3 -----------------------------------------------------------------------------------------------
    def variants_step(self, states: list[SeedState]) -> None:
        requests = []
        for state in states:
            prompt = fill(
                self.prompts["variants"],
                masked_question=state.abstraction["masked"],
                parameters=json.dumps(state.abstraction["params"]),
                num_variants=self.s.num_variants,
            )
            requests.append(self._ask(prompt, state, "variants"))
        replies = self.backend.generate(requests)
        rejections = {s.seed_id: Counter() for s in states}
        candidates, jobs = {}, []
        for state, reply in zip(states, replies):
            if not reply:
                self._defer(state, reply)
                continue
            try:
                params = state.abstraction["params"]
                valid, invalid = parse_variants(reply[0], set(params), params)
                if invalid:
                    rejections[state.seed_id]["variant_invalid"] += invalid
                valid = valid[: self.s.num_variants]
                if valid:
                    candidates[state.seed_id] = valid
                    jobs.append((state.program["source"], valid))
            except Rejected as err:
                rejections[state.seed_id][err.reason] += 1
        ran = [s for s in states if s.seed_id in candidates]
        answered = {}
        for state, report in zip(ran, self.pool.run_many(jobs)):
            keep = []
            for params, result in zip(candidates[state.seed_id], report.results):
                if not result.ok:
                    rejections[state.seed_id][f"variant_{result.reason}"] += 1
                elif self.s.natural_answers_only and not (
                    float(result.value).is_integer() and result.value >= 0 and math.isfinite(result.value)
                ):
                    rejections[state.seed_id]["variant_bad_answer"] += 1
                else:
                    keep.append({"params": params, "answer": result.value})
            answered[state.seed_id] = keep
        self._rewrite(ran, answered, rejections)
        for state in self._active(states):
            variants = answered.get(state.seed_id, [])
            state.variants = variants
            self._log(state, {"event": "variants", "variants": variants}, rejections[state.seed_id])
            self._settle(state)

    def _rewrite(self, states: list[SeedState], answered: dict, rejections: dict) -> None:
        """Fill in each variant's question (in place); variants whose rewrite fails are dropped."""
        if self.s.rewrite == "template":
            for state in states:
                for variant in answered[state.seed_id]:
                    variant["question"] = substitute(state.abstraction["masked"], variant["params"])
            return
        owners, requests = [], []
        for state in states:
            for index, variant in enumerate(answered[state.seed_id]):
                prompt = fill(
                    self.prompts["rewrite"],
                    masked_question=state.abstraction["masked"],
                    parameters=json.dumps(variant["params"]),
                )
                owners.append((state, variant))
                requests.append(self._ask(prompt, state, f"rewrite-{index}", temperature=0.0))
        replies = self.backend.generate(requests) if requests else []
        for (state, variant), reply in zip(owners, replies):
            if not reply:
                self._defer(state, reply)
                continue
            text = reply[0].strip()
            if rewritten_ok(text, variant["params"]):
                variant["question"] = text
            else:
                rejections[state.seed_id]["rewrite_mismatch"] += 1
        for state in states:
            answered[state.seed_id] = [v for v in answered[state.seed_id] if "question" in v]

    def _quota(self, state: SeedState, index: int) -> int:
        """Kept solutions wanted for one variant: the seed's target split as evenly as possible."""
        share, extra = divmod(self.s.target_per_seed, len(state.variants))
        return share + (index < extra)

    # -- step 4 -----------------------------------------------------------------------------------------------
    def cot_round(self, states: list[SeedState]) -> None:
        owners, requests = [], []
        for state in states:
            for index, variant in enumerate(state.variants):
                missing = self._quota(state, index) - len(state.solutions.get(str(index), []))
                if missing <= 0:
                    continue
                user = {"role": "user", "content": fill(self.cot_user, question=variant["question"]).strip()}
                request = self._ask("", state, f"cot-{index}", n=self.s.cot_samples_per_request)
                request.messages = self.cot_shots + [user]
                request.temperature = self.s.cot_temperature
                owners.append((state, index))
                requests.append(request)
        replies = self.backend.generate(requests) if requests else []
        for (state, _index), texts in zip(owners, replies):
            if not texts:  # the whole round of that seed is redone next run
                self._defer(state, texts)
        rejections = {s.seed_id: Counter() for s in states}
        kept: dict[str, dict[str, list[str]]] = {s.seed_id: {} for s in states}
        for (state, index), texts in zip(owners, replies):
            if state.seed_id in self.deferred:
                continue
            quota = self._quota(state, index)
            have = state.solutions.setdefault(str(index), [])
            new = kept[state.seed_id].setdefault(str(index), [])
            for text in texts:
                text = text.strip()
                value = final_answer(text)
                if value is None:
                    rejections[state.seed_id]["solution_no_answer"] += 1
                elif not numbers_equal(value, state.variants[index]["answer"]):
                    rejections[state.seed_id]["solution_wrong_answer"] += 1
                elif text in have or text in new:
                    rejections[state.seed_id]["solution_duplicate"] += 1
                elif len(have) + len(new) < quota:
                    new.append(text)
            have.extend(new)
        for state in self._active(states):
            self._log(state, {"event": "cot_round", "round": state.cot_rounds, "kept": kept[state.seed_id]},
                      rejections[state.seed_id])  # fmt: skip
            state.cot_rounds += 1
            self._settle(state)


def samples(state: SeedState) -> list[dict]:
    """A finished seed's kept samples in the published `messages` format, with provenance."""
    out = []
    for key in sorted(state.solutions, key=int):
        variant = state.variants[int(key)]
        for text in state.solutions[key]:
            out.append(
                {
                    "messages": [
                        {"role": "user", "content": variant["question"]},
                        {"role": "assistant", "content": text},
                    ],
                    "seed_id": state.seed_id,
                    "variant": int(key),
                    "parameters": json.dumps(variant["params"], sort_keys=True),
                    "answer": format_number(variant["answer"]),
                    "program_sha256": state.program["hash"],
                }
            )
    return out
