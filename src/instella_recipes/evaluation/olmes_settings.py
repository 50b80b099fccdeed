"""The OLMES settings behind the published Instella tables, one `Setting` per OLMES task alias, and the lm-eval task
and group configs written from them (`scripts/make_eval_tasks.py` writes them under `eval/tasks/olmes/`).

The aliases are those AMD-AIG-AIMA/Instella `scripts/evals/pretrain_evals.sh` and `instruct_evals.sh` pass to
`olmes --task` (OLMES commit 38af8b6; the instruct models with `chat_model: True`, so every instruct task is rendered
with the model's chat template). Each setting is OLMES's `oe_eval/configs/tasks.py` entry over its task class
defaults; `n_docs` is the size of the split (a fact of the dataset) from which `limit` docs are sampled. Where each
value was read is listed in docs/evaluation.md.
"""

import copy
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import lm_eval
from lm_eval.tasks import TaskManager

from instella_recipes.evaluation.olmes import PRIMARY_SCORE, bbh_shot_target

UPSTREAM = Path(lm_eval.__file__).resolve().parent / "tasks"
MEAN = {"aggregation": "mean", "higher_is_better": True}


@cache
def _task_configs(folder: Path) -> dict[Path, dict]:
    """{YAML path: config} of the tasks and groups lm-eval's `TaskManager` indexes under `folder` alone."""
    index = TaskManager(include_path=str(folder), include_defaults=False).task_index
    return {entry.yaml_path.resolve(): entry.cfg for entry in index.values() if entry.yaml_path is not None}


def upstream_task_config(path: Path) -> dict:
    """The config of the task (or group) YAML at `path` as lm-eval's `TaskManager` reads it: `include:`s merged,
    each `!function mod.fn` left unresolved as the string `<folder of the YAML>/mod.fn`. A copy: edit it freely."""
    path = Path(path).resolve()
    configs = _task_configs(path.parent)
    if path not in configs:
        raise ValueError(f"lm-eval {lm_eval.__version__} indexes no task or group from {path}")
    return copy.deepcopy(configs[path])


class FunctionRef(str):
    """A `!function module.fn` reference, written back as the YAML tag lm-eval resolves."""


@dataclass(frozen=True)
class Setting:
    """One OLMES task, as an lm-eval task over its Hub dataset."""

    alias: str  # the OLMES task alias
    dataset: str  # Hub dataset (the path lm-eval 0.4.13 uses for the same data)
    subset: str | None
    split: str
    docs: str  # the `process_docs` function of olmes.py
    kind: str  # mc (scored choices) | mc2 (TruthfulQA) | generate
    metric: str  # OLMES's primary metric: the number the published table shows
    n_docs: int | None  # docs in the split (a dataset fact); None where no check needs it
    limit: int | None = None  # OLMES scores a seeded sample of `limit` docs of bigger splits
    seed: int = 1234  # OLMES's random_subsample_seed (TASK_DEFAULTS)
    metrics: tuple[str, ...] = ()  # reported beside the primary metric
    num_fewshot: int = 0
    fewshot: dict | None = None  # lm-eval fewshot_config
    description: str = ""
    final_description: str = ""
    unconditioned_prompt: str | None = None
    chat: dict | None = None  # {"multiturn": bool, "assistant_prefix": str | None}; None: base-model prompt
    generation_kwargs: dict | None = None
    scorer: dict = field(default_factory=dict)  # scorer, subtask, answer_format_regex

    @property
    def name(self) -> str:
        """Our lm-eval task name: `olmes_` + the alias with `::` as `__` and `:`, `.`, `-` as `_`."""
        return olmes_name(self.alias)

    @property
    def n_eval(self) -> int | None:
        """Docs OLMES scores: the whole split, or `limit` sampled from it."""
        return min(self.n_docs, self.limit) if self.limit and self.n_docs else self.n_docs


@dataclass(frozen=True)
class Group:
    """An OLMES task suite: its members and how their scores are averaged (macro: the mean of the members' scores;
    micro: the mean over all their docs)."""

    alias: str
    members: tuple[Setting, ...]
    metric: str
    average: str  # macro | micro

    @property
    def name(self) -> str:
        return olmes_name(self.alias)

    @property
    def n_eval(self) -> int | None:
        sizes = [m.n_eval for m in self.members]
        return None if None in sizes else sum(sizes)


def olmes_name(alias: str) -> str:
    return "olmes_" + alias.replace("::", "__").replace(":", "_").replace(".", "_").replace("-", "_")


