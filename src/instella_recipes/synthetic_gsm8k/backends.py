"""Generation backends behind one small interface: `generate(requests) -> replies` (one list of strings per
request). A request the backend could not serve gets a `Failed` reply: an empty list (so `if not reply` holds)
that carries the error's text; the pipeline leaves that seed's step undone, so the next run retries it.

- `OpenAIBackend`: any OpenAI-compatible chat-completions server (vLLM, SGLang, `transformers serve`, hosted APIs)
  through the `openai` client (its retries with exponential backoff on connection errors, timeouts, 408/409/429 and
  5xx; its per-request timeout), with a concurrency limit.
- `TransformersBackend`: a local model through `model.generate`, batched (left padding, chat template). This
  project's own checkpoints (Instella folders with an `auto_map`) load with the installed `modeling_instella`, with
  no remote-code question; any other model with its own code needs `trust_remote_code: true` in the recipe.
"""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Request:
    """One chat prompt and how many samples to draw for it. `seed` makes sampling reproducible where the backend
    supports it (vLLM and OpenAI honour it), which is what lets a resumed run redo an interrupted step exactly."""

    messages: list[dict]
    n: int = 1
    temperature: float = 0.7
    max_tokens: int = 1024
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


class Failed(list):
    """The reply to a request the backend could not serve (after its retries): empty, with the error's text."""

    def __init__(self, error: str):
        super().__init__()
        self.error = error


def failure_text(reply: list[str]) -> str:
    """The error a failed reply carries (a backend that signals failure with a bare `[]` gives 'no reply')."""
    return getattr(reply, "error", "no reply")


class Backend(Protocol):
    def generate(self, requests: list[Request]) -> list[list[str]]: ...


class OpenAIBackend:
    """Chat completions through the `openai` client. `max_concurrency` requests in flight at once; `max_retries`
    and `timeout` are the client's own (retries with exponential backoff); servers that return fewer than `n`
    choices are asked again for the rest."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        max_concurrency: int = 16,
        timeout: float = 600.0,
        max_retries: int = 3,
    ):
        import openai  # imported here: only this backend needs it

        self.openai = openai
        # Local servers (vLLM, SGLang) take any key; the client refuses to start without one.
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "EMPTY", max_retries=max_retries, timeout=timeout
        )
        self.base_url = base_url
        self.model = model
        self.max_concurrency = max_concurrency

    def _one(self, req: Request) -> list[str]:
        replies: list[str] = []
        for _attempt in range(max(1, req.n)):  # top up when the server returns fewer choices than asked (no `n`)
            extra = {"seed": req.seed + len(replies)} if req.seed is not None else {}
            if req.stop:
                extra["stop"] = req.stop
            try:
                completion = self.client.chat.completions.create(
                    model=self.model,
                    messages=req.messages,
                    n=req.n - len(replies),
                    temperature=req.temperature,
                    max_tokens=req.max_tokens,
                    **extra,
                )
            except self.openai.OpenAIError as err:  # after the client's own retries
                where = f" ({self.base_url})" if isinstance(err, self.openai.APIConnectionError) else ""
                return Failed(f"{type(err).__name__}: {err}{where}")
            except json.JSONDecodeError as err:  # a body labelled JSON that is not (an HTML error page, ...)
                return Failed(_not_a_completion(self.client.base_url, err.doc))
            if not hasattr(completion, "choices"):  # the client hands back the body of a non-JSON answer as text
                return Failed(_not_a_completion(self.client.base_url, completion))
            replies += [choice.message.content or "" for choice in completion.choices or []]
            if len(replies) >= req.n:
                break
        return replies[: req.n]

    def generate(self, requests: list[Request]) -> list[list[str]]:
        with ThreadPoolExecutor(max_workers=max(1, self.max_concurrency)) as pool:
            return list(pool.map(self._one, requests))


def _not_a_completion(base_url, body) -> str:
    """The error of a server that answered a chat-completions request with something else (an HTML page: a proxy,
    a login portal, the wrong port), naming the URL and the start of what came back."""
    text = " ".join(str(body).split())
    kind = "HTML" if text.lstrip().lower().startswith(("<!doctype html", "<html")) else "not JSON"
    return (
        f"the server at {base_url} answered a chat-completions request with {kind} ({text[:60]!r}), not an OpenAI "
        f"chat completion: check base_url (the OpenAI-compatible endpoint, usually ending in /v1)"
    )


class TransformersBackend:
    """A local `AutoModelForCausalLM` with its chat template; prompts are generated `batch_size` at a time."""

    def __init__(
        self,
        model_name_or_path: str,
        batch_size: int = 8,
        dtype: str = "auto",
        device: str | None = None,
        trust_remote_code: bool = False,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        import modeling_instella  # noqa: F401  (registers "instella": our folders load with this class, no question)

        self.torch = torch
        # An explicit bool, never transformers' None (which asks on stdin and fails without a terminal).
        trust = {"trust_remote_code": bool(trust_remote_code)}
        self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, padding_side="left", **trust)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_name_or_path, dtype=dtype, **trust).to(device).eval()
        self.batch_size = batch_size

    def generate(self, requests: list[Request]) -> list[list[str]]:
        out: list[list[str]] = []
        # Group requests with the same sampling settings so each batch is one `generate` call.
        for start in range(0, len(requests), self.batch_size):
            batch = requests[start : start + self.batch_size]
            groups: dict[tuple, list[int]] = {}
            for i, req in enumerate(batch):
                groups.setdefault((req.n, req.temperature, req.max_tokens), []).append(i)
            replies: list[list[str]] = [[] for _ in batch]
            for (n, temperature, max_tokens), members in groups.items():
                texts = self._generate([batch[i] for i in members], n, temperature, max_tokens)
                for i, member_texts in zip(members, texts):
                    replies[i] = member_texts
            out += replies
        return out

    def _prompt(self, messages: list[dict]) -> str:
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # A base model without a chat template: plain role-tagged turns.
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"

    def _generate(self, reqs: list[Request], n: int, temperature: float, max_tokens: int) -> list[list[str]]:
        prompts = [self._prompt(r.messages) for r in reqs]
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            self.model.device
        )
        if reqs[0].seed is not None:
            self.torch.manual_seed(reqs[0].seed)
        greedy = temperature <= 0  # greedy decoding gives one answer; n copies of it are what was asked
        sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": temperature}
        per_prompt = 1 if greedy else n
        with self.torch.no_grad():
            ids = self.model.generate(
                **enc,
                max_new_tokens=max_tokens,
                num_return_sequences=per_prompt,
                pad_token_id=self.tokenizer.pad_token_id,
                **sampling,
            )
        texts = self.tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        return [texts[i * per_prompt : (i + 1) * per_prompt] * (n // per_prompt) for i in range(len(reqs))]


def make_backend(kind: str, model: str, base_url: str, api_key_env: str, max_concurrency: int, batch_size: int,
                 timeout: float, max_retries: int, trust_remote_code: bool = False) -> Backend:  # fmt: skip
    """The backend a recipe names (`openai` or `transformers`)."""
    if kind == "openai":
        key = os.environ.get(api_key_env) if api_key_env else None
        return OpenAIBackend(base_url, model, key, max_concurrency, timeout, max_retries)
    if kind == "transformers":
        return TransformersBackend(model, batch_size=batch_size, trust_remote_code=trust_remote_code)
    raise ValueError(f"backend must be 'openai' or 'transformers', got {kind!r}")
