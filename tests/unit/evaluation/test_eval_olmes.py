"""The Instella tables' OLMES settings inside lm-eval, checked against the authors' definitions (expected strings
and metrics written from OLMES's code and configs, not from ours): which docs and how many, the rendered prompt of a
fixed document per benchmark, each metric by hand from a tiny model's log-likelihoods, the answer extraction on sample
generations, and macro vs micro averaging of a suite.

No Hub here: the documents are written for these tests in each dataset's schema. tests/e2e/test_eval_olmes_oracle.py
compares the renderings with OLMES's own exported requests over the real validation sets."""

import copy
import json
import math
import random

import datasets
import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.api.model import LM
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from instella_recipes.evaluation import olmes, olmes_settings
from instella_recipes.evaluation import tasks as make_tasks
from instella_recipes.evaluation.olmes_settings import Group
from instella_recipes.evaluation.olmes_task import OlmesTask
from instella_recipes.post_training.template import install_chat_template

S = olmes_settings
PUBLISHED = make_tasks.EVAL_DIR / "published"


def make_task(setting, rows, dev=None, **olmes_overrides) -> OlmesTask:
    """The setting's lm-eval task over `rows` (and `dev` few-shot rows) instead of its Hub dataset."""
    cfg = S.task_config(setting)
    cfg.pop("class")
    cfg["process_docs"] = getattr(olmes, setting.docs)
    splits = {setting.split: datasets.Dataset.from_list(rows)}
    if dev:
        splits["dev"] = datasets.Dataset.from_list(dev)
    cfg["custom_dataset"] = lambda **_: datasets.DatasetDict(splits)
    cfg["metadata"]["olmes"].update(olmes_overrides)
    return OlmesTask(config=cfg)


def requests(task, template=None) -> list:
    task.build_all_requests(apply_chat_template=template is not None, chat_template=template)
    return [tuple(inst.arguments) for inst in task.instances]


@pytest.fixture(scope="module")
def chat_template(olmo_tokenizer):
    """`apply_chat_template` of an Instella tokenizer (the chat template of SPEC.md 1), as lm-eval calls it."""
    tokenizer = install_chat_template(copy.deepcopy(olmo_tokenizer))

    def render(messages, add_generation_prompt=True):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    return render


# --- which documents, how many -------------------------------------------------------------------------------------
def _fits(value: float, n: int) -> bool:
    """Whether a published percentage (2 decimals) is some k/n."""
    k = round(value * n / 100)
    return abs(100 * k / n - value) < 0.005 + 1e-9


def _published(suite: str) -> dict[str, list[float]]:
    import yaml

    table = yaml.safe_load((PUBLISHED / f"{suite}.yaml").read_text())
    return {col: [row[col] for row in table["models"].values()] for col in table["columns"]}


def test_published_values_are_counts_over_the_docs_the_settings_score():
    """Every published value is k/N for the number of docs N our setting scores (ARC-C 299 and ARC-E 570
    validation items, 1,000 sampled for BoolQ/HellaSwag/PIQA/WinoGrande, SciQ's 1,000, OBQA's 500, GSM8K 1,319,
    GPQA main 448, IFEval 541, the micro-averaged instruct BBH over 6,511 and MATH over 5,000), and not over the
    other splits (ARC test: 1,172 / 2,376; OBQA test: 500 too, so no check there)."""
    columns = {**_published("instella_pretrain"), **{f"i/{k}": v for k, v in _published("instella_instruct").items()}}
    settings = dict(zip(("ARC-C", "ARC-E", "BoolQ", "HSwag", "PIQA", "SciQ", "Wino", "OBQA", "MMLU", "BBH", "GSM8K"),
                        S.PRETRAIN, strict=True))  # fmt: skip
    settings |= {f"i/{k}": e for k, e in zip(("MMLU", "TQA", "BBH", "GPQA", "GSM8K", "MATH", "IFEval"), S.INSTRUCT)}
    expected = {"ARC-C": 299, "ARC-E": 570, "BoolQ": 1000, "HSwag": 1000, "PIQA": 1000, "SciQ": 1000, "Wino": 1000,
                "OBQA": 500, "GSM8K": 1319, "i/GSM8K": 1319, "i/GPQA": 448, "i/IFEval": 541, "i/BBH": 6511,
                "i/MATH": 5000}  # fmt: skip
    for column, n in expected.items():
        assert settings[column].n_eval == n, column
        assert all(_fits(v, n) for v in columns[column]), column
    assert not all(_fits(v, 1172) for v in columns["ARC-C"]) and not all(_fits(v, 2376) for v in columns["ARC-E"])
    # the base-model BBH is a macro average (39.74 is no k/6511), the instruct one a micro average
    assert S.BBH_OLMES.average == "macro" and not all(_fits(v, 6511) for v in columns["BBH"])
    assert (S.BBH_TULU.average, S.MATH_LLAMA31.average, S.MMLU_OLMES.average, S.MMLU_TULU.average) == (
        "micro", "micro", "macro", "macro")  # fmt: skip
    assert len(S.MMLU_OLMES.members) == 57 and len(S.BBH_OLMES.members) == 27 and len(S.MATH_LLAMA31.members) == 7