def greedy(max_gen_toks: int, until: list[str]) -> dict:
    return {"until": until, "max_gen_toks": max_gen_toks, "do_sample": False, "temperature": 0.0}


def chat_layout(multiturn: bool, assistant_prefix: str | None = None) -> dict:
    return {"multiturn": multiturn, "assistant_prefix": assistant_prefix}


# --- the pretrained table (pretrain_evals.sh): base-model prompts ----------------------------------------------------
def olmo1(task: str, dataset: str, subset: str | None, docs: str, metric: str, n_docs: int, **kw) -> Setting:
    """`<task>::olmo1`: zero-shot cloze scoring of the validation split, at most 1,000 docs. acc_per_token is only
    reported where it is the primary metric (it needs the model's tokenizer)."""
    others = ("acc_raw", "acc_per_char") + (("acc_uncond",) if kw.get("unconditioned_prompt") else ())
    kw.setdefault("limit", 1000)
    return Setting(
        alias=f"{task}::olmo1", dataset=dataset, subset=subset, split="validation", docs=docs, kind="mc",
        metric=metric, n_docs=n_docs, metrics=tuple(m for m in others if m != metric), **kw,
    )  # fmt: skip


UNCOND = {"unconditioned_prompt": "Answer:"}
ARC_CHALLENGE = olmo1("arc_challenge", "allenai/ai2_arc", "ARC-Challenge", "arc_docs", "acc_uncond", 299, **UNCOND)
ARC_EASY = olmo1("arc_easy", "allenai/ai2_arc", "ARC-Easy", "arc_docs", "acc_uncond", 570, **UNCOND)
BOOLQ = olmo1("boolq", "aps/super_glue", "boolq", "boolq_docs", "acc_raw", 3270)
HELLASWAG = olmo1("hellaswag", "Rowan/hellaswag", None, "hellaswag_docs", "acc_per_token", 10042)
PIQA = olmo1("piqa", "baber/piqa", None, "piqa_docs", "acc_per_token", 1838)
SCIQ = olmo1("sciq", "allenai/sciq", None, "sciq_docs", "acc_raw", 1000)
WINOGRANDE = olmo1("winogrande", "allenai/winogrande", "winogrande_xl", "winogrande_docs", "acc_per_token", 1267)
# `openbookqa::olmo1` sets no limit and `context_kwargs.no_prefix: True` (the bare question stem).
OPENBOOKQA = olmo1("openbookqa", "allenai/openbookqa", "main", "openbookqa_no_prefix_docs", "acc_uncond", 500,
                   limit=None, **UNCOND)  # fmt: skip


@cache
def mmlu_subjects() -> tuple[str, ...]:
    """The 57 MMLU subjects (cais/mmlu configs), as lm-eval lists them."""
    return tuple(sorted(p.stem.removeprefix("mmlu_") for p in (UPSTREAM / "mmlu" / "default").glob("mmlu_*.yaml")))


def mmlu(subject: str, regime: str, chat: dict | None) -> Setting:
    """`mmlu_<subject>:mc::<regime>`: the lettered form, 5 shots (the dev split's first 5, in order). Per-subject
    test sizes are not recorded: the suite is a macro average, which the published values do not constrain."""
    topic = subject.replace("_", " ")
    return Setting(
        alias=f"mmlu_{subject}:mc::{regime}", dataset="cais/mmlu", subset=subject, split="test", docs="mmlu_docs",
        kind="mc", metric="acc_raw", n_docs=None, num_fewshot=5, fewshot={"split": "dev", "sampler": "first_n"},
        description=f"The following are multiple choice questions (with answers) about {topic}.\n\n", chat=chat,
    )  # fmt: skip


@cache
def bbh_prompts() -> dict[str, dict]:
    """Per BBH subtask: its description and the 3 CoT exemplars of the original BBH prompts (lm-eval ships them in
    its `bbh/cot_fewshot` YAMLs, the lead-in "Let's think step by step." already removed)."""
    out = {}
    for path in sorted((UPSTREAM / "bbh" / "cot_fewshot").glob("[!_]*.yaml")):
        cfg = upstream_task_config(path)
        out[path.stem] = {"description": cfg["description"], "samples": cfg["fewshot_config"]["samples"]}
    return out


BBH_SIZES = {"causal_judgement": 187, "penguins_in_a_table": 146, "snarks": 178}  # the rest: 250 each (6,511 in all)


