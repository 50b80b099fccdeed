"""`OlmesTask`: an lm-eval task that asks, renders and scores a benchmark the way OLMES does.

A task YAML selects it with `class: !function olmes_task.OlmesTask` (this file, next to the YAMLs: lm-eval alone
loads it, our package need not be installed) and carries the
OLMES setting under `metadata.olmes` (written by `scripts/make_eval_tasks.py` from `olmes_settings.py`):

    kind: mc | mc2 | generate      # scored choices, TruthfulQA's MC1/MC2, or a generation
    limit, seed                    # more docs than `limit`: OLMES's seeded sample of `limit` of them
    description, final_description # text before the first question / after each question
    unconditioned_prompt           # context of the second request per choice, for acc_uncond
    chat: {required, multiturn, assistant_prefix}  # the chat layout (instruct table), or absent (base models)
    scorer, subtask                # how a generation is scored (olmes.gsm8k_answer, bbh_answer, ...)

Why a subclass and not plain YAML: lm-eval cannot express four OLMES rules. acc_uncond's second request uses the
prompt "Answer:" (lm-eval's `acc_mutual_info` uses an empty context); acc_per_token divides by the continuation's
token count, which lm-eval's results do not carry (we count it with the model's tokenizer, as HFLM splits the pair);
OLMES puts the task description in the first user message (lm-eval makes it a system message); and OLMES samples
1,000 docs with a seed instead of taking the first N. Everything else (datasets, few-shot sampling, requests to the
model, batching, aggregation, group averages) is lm-eval's.
"""

import importlib.util
import sys
from copy import deepcopy
from functools import cache
from pathlib import Path

from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_aggregation
from lm_eval.api.task import ConfigurableTask


def load_sibling(name: str, folder: Path | None = None):
    """The task module `<folder>/<name>.py` (default: this file's folder), loaded once per process under the name
    lm-eval's YAML loader gives it (its path without ".py"): the YAMLs, this file and the library share one module."""
    path = ((folder or Path(__file__).resolve().parent) / f"{name}.py").resolve()
    key = str(path.with_suffix(""))
    module = sys.modules.get(key)
    if module is None or getattr(module, "__mtime__", None) != path.stat().st_mtime_ns:
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        module.__mtime__ = path.stat().st_mtime_ns  # lm-eval's loader reuses a module whose __mtime__ matches
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return module


olmes = load_sibling("olmes")  # the rendering and scoring functions (olmes.py beside this file)


@cache
def _tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, trust_remote_code=True)


def continuation_token_counts(tokenizer, pairs: list[tuple[str, str]]) -> list[int]:
    """How many tokens HFLM scores for each (context, continuation): trailing whitespace of the context moves to the
    continuation, the pair is encoded whole, and the context's own tokens are cut off (lm-eval `_encode_pair`, which
    OLMES's model wrapper inherits)."""
    counts = []
    for context, continuation in pairs:
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        counts.append(len(tokenizer.encode(context + continuation)) - len(tokenizer.encode(context)))
    return counts