def test_bigger_splits_are_sampled_with_olmes_seed():
    """OLMES: `random.Random(random_subsample_seed).sample(docs, limit)`, seed 1234, when a split exceeds `limit`."""
    assert olmes.sample_positions(3270, 1000, 1234) == random.Random(1234).sample(range(3270), 1000)
    assert olmes.sample_positions(299, 1000, 1234) == list(range(299))
    rows = [{"goal": f"goal {i}", "sol1": "a", "sol2": "b", "label": 0} for i in range(6)]
    task = make_task(S.PIQA, rows, limit=3)
    assert [d["goal"] for d in task.eval_docs] == [f"goal {i}" for i in random.Random(1234).sample(range(6), 3)]


# --- prompts of the pretrained table (base models) -----------------------------------------------------------------
def test_arc_cloze_prompt_and_unconditioned_requests():
    row = {"id": "q", "question": "Which gas do plants take in?", "answerKey": "2",
           "choices": {"text": ["oxygen", "carbon dioxide", "helium"], "label": ["1", "2", "3"]}}  # fmt: skip
    task = make_task(S.ARC_CHALLENGE, [row])
    prompt = "Question: Which gas do plants take in?\nAnswer:"
    choices = [" oxygen", " carbon dioxide", " helium"]
    assert requests(task) == [(prompt, c) for c in choices] + [("Answer:", c) for c in choices]
    assert task.eval_docs[0]["gold"] == 1  # numeric answer keys mean A, B, C...


def test_boolq_piqa_sciq_openbookqa_prompts():
    boolq = make_task(
        S.BOOLQ, [{"passage": "Ice floats on water.", "question": "does ice float", "idx": 0, "label": 1}]
    )
    assert requests(boolq) == [("Ice floats on water.\nQuestion: does ice float?\nAnswer:", " yes"),
                               ("Ice floats on water.\nQuestion: does ice float?\nAnswer:", " no")]  # fmt: skip
    assert boolq.eval_docs[0]["gold"] == 0
    piqa = make_task(S.PIQA, [{"goal": "Dry wet shoes", "sol1": "stuff them with paper", "sol2": "soak them",
                               "label": 0}])  # fmt: skip
    assert requests(piqa) == [("Goal: Dry wet shoes\nAnswer:", " stuff them with paper"),
                              ("Goal: Dry wet shoes\nAnswer:", " soak them")]  # fmt: skip
    sciq_rows = [{"question": "What do plants make?", "support": " Plants make food. ", "correct_answer": "food",
                  "distractor1": "rocks", "distractor2": "iron", "distractor3": "salt"}]  # fmt: skip
    sciq_rows.append({**sciq_rows[0], "support": ""})
    sciq = requests(make_task(S.SCIQ, sciq_rows))
    assert sciq[0] == ("Plants make food.\nQuestion: What do plants make?\nAnswer:", " rocks")
    assert [c for _, c in sciq[:4]] == [" rocks", " iron", " salt", " food"]  # gold is the last choice
    assert sciq[4][0] == "Question: What do plants make?\nAnswer:"
    obqa = make_task(S.OPENBOOKQA, [{"id": "o", "question_stem": "A magnet attracts", "answerKey": "A",
                                     "choices": {"text": ["iron", "wood"], "label": ["A", "B"]}}])  # fmt: skip
    assert requests(obqa) == [("A magnet attracts", " iron"), ("A magnet attracts", " wood"), ("Answer:", " iron"),
                              ("Answer:", " wood")]  # fmt: skip