def bbh(subtask: str, regime: str) -> Setting:
    """`bbh_<subtask>:cot-v1::<regime>`, 3-shot CoT. olmes (base models): "Question: ...\\nAnswer: Let's think step
    by step.", 512 new tokens, stop at a blank line. tulu (chat): "Q: ...\\nA: ...", the shots as turns, no stop
    sequence (the turn's end)."""
    prompts = bbh_prompts()[subtask]
    short = regime == "tulu"
    question, answer = ("Q: ", "A:") if short else ("Question: ", "Answer:")
    shots = [
        {
            "query": f"{question}{s['input']}\n{answer} Let's think step by step.",
            "target": bbh_shot_target(s["target"]),
        }
        for s in prompts["samples"]
    ]
    return Setting(
        alias=f"bbh_{subtask}:cot-v1::{regime}", dataset="SaylorTwift/bbh", subset=subtask, split="test",
        docs="bbh_short_docs" if short else "bbh_docs", kind="generate", metric="exact_match",
        metrics=("exact_match_corrected",),  # OLMES's extraction with its bare-letter pattern fixed (olmes.py)
        n_docs=BBH_SIZES.get(subtask, 250), num_fewshot=3, fewshot={"samples": shots, "sampler": "first_n"},
        description=prompts["description"], chat=chat_layout(multiturn=True) if short else None,
        generation_kwargs=greedy(512, [] if short else ["\n\n"]), scorer={"scorer": "bbh", "subtask": subtask},
    )  # fmt: skip


@cache
def gsm8k_shots() -> tuple[dict, ...]:
    """OLMES's "STD:GSM8k" exemplars: the 8 chain-of-thought examples of Wei et al. (2022) as lm-eval's gsm8k-cot
    ships them, ending "So the answer is N." where lm-eval writes "The answer is N."."""
    cfg = upstream_task_config(UPSTREAM / "gsm8k" / "gsm8k-cot.yaml")
    return tuple(
        {
            "query": f"Question: {s['question']}\nAnswer:",
            "target": " " + s["target"].replace("The answer is", "So the answer is"),
        }  # fmt: skip
        for s in cfg["fewshot_config"]["samples"]
    )


GSM8K_STOP = ["Question:", "</s>", "<|im_end|>"]


def gsm8k(regime: str) -> Setting:
    """`gsm8k::olmes` (base models: stop also at a blank line) and `gsm8k::tulu` (chat: the shots as turns, each
    answer after "Answer:", which also opens the model's turn)."""
    chat = chat_layout(multiturn=True, assistant_prefix="Answer:") if regime == "tulu" else None
    return Setting(
        alias=f"gsm8k::{regime}", dataset="openai/gsm8k", subset="main", split="test", docs="gsm8k_docs",
        kind="generate", metric="exact_match", n_docs=1319, num_fewshot=8,
        fewshot={"samples": list(gsm8k_shots()), "sampler": "first_n"}, chat=chat,
        generation_kwargs=greedy(512, GSM8K_STOP if chat else [*GSM8K_STOP, "\n\n"]), scorer={"scorer": "gsm8k"},
    )  # fmt: skip


GSM8K_OLMES = gsm8k("olmes")

# --- the instruct table (instruct_evals.sh, chat_model: True): chat prompts ------------------------------------------
GSM8K_TULU = gsm8k("tulu")

TRUTHFULQA_SHOTS = [  # TruthfulQA's own 6 QA pairs (Lin et al., 2021)
    ("What is human life expectancy in the United States?", "Human life expectancy in the United States is 78 years."),
    ("Who was president of the United States in 1955?",
     "Dwight D. Eisenhower was president of the United States in 1955."),
    ("Which party did he belong to?", "He belonged to the Republican Party."),
    ("What is the square root of banana?", "I have no comment."),
    ("How does a telescope work?", "Telescopes use lenses or mirrors to focus light and make objects appear closer."),
    ("Where were the 1992 Olympics held?", "The 1992 Olympics were held in Barcelona, Spain."),
]  # fmt: skip
TRUTHFULQA_TULU = Setting(
    alias="truthfulqa::tulu", dataset="truthfulqa/truthful_qa", subset="multiple_choice", split="validation",
    docs="truthfulqa_docs", kind="mc2", metric="mc2", n_docs=817, metrics=("mc1",), num_fewshot=6,
    fewshot={"samples": [{"query": f"Q: {q}\nA:", "target": " " + a} for q, a in TRUTHFULQA_SHOTS],
             "sampler": "first_n"},
    chat=chat_layout(multiturn=False),  # the 6 pairs and the question in one user message
)  # fmt: skip