class OlmesTask(ConfigurableTask):
    """A ConfigurableTask whose documents, prompts, requests and per-doc scores follow `metadata.olmes`."""

    def __init__(self, config: dict | None = None, **kwargs):
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        self.olmes = dict((config.get("metadata") or {}).get("olmes") or {})
        if "kind" not in self.olmes:
            raise ValueError(f"task {config.get('task')}: an OlmesTask needs metadata.olmes.kind (mc, mc2, generate)")
        metric_list = config.pop("metric_list", None) or []
        self._eval_docs = None
        super().__init__(config=config, **kwargs)
        # Our metrics are computed in process_results, so lm-eval must not look them up in its registry.
        self.config.metric_list = metric_list
        # private: ConfigurableTask keeps its metric tables in these attributes, no public setter [test_private_apis]
        names = [m["metric"] for m in metric_list]
        self._metric_fn_list = dict.fromkeys(names)
        self._metric_fn_kwargs = {name: {} for name in names}
        self._aggregation_list = {name: get_aggregation("mean") for name in names}
        self._higher_is_better = {m["metric"]: m.get("higher_is_better", True) for m in metric_list}

    # --- documents ---------------------------------------------------------------------------------------------------
    @property
    def eval_docs(self):
        """The split's docs, or OLMES's seeded sample of `limit` of them (cached: lm-eval reads this often)."""
        if self._eval_docs is None:
            docs = super().eval_docs
            positions = olmes.sample_positions(len(docs), self.olmes.get("limit"), self.olmes.get("seed"))
            self._eval_docs = docs if len(positions) == len(docs) else docs.select(positions)
        return self._eval_docs

    # --- prompts -----------------------------------------------------------------------------------------------------
    def _shot(self, doc: dict) -> tuple[str, str]:
        """(question, answer) of a few-shot doc: a written sample's target, else " " + its gold choice."""
        return doc["query"], doc["target"] if "target" in doc else " " + doc["choices"][doc["gold"]]

    def fewshot_context(
        self,
        doc,
        num_fewshot,
        system_instruction=None,
        apply_chat_template=False,
        fewshot_as_multiturn=False,
        chat_template=None,
        gen_prefix=None,
    ):
        """OLMES's prompt: plain text for base models; under `--apply_chat_template`, OLMES's messages (layout
        fixed by the setting, whatever `--fewshot_as_multiturn` says) through the model's chat template, then the
        assistant prefix. A list of contexts for docs with one context per choice (WinoGrande)."""
        chat = self.olmes.get("chat")
        if bool(apply_chat_template) != bool(chat):
            mode = "with --apply_chat_template" if chat else "without --apply_chat_template"
            raise ValueError(f"{self.config.task} is OLMES's {self.olmes.get('alias')} setting: run it {mode}")
        shots = [self._shot(d) for d in self.sampler.sample(n=num_fewshot)] if num_fewshot else []
        queries = doc["contexts"] if "contexts" in doc else [doc["query"]]
        if shots and "contexts" in doc:
            raise ValueError(f"{self.config.task}: few-shot partial scoring is not an OLMES setting")
        description = (system_instruction + "\n\n" if system_instruction else "") + self.olmes.get("description", "")
        final = self.olmes.get("final_description", "")
        if chat:
            prefix = chat.get("assistant_prefix")
            contexts = [
                chat_template(
                    olmes.chat_messages(
                        q,
                        shots,
                        multiturn=chat["multiturn"],
                        description=description,
                        final_description=final,
                        assistant_prefix=prefix,
                    )  # fmt: skip
                )
                + (prefix or "")
                for q in queries
            ]
        else:
            contexts = [olmes.plain_context(q, shots, description, final) for q in queries]
        return contexts if "contexts" in doc else contexts[0]

    # --- requests ----------------------------------------------------------------------------------------------------
    def _continuations(self, doc) -> list[str]:
        """ " " + choice (one shared continuation for partial scoring); no leading space right after a chat template's
        assistant header (OLMES strips it when there is no assistant prefix)."""
        conts = [doc["continuation"]] * len(doc["choices"]) if "contexts" in doc else [" " + c for c in doc["choices"]]
        chat = self.olmes.get("chat")
        return [c.lstrip() for c in conts] if chat and not chat.get("assistant_prefix") else conts

    def _pairs(self, doc, ctx) -> list[tuple[str, str]]:
        contexts = ctx if isinstance(ctx, list) else [ctx] * len(doc["choices"])
        pairs = list(zip(contexts, self._continuations(doc), strict=True))
        if self.olmes.get("unconditioned_prompt"):
            pairs += [(self.olmes["unconditioned_prompt"], " " + c) for c in doc["choices"]]
        return pairs

    def construct_requests(self, doc, ctx, **kwargs):
        kwargs.pop("apply_chat_template", None)
        kwargs.pop("chat_template", None)
        if self.olmes["kind"] == "generate":
            args = (ctx, deepcopy(self.config.generation_kwargs))
            return Instance(request_type="generate_until", doc=doc, arguments=args, idx=0, **kwargs)
        return [
            Instance(request_type="loglikelihood", doc=doc, arguments=pair, idx=i, **kwargs)
            for i, pair in enumerate(self._pairs(doc, ctx))
        ]

    # --- scores ------------------------------------------------------------------------------------------------------
    def _tokenizer(self):
        meta = self.config.metadata or {}
        name = meta.get("tokenizer") or meta.get("pretrained")
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"{self.config.task}: acc_per_token needs the model's tokenizer to count continuation tokens; run "
                'with --model_args pretrained=<model> (or --metadata \'{"tokenizer": "<name or path>"}\')'
            )
        return _tokenizer(name)

    def process_results(self, doc, results):
        wanted = self._metric_fn_list
        kind = self.olmes["kind"]
        if kind == "generate":
            scores = self._score_generation(doc, results[0])
        else:
            lls = [float(r[0]) for r in results]
            n = len(doc["choices"])
            if kind == "mc2":
                scores = olmes.mc1_mc2(lls[:n], doc["labels"], doc["mc1_indices"], doc["mc2_indices"])
            else:
                pairs = self._pairs(doc, self.fewshot_context(doc, self.config.num_fewshot or 0)) if (
                    "acc_per_token" in wanted) else None  # fmt: skip
                scores = olmes.mc_metrics(
                    doc["gold"],
                    lls[:n],
                    num_tokens=continuation_token_counts(self._tokenizer(), pairs[:n]) if pairs else None,
                    continuations=self._continuations(doc),
                    uncond_logliks=lls[n : 2 * n] if self.olmes.get("unconditioned_prompt") else None,
                )
        scores[olmes.PRIMARY_SCORE] = scores[self.olmes["primary_metric"]]  # the suite groups average this one
        return {name: scores[name] for name in wanted}

    def _score_generation(self, doc, continuation: str) -> dict:
        scorer, gold = self.olmes["scorer"], doc["gold"]
        if scorer == "gsm8k":
            return {
                "exact_match": olmes.exact_match(olmes.gsm8k_answer(continuation), gold, **olmes.GSM8K_EXACT_MATCH)
            }
        if scorer == "bbh":
            subtask = self.olmes["subtask"]
            corrected = olmes.bbh_answer(continuation, subtask, corrected=True)
            return {
                "exact_match": olmes.bbh_exact_match(olmes.bbh_answer(continuation, subtask), gold, subtask),
                "exact_match_corrected": olmes.bbh_exact_match(corrected, gold, subtask),
            }
        if scorer == "gpqa":
            answer = olmes.gpqa_answer(continuation, self.olmes["answer_format_regex"])
            return {"exact_match": olmes.exact_match(answer, gold, ignore_case=True, ignore_punctuation=True)}
        if scorer == "minerva_math":
            return {"exact_match_flex": olmes.math_exact_match_flex(continuation, gold)}
        raise ValueError(f"{self.config.task}: unknown OLMES scorer {scorer!r}")