def test_hellaswag_cleans_wikihow_markers_like_olmes():
    row = {"ind": 0, "activity_label": "Food", "ctx_a": "[header] How to brew tea [title] Boil water. [step] Fill it.",
           "ctx_b": "then", "ctx": "", "endings": ["[substeps] Pour it. [title] Steep it.", "Dance."], "label": "0",
           "source_id": "x", "split": "val", "split_type": "indomain"}  # fmt: skip
    prompt = "Food: How to brew tea. Boil water. Fill it. Then"  # a period before [title] is not doubled
    assert requests(make_task(S.HELLASWAG, [row])) == [(prompt, "  Pour it. Steep it."), (prompt, " Dance.")]


def test_winogrande_scores_the_rest_of_the_sentence_after_each_option():
    row = {"sentence": "Ann gave Bea a book because _ was kind.", "option1": "Ann", "option2": "Bea", "answer": "1"}
    task = make_task(S.WINOGRANDE, [row])
    assert requests(task) == [("Ann gave Bea a book because Ann", " was kind."),
                              ("Ann gave Bea a book because Bea", " was kind.")]  # fmt: skip
    assert task.eval_docs[0]["gold"] == 0


MMLU_DEV = [{"question": f"d{i}?", "subject": "s", "choices": ["a", "b", "c", "d"], "answer": i % 4} for i in range(6)]
MMLU_TEST = [{"question": "2+2?", "subject": "s", "choices": ["3", "4", "5", "6"], "answer": 1}]
GEOGRAPHY = "The following are multiple choice questions (with answers) about high school geography.\n\n"


def _mmlu(regime: str):
    group = S.MMLU_OLMES if regime == "olmes" else S.MMLU_TULU
    return next(m for m in group.members if m.subset == "high_school_geography")


def test_mmlu_five_dev_shots_in_order_lettered_form():
    ctx = requests(make_task(_mmlu("olmes"), MMLU_TEST, MMLU_DEV))
    shot = "Question: d{}?\n A. a\n B. b\n C. c\n D. d\nAnswer: {}\n\n"
    expected = GEOGRAPHY + "".join(shot.format(i, "ABCD"[i % 4]) for i in range(5))
    expected += "Question: 2+2?\n A. 3\n B. 4\n C. 5\n D. 6\nAnswer:"
    assert ctx == [(expected, " A"), (expected, " B"), (expected, " C"), (expected, " D")]


def test_bbh_base_model_prompt_and_budget():
    setting = next(m for m in S.BBH_OLMES.members if m.subset == "boolean_expressions")
    task = make_task(setting, [{"input": "True and not False is", "target": "True"}])
    ((context, gen),) = requests(task)
    assert context.startswith("Evaluate the result of a random Boolean expression.\n\nQuestion: not ( ( not not True )"
                              " ) is\nAnswer: Let's think step by step. Remember that (i)")  # fmt: skip
    assert context.endswith(
        "So the answer is True.\n\nQuestion: True and not False is\nAnswer: Let's think step by step."
    )
    assert context.count("Question: ") == 4 and gen["until"] == ["\n\n"] and gen["max_gen_toks"] == 512
    assert gen["do_sample"] is False and task.eval_docs[0]["gold"] == "True"


def test_gsm8k_base_model_prompt_and_budget():
    task = make_task(S.GSM8K_OLMES, [{"question": "Tom has 3 apples. How many?", "answer": "He has 3.\n#### 3"}])
    ((context, gen),) = requests(task)
    assert context.startswith("Question: There are 15 trees in the grove.")
    assert context.endswith("So the answer is 8.\n\nQuestion: Tom has 3 apples. How many?\nAnswer:")
    assert context.count("Question: ") == 9 and context.count("So the answer is") == 8
    assert gen["until"] == ["Question:", "</s>", "<|im_end|>", "\n\n"] and gen["max_gen_toks"] == 512
    assert task.eval_docs[0]["gold"] == "3"


# --- prompts of the instruct table (chat) --------------------------------------------------------------------------
def test_mmlu_shots_as_chat_turns(chat_template):
    ctx = requests(make_task(_mmlu("tulu"), MMLU_TEST, MMLU_DEV), chat_template)
    turn = "<|user|>\nQuestion: d{}?\n A. a\n B. b\n C. c\n D. d\nAnswer:\n<|assistant|>\n{}<|endoftext|>\n"
    turns = "".join(turn.format(i, "ABCD"[i % 4]) for i in range(5))
    expected = "<|endoftext|>" + turns.replace("<|user|>\n", "<|user|>\n" + GEOGRAPHY, 1)
    expected += "<|user|>\nQuestion: 2+2?\n A. 3\n B. 4\n C. 5\n D. 6\nAnswer:\n<|assistant|>\n"
    assert ctx == [(expected, "A"), (expected, "B"), (expected, "C"), (expected, "D")]  # no space after the header