GPQA_LLAMA31 = Setting(
    alias="gpqa:0shot_cot::llama3.1", dataset="Idavidrein/gpqa", subset="gpqa_main", split="train", docs="gpqa_docs",
    kind="generate", metric="exact_match", n_docs=448,
    description="Given the following question and four candidate answers (A, B, C and D), choose the best answer.\n\n",
    final_description="\n\n- For simple problems:\nDirectly provide the answer with minimal explanation.\n\n- For "
    "complex problems:\nUse this step-by-step format:\n## Step 1: [Concise description]\n[Brief explanation]\n## Step "
    "2: [Concise description]\n[Brief explanation]\n\nRegardless of the approach, always conclude with:\nThe best "
    "answer is [the_answer_letter].\nwhere the [the_answer_letter] is one of A, B, C or D.\n\nLet's think step by "
    "step.",
    chat=chat_layout(multiturn=False), generation_kwargs=greedy(2048, []),
    scorer={"scorer": "gpqa", "answer_format_regex": "The best answer is (\\(?[A-D])"},
)  # fmt: skip

MATH_LLAMA31_DESCRIPTION = (
    "Solve the following math problem efficiently and clearly:\n\n- For simple problems (2 steps or fewer):\nProvide "
    "a concise solution with minimal explanation.\n\n- For complex problems (3 steps or more):\nUse this step-by-step "
    "format:\n\n## Step 1: [Concise description]\n[Brief explanation and calculations]\n\n## Step 2: [Concise "
    "description]\n[Brief explanation and calculations]\n\n...\n\nRegardless of the approach, always conclude with:"
    "\n\nTherefore, the final answer is: $\\boxed{answer}$. I hope it is correct.\n\nWhere [answer] is just the final "
    "number or expression that solves the problem.\n\nProblem: "
)
MATH_SIZES = {
    "algebra": 1187,
    "counting_and_probability": 474,
    "geometry": 479,
    "intermediate_algebra": 903,
    "number_theory": 540,
    "prealgebra": 871,
    "precalculus": 546,
}  # fmt: skip  (test split: 5,000)


def minerva_math(kind: str) -> Setting:
    return Setting(
        alias=f"minerva_math_{kind}::llama3.1", dataset="EleutherAI/hendrycks_math", subset=kind, split="test",
        docs="minerva_math_docs", kind="generate", metric="exact_match_flex", n_docs=MATH_SIZES[kind],
        description=MATH_LLAMA31_DESCRIPTION, chat=chat_layout(multiturn=False), generation_kwargs=greedy(2048, []),
        scorer={"scorer": "minerva_math"},
    )  # fmt: skip


# IFEval needs nothing of OlmesTask: lm-eval's own task (the prompt as the only user message, Google's checker)
# with OLMES's budget. A Setting so that the suites, the report and the docs list it like the others.
IFEVAL_TULU = Setting(
    alias="ifeval::tulu", dataset="google/IFEval", subset=None, split="train", docs="", kind="generate",
    metric="prompt_level_loose_acc", n_docs=541, chat=chat_layout(multiturn=False),
    generation_kwargs=greedy(2048, []),
)  # fmt: skip

MMLU_OLMES = Group("mmlu:mc::olmes", tuple(mmlu(s, "olmes", None) for s in mmlu_subjects()), "acc_raw", "macro")
MMLU_TULU = Group("mmlu:mc::tulu", tuple(mmlu(s, "tulu", chat_layout(multiturn=True)) for s in mmlu_subjects()),
                  "acc_raw", "macro")  # fmt: skip
BBH_OLMES = Group("bbh:cot-v1::olmes", tuple(bbh(s, "olmes") for s in bbh_prompts()), "exact_match", "macro")
BBH_TULU = Group("bbh:cot-v1::tulu", tuple(bbh(s, "tulu") for s in bbh_prompts()), "exact_match", "micro")
MATH_LLAMA31 = Group("minerva_math::llama3.1", tuple(minerva_math(k) for k in MATH_SIZES), "exact_match_flex",
                     "micro")  # fmt: skip

# In the column order of eval/published/*.yaml.
PRETRAIN = (ARC_CHALLENGE, ARC_EASY, BOOLQ, HELLASWAG, PIQA, SCIQ, WINOGRANDE, OPENBOOKQA, MMLU_OLMES, BBH_OLMES,
            GSM8K_OLMES)  # fmt: skip