def test_truthfulqa_six_pairs_and_the_question_in_one_user_turn(chat_template):
    row = {"question": "Is the Moon made of cheese?",
           "mc1_targets": {"choices": ["No.", "Yes."], "labels": [1, 0]},
           "mc2_targets": {"choices": ["No.", "It is rock.", "Yes."], "labels": [1, 1, 0]}}  # fmt: skip
    task = make_task(S.TRUTHFULQA_TULU, [row])
    reqs = requests(task, chat_template)
    pairs = "".join(f"Q: {q}\nA: {a}\n\n" for q, a in S.TRUTHFULQA_SHOTS)
    expected = f"<|endoftext|><|user|>\n{pairs}Q: Is the Moon made of cheese?\nA:\n<|assistant|>\n"
    assert reqs == [(expected, "No."), (expected, "Yes."), (expected, "It is rock.")]
    doc = task.eval_docs[0]
    assert (doc["labels"], doc["mc1_indices"], doc["mc2_indices"]) == ([1, 0, 1], [0, 1], [0, 2, 1])


def test_bbh_shots_as_chat_turns_no_stop_sequence(chat_template):
    setting = next(m for m in S.BBH_TULU.members if m.subset == "boolean_expressions")
    ((context, gen),) = requests(make_task(setting, [{"input": "True is", "target": "True"}]), chat_template)
    assert context.startswith(
        "<|endoftext|><|user|>\nEvaluate the result of a random Boolean expression.\n\nQ: not ( "
        "( not not True ) ) is\nA: Let's think step by step.\n<|assistant|>\nRemember that (i)"
    )
    assert context.endswith("So the answer is True.<|endoftext|>\n<|user|>\nQ: True is\nA: Let's think step by step.\n"
                            "<|assistant|>\n")  # fmt: skip
    assert context.count("<|assistant|>") == 4 and gen["until"] == [] and gen["max_gen_toks"] == 512


def test_gsm8k_chat_turns_with_answer_prefix(chat_template):
    task = make_task(S.GSM8K_TULU, [{"question": "Tom has 3 apples. How many?", "answer": "3\n#### 3"}])
    ((context, gen),) = requests(task, chat_template)
    assert context.startswith("<|endoftext|><|user|>\nQuestion: There are 15 trees in the grove. Grove workers will "
                              "plant trees in the grove today. After they are done, there will be 21 trees. How many "
                              "trees did the grove workers plant today?\n<|assistant|>\nAnswer: There are 15 trees "
                              "originally.")  # fmt: skip
    assert context.endswith("So the answer is 8.<|endoftext|>\n<|user|>\nQuestion: Tom has 3 apples. How many?\n"
                            "<|assistant|>\nAnswer:")  # fmt: skip
    assert gen["until"] == ["Question:", "</s>", "<|im_end|>"] and gen["max_gen_toks"] == 512


def test_gpqa_llama31_instruction_and_shuffled_choices(chat_template):
    row = {"Question": "Which is a lepton?", "Correct Answer": "electron", "Incorrect Answer 1": "proton",
           "Incorrect Answer 2": "neutron", "Incorrect Answer 3": "pion"}  # fmt: skip
    task = make_task(S.GPQA_LLAMA31, [row])
    ((context, gen),) = requests(task, chat_template)
    choices = ["proton", "neutron", "pion", "electron"]
    random.Random(111 + 0).shuffle(choices)  # OLMES: answer_shuffling_seed 111 + the row's index
    options = "".join(f" ({'ABCD'[i]}) {c}\n" for i, c in enumerate(choices))
    user = (S.GPQA_LLAMA31.description + f"Question: Which is a lepton?\nChoices:\n{options}"
            + S.GPQA_LLAMA31.final_description)  # fmt: skip
    assert context == f"<|endoftext|><|user|>\n{user}\n<|assistant|>\n"
    assert f" (D) {choices[3]}\n\n\n- For simple problems:\n" in user  # the choices' newline + the instruction's
    assert task.eval_docs[0]["gold"] == "ABCD"[choices.index("electron")]
    assert gen["until"] == [] and gen["max_gen_toks"] == 2048


def test_math_llama31_and_ifeval_prompts(chat_template):
    setting = S.MATH_LLAMA31.members[0]
    row = {"problem": "What is $1+1$?", "level": "Level 1", "type": "Algebra", "solution": "It is $\\boxed{2}$."}
    task = make_task(setting, [row])
    ((context, gen),) = requests(task, chat_template)
    assert context == f"<|endoftext|><|user|>\n{S.MATH_LLAMA31_DESCRIPTION}What is $1+1$?\n<|assistant|>\n"
    assert S.MATH_LLAMA31_DESCRIPTION.endswith(
        "$\\boxed{answer}$. I hope it is correct.\n\nWhere [answer] is just the "
        "final number or expression that solves the problem.\n\nProblem: "
    )
    assert gen["until"] == [] and gen["max_gen_toks"] == 2048 and task.eval_docs[0]["gold"] == "2"
    ifeval = S.task_config(S.IFEVAL_TULU)
    assert ifeval["doc_to_text"] == "prompt" and ifeval["generation_kwargs"]["max_gen_toks"] == 2048
    assert ifeval["generation_kwargs"]["until"] == [] and ifeval["test_split"] == "train"


def test_a_setting_runs_only_in_its_own_format(chat_template):
    with pytest.raises(ValueError, match="run it with --apply_chat_template"):
        requests(make_task(S.GPQA_LLAMA31, [{"Question": "q", "Correct Answer": "a", "Incorrect Answer 1": "b",
                                              "Incorrect Answer 2": "c", "Incorrect Answer 3": "d"}]))  # fmt: skip
    with pytest.raises(ValueError, match="run it without --apply_chat_template"):
        requests(make_task(S.PIQA, [{"goal": "g", "sol1": "a", "sol2": "b", "label": 0}]), chat_template)


# --- metrics -------------------------------------------------------------------------------------------------------
def test_mc_metrics_by_hand():
    """OLMES MCAccuracy: argmax of the sum, of sum/tokens, of sum/characters (leading space included), of sum minus
    the unconditioned sum; a tie goes to the first choice."""
    conts = [" a", " bbbbbbbbbbbbbbbbbbb", " c"]
    got = olmes.mc_metrics(1, [-1.0, -2.0, -3.0], [1, 4, 1], conts, [-0.5, -5.0, -0.1])
    # raw: -1 > -2 (choice 0); per token: -1, -0.5, -3 (1); per char: -0.5, -0.1, -1.5 (1); PMI: -0.5, 3, -2.9 (1)
    assert got == {"acc_raw": 0, "acc_per_token": 1, "acc_per_char": 1, "acc_uncond": 1}
    assert olmes.mc_metrics(1, [-1.0, -1.0])["acc_raw"] == 0
    mc = olmes.mc1_mc2([math.log(0.5), math.log(0.2), math.log(0.3)], [1, 0, 1], [0, 1], [0, 1, 2])
    assert mc["mc1"] == 1 and mc["mc2"] == pytest.approx(0.8)