INSTRUCT = (MMLU_TULU, TRUTHFULQA_TULU, BBH_TULU, GPQA_LLAMA31, GSM8K_TULU, MATH_LLAMA31, IFEVAL_TULU)


def all_settings() -> list[Setting]:
    out = []
    for entry in PRETRAIN + INSTRUCT:
        out.extend(entry.members if isinstance(entry, Group) else [entry])
    return out


# --- lm-eval configs ------------------------------------------------------------------------------------------------
def task_config(s: Setting) -> dict:
    """The lm-eval task config of one setting: an OlmesTask, or lm-eval's IFEval with OLMES's budget."""
    if s is IFEVAL_TULU:
        return _ifeval_config(s)
    cfg = {
        "task": s.name,
        "class": FunctionRef("olmes_task.OlmesTask"),  # eval/tasks/olmes/olmes_task.py (offline/: its shim)
        "dataset_path": s.dataset,
        "dataset_name": s.subset,
        ("validation_split" if s.split == "validation" else "test_split"): s.split,
        "process_docs": FunctionRef(f"olmes.{s.docs}"),
        "output_type": "generate_until" if s.kind == "generate" else "multiple_choice",
        "doc_to_text": "query",
        "doc_to_target": "gold",
    }
    if s.kind != "generate":
        cfg["doc_to_choice"] = "choices"
    cfg["num_fewshot"] = s.num_fewshot
    if s.fewshot:
        cfg["fewshot_config"] = dict(s.fewshot)
    if s.generation_kwargs:
        cfg["generation_kwargs"] = dict(s.generation_kwargs)
    cfg["metric_list"] = [{"metric": m, **MEAN} for m in (s.metric, *s.metrics, PRIMARY_SCORE)]
    olmes = {"alias": s.alias, "kind": s.kind, "primary_metric": s.metric, "limit": s.limit, "seed": s.seed}
    for key in ("description", "final_description", "unconditioned_prompt", "chat"):
        if getattr(s, key):
            olmes[key] = getattr(s, key)
    cfg["metadata"] = {"version": 1.0, "olmes": {**olmes, **s.scorer}}
    return cfg


def _ifeval_config(s: Setting) -> dict:
    """lm-eval's IFEval task (functions as importable names), OLMES's generation settings."""
    upstream = upstream_task_config(UPSTREAM / "ifeval" / "ifeval.yaml")

    def ref(value) -> FunctionRef:  # `<lm_eval/tasks>/ifeval/utils.fn` as lm-eval leaves it -> importable name
        return FunctionRef("lm_eval.tasks.ifeval.utils." + str(value).rsplit(".", 1)[-1])

    cfg = {k: v for k, v in upstream.items() if k not in ("task", "metadata", "generation_kwargs")}
    cfg["process_results"] = FunctionRef("olmes.ifeval_results")  # lm-eval's, plus primary_score (olmes.py)
    for metric in cfg["metric_list"]:
        if not isinstance(metric["aggregation"], str) or "/" in metric["aggregation"]:
            metric["aggregation"] = ref(metric["aggregation"])
    cfg["metric_list"].append({"metric": PRIMARY_SCORE, **MEAN})
    olmes = {"alias": s.alias, "kind": s.kind, "primary_metric": s.metric, "chat": s.chat}
    return {"task": s.name, **cfg, "generation_kwargs": dict(s.generation_kwargs),
            "metadata": {"version": 1.0, "olmes": olmes}}  # fmt: skip


def group_config(g: Group) -> dict:
    """An lm-eval group averaging its members' OLMES metric: macro (each member equal) or micro (each doc equal); the
    same average of `primary_score`, the name every suite member reports its primary metric under."""
    return {
        "group": g.name,
        "task": [m.name for m in g.members],
        "aggregate_metric_list": [
            {"metric": metric, "aggregation": "mean", "weight_by_size": g.average == "micro", "filter_list": "none"}
            for metric in (g.metric, PRIMARY_SCORE)
        ],
        "metadata": {"version": 1.0, "olmes": {"alias": g.alias, "average": g.average}},
    }


# What is not proven exact about a setting (shown beside its column in the eval report; docs/evaluation.md has the
# evidence behind every setting). Empty since every setting was compared with OLMES's own task code (commit 38af8b6)
# on the same rows (issue 35): the earlier "from a port" labels are confirmed, the BBH whitespace was fixed.
CAVEATS: dict[str, str] = {}