def _logprob(model, tokenizer, context: str, continuation: str) -> tuple[float, int]:
    """Summed log-probability of the continuation and its token count, computed here from the model's logits
    (trailing spaces of the context belong to the continuation, as HFLM and OLMES split the pair)."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    ctx_ids = tokenizer.encode(context)
    ids = tokenizer.encode(context + continuation)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    cont = ids[len(ctx_ids) :]
    return sum(logits[len(ctx_ids) - 1 + i, t].item() for i, t in enumerate(cont)), len(cont)


@pytest.mark.slow
def test_metrics_on_a_tiny_model_equal_the_definitions_by_hand(tiny_model_dir):
    """lm-eval + OlmesTask on the tiny Instella: acc_uncond (ARC), acc_per_token (HellaSwag, WinoGrande's partial
    contexts), acc_raw and acc_per_char equal the metrics computed here from the model's own log-probabilities."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = ["arc_easy", "hellaswag", "winogrande"]
    tasks = [f"olmes_{n}__olmo1_offline" for n in names]
    manager = TaskManager(include_path=str(make_tasks.TASKS_DIR), include_defaults=False,
                          metadata={"pretrained": str(tiny_model_dir)})  # fmt: skip
    lm = HFLM(pretrained=str(tiny_model_dir), trust_remote_code=True, batch_size=4, device="cpu", dtype="float32")
    out = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, log_samples=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, trust_remote_code=True, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for task in tasks:
        per_doc = []
        for sample in out["samples"][task]:
            doc, n = sample["doc"], len(sample["doc"]["choices"])
            pairs = [tuple(args) for args in sample["arguments"]]
            scored = [_logprob(model, tokenizer, c, x) for c, x in pairs]
            lls, toks = [s for s, _ in scored[:n]], [t for _, t in scored[:n]]
            gold = doc["gold"]
            by_hand = {
                "acc_raw": int(max(range(n), key=lambda i: (lls[i], -i)) == gold),
                "acc_per_token": int(max(range(n), key=lambda i: (lls[i] / toks[i], -i)) == gold),
                "acc_per_char": int(max(range(n), key=lambda i: (lls[i] / len(pairs[i][1]), -i)) == gold),
            }
            if len(pairs) == 2 * n:  # acc_uncond: minus log P(choice | "Answer:")
                pmi = [lls[i] - scored[n + i][0] for i in range(n)]
                by_hand["acc_uncond"] = int(max(range(n), key=lambda i: (pmi[i], -i)) == gold)
                assert all(c == "Answer:" for c, _ in pairs[n:])
            per_doc.append(by_hand)
        results = out["results"][task]
        for metric in per_doc[0]:
            if f"{metric},none" in results:
                expected = sum(d[metric] for d in per_doc) / len(per_doc)
                assert results[f"{metric},none"] == pytest.approx(expected), (task, metric)
    assert "acc_uncond,none" in out["results"]["olmes_arc_easy__olmo1_offline"]
    assert "acc_per_token,none" in out["results"]["olmes_winogrande__olmo1_offline"]


# --- answer extraction ---------------------------------------------------------------------------------------------
def test_gsm8k_extraction_takes_the_last_number():
    assert olmes.gsm8k_answer("3 + 4 = 7 apples. So the answer is 1,250.") == "1250"
    # OLMES's pattern [-+]?\d*\.\d+|\d+ keeps a sign only on decimals: "-3" is read as "3", "-3.5" as "-3.5"
    assert olmes.gsm8k_answer("She pays $12.50, then -3") == "3"
    assert olmes.gsm8k_answer("The change is -3.5") == "-3.5"
    assert olmes.gsm8k_answer("no number here") == "no number here"
    em = olmes.GSM8K_EXACT_MATCH
    assert olmes.exact_match("1250", "1,250", **em) == 1.0 and olmes.exact_match("18.", "18", **em) == 1.0
    assert olmes.exact_match("$18", "18", **em) == 1.0 and olmes.exact_match("17", "18", **em) == 0.0


@pytest.mark.parametrize(
    ("subtask", "generation", "answer"),
    [
        ("boolean_expressions", "not True is False. So the answer is False.", "False"),
        ("date_understanding", "...the date is 05/01. So the answer is (B).", "(B)"),
        ("date_understanding", "I think B is right", ""),  # OLMES's bare-letter pattern never matches (see below)
        ("date_understanding", "So the answer is B.", ""),
        ("multistep_arithmetic_two", "= -12 + 5 = -7. So the answer is -7.", "-7"),
        ("dyck_languages", "So the answer is ] ).", "] )"),
        ("word_sorting", "So the answer is apple banana cherry.", "apple banana cherry"),
        ("sports_understanding", "The answer is yes", "yes"),
    ],
)
def test_bbh_answer_patterns(subtask, generation, answer):
    assert olmes.bbh_answer(generation, subtask) == answer


def test_bbh_bare_letter_quirk_is_olmes_and_the_corrected_variant_reads_it():
    """OLMES writes its last-resort pattern "\\b([A-Z])\\b" in a non-raw string: backspace characters, no match. The
    OLMES tasks keep that (their `exact_match`); `exact_match_corrected` reads the letter."""
    assert olmes.BBH_LETTER_OLMES == "\x08([A-Z])\x08"
    assert olmes.bbh_answer("So the answer is B.", "date_understanding", corrected=True) == "(B)"
    assert olmes.bbh_answer("I think B is right", "date_understanding", corrected=True) == "(B)"
    assert olmes.bbh_answer("So the answer is (C).", "date_understanding") == "(C)"  # the usual form: both read it
    setting = next(m for m in S.BBH_OLMES.members if m.subset == "date_understanding")
    task = make_task(setting, [{"input": "Which date?", "target": "(B)"}])
    scores = task.process_results(task.eval_docs[0], ["So the answer is B."])
    assert scores == {"exact_match": 0.0, "exact_match_corrected": 1.0, "primary_score": 0.0}  # primary: OLMES's
    assert setting.dataset == "SaylorTwift/bbh"  # the parquet copy lm-eval reads; OLMES's lukaemon/bbh is a script


def test_bbh_exact_match_ignores_case_and_punctuation_except_for_dyck():
    assert olmes.bbh_exact_match("false", "False", "boolean_expressions") == 1.0
    assert olmes.bbh_exact_match("(B)", "(B)", "date_understanding") == 1.0
    assert olmes.bbh_exact_match("] )", "] ) }", "dyck_languages") == 0.0


def test_gpqa_extraction():
    assert olmes.gpqa_answer("## Step 1 ... The best answer is C.") == "C"
    assert olmes.gpqa_answer("The best answer is (B). No: The best answer is D") == "D"  # the last match
    assert olmes.gpqa_answer("I pick (A), not (C).") == "C"  # fallback: the last "(X)"
    assert olmes.gpqa_answer("Probably B") == "B"  # last resort: a lone capital A-D
    assert olmes.exact_match("c", "C", ignore_case=True, ignore_punctuation=True) == 1.0


def test_math_flex_reads_every_candidate_answer():
    pytest.importorskip("math_verify", reason="Minerva MATH scoring needs lm-eval[math] (pip install -e .[eval])")
    boxed = "## Step 1: add\n\nTherefore, the final answer is: $\\boxed{\\frac{1}{2}}$. I hope it is correct."
    assert olmes.math_answers(boxed) == ["\\frac{1}{2}"]
    assert olmes.math_exact_match_flex(boxed, "\\frac12") == 1  # sympy: the same number
    minerva = "Final Answer: The final answer is $4$. I hope it is correct."
    assert olmes.math_answers(minerva) == ["4"]
    assert olmes.math_answers("so x is $7$ and then $9$") == ["9"]  # the text between the last two $
    assert olmes.math_exact_match_flex("it is 5", "6") == 0
    # the Hendrycks string check counts too: sympy cannot parse an interval, the strings agree after strip_string
    assert olmes.math_exact_match_flex("Final Answer: The final answer is $(1, 2]$. I hope it is correct.", "(1,2]")


def test_math_sympy_check_has_a_cpu_time_budget_not_a_wall_clock_one():
    """lm-eval's 5 s SIGALRM scored correct answers 0 on a busy machine; the budget is CPU time (SIGPROF), which load
    does not use up, and a comparison that exhausts it counts as not equivalent (as OLMES's timeout does)."""
    pytest.importorskip("sympy")
    assert olmes.SYMPY_CPU_SECONDS == 5.0
    assert olmes.sympy_equiv("\\frac{1}{2}", "0.5") is True
    assert olmes.sympy_equiv("x^{200}-1", "(x-1)(x^{199}+1)", cpu_seconds=0.001) is False  # budget spent
    import signal

    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)  # the timer is off again


# --- macro vs micro -------------------------------------------------------------------------------------------------
class KnowsFirstTask(LM):
    """Right on every question that starts with "A:", wrong elsewhere."""

    def loglikelihood(self, requests, disable_tqdm=False):
        out = []
        for request in requests:
            context, continuation = request.args
            right = context.startswith("Question: A:") == (continuation == " right")
            out.append((0.0 if right else -5.0, True))
        return out

    def generate_until(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError


@pytest.mark.parametrize(("average", "expected"), [("macro", 0.5), ("micro", 0.75)])
def test_a_suite_averages_its_members_as_olmes_does(tmp_path, average, expected):
    """Member A (3 docs, all right) and member B (1 doc, wrong): macro = (1 + 0) / 2, micro = 3 / 4."""
    for name in ("olmes.py", "olmes_task.py"):  # the task code next to the YAMLs, as in eval/tasks/olmes/
        (tmp_path / name).symlink_to(make_tasks.OLMES_DIR / name)
    members = []
    for name, questions in (("a", ["A: 1", "A: 2", "A: 3"]), ("b", ["B: 1"])):
        data = tmp_path / f"{name}.jsonl"
        choices = {"text": ["right", "wrong"], "label": ["A", "B"]}
        rows = [{"id": q, "question": q, "answerKey": "A", "choices": choices} for q in questions]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        setting = S.Setting(alias=f"toy_{name}::{average}", dataset="json", subset=None, split="validation",
                            docs="arc_docs", kind="mc", metric="acc_raw", n_docs=len(rows))  # fmt: skip
        cfg = S.task_config(setting) | {"dataset_kwargs": {"data_files": {"validation": str(data)}}}
        (tmp_path / f"{name}.yaml").write_text(make_tasks.render(cfg))
        members.append(setting)
    group = Group(f"toy::{average}", tuple(members), "acc_raw", average)
    (tmp_path / "group.yaml").write_text(make_tasks.render(S.group_config(group)))
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    out = simple_evaluate(model=KnowsFirstTask(), tasks=[group.name], task_manager=manager)
    assert out["results"][group.name]["acc_raw,none"] == pytest.approx(expected)


# --- the instruct suite end to end with canned model outputs ---------------------------------------------------------
class CannedChatModel(LM):
    """A chat model whose every answer is scripted: log-likelihood = -(length of the continuation) / 10 (so the
    shortest choice wins), and the generation of each task is fixed."""

    def __init__(self, generations: dict[str, str]):
        super().__init__()
        self.generations = generations

    def loglikelihood(self, requests, disable_tqdm=False):
        return [(-len(r.args[1]) / 10, False) for r in requests]

    def generate_until(self, requests, disable_tqdm=False):
        return [next(g for key, g in self.generations.items() if key in r.args[0]) for r in requests]

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def apply_chat_template(self, chat_history, add_generation_prompt=True):
        return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in chat_history) + "<|assistant|>\n"

    @property
    def tokenizer_name(self):
        return "canned"


def test_instruct_offline_suite_scores_as_defined(chat_template):
    """TruthfulQA mc2 from the model's log-likelihoods, and GSM8K / GPQA / BBH exact match from scripted answers,
    through lm-eval's evaluator and the suite's own task YAMLs (shipped rows)."""
    rows = [json.loads(line) for line in (make_tasks.EVAL_DIR / "data/offline/truthfulqa_mc2.jsonl").open()]
    canned = {
        "Tom has 3 boxes": "3 * 4 = 12, 12 - 2 = 10. So the answer is 10.",  # right
        "A book costs": "So the answer is 21.",  # wrong (20)
        "Which particle": "The best answer is (B).",
        "Evaluate the result": "Let me see. So the answer is True.",
        "Question:": "The answer is 0.",
    }
    tasks = ["olmes_truthfulqa__tulu_offline", "olmes_gsm8k__tulu_offline", "olmes_gpqa_0shot_cot__llama3_1_offline",
             "olmes_bbh_boolean_expressions_cot_v1__tulu_offline"]  # fmt: skip
    manager = TaskManager(include_path=str(make_tasks.TASKS_DIR), include_defaults=False)
    out = simple_evaluate(model=CannedChatModel(canned), tasks=tasks, task_manager=manager, apply_chat_template=True,
                          log_samples=True)  # fmt: skip
    res = out["results"]
    mc2 = []
    for row in rows:  # the shorter an answer, the likelier: mc2 = true mass / all mass over the MC2 answers
        p = {c: math.exp(-len(c) / 10) for c in row["mc2_targets"]["choices"]}
        true = sum(p[c] for c, label in zip(row["mc2_targets"]["choices"], row["mc2_targets"]["labels"]) if label)
        mc2.append(true / sum(p.values()))
    assert res[tasks[0]]["mc2,none"] == pytest.approx(sum(mc2) / len(mc2))
    gsm8k = [s["target"] for s in out["samples"][tasks[1]]]
    assert res[tasks[1]]["exact_match,none"] == pytest.approx(sum(g == "10" for g in gsm8k) / len(gsm8k))
    gpqa_golds = [s["doc"]["gold"] for s in out["samples"][tasks[2]]]
    assert gpqa_golds[0] in "ABCD" and res[tasks[2]]["exact_match,none"] == pytest.approx(
        sum(g == "B" for g in gpqa_golds[:1]) / len(gpqa_golds))  # fmt: skip
    bbh_golds = [s["doc"]["gold"] for s in out["samples"][tasks[3]]]
    assert res[tasks[3]]["exact_match,none"] == pytest.approx(sum(g == "True" for g in bbh_golds) / len(bbh_golds))
    for task, primary in zip(tasks, ["mc2", "exact_match", "exact_match", "exact_match"]):  # the suites average it
        assert res[task]["primary_score,none"] == res[task][f"{primary},none"]
