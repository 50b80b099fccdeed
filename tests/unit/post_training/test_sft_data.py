"""SFT/DPO data: source converters, the mixture's upsampling, stage-2 text, and the bad-input policy with counts."""

import copy
from pathlib import Path

import pytest
from datasets import Dataset

from instella_recipes.core import RecipeError, parse_recipe
from instella_recipes.post_training import converters
from instella_recipes.post_training.mixture import build_mixture
from instella_recipes.post_training.template import IGNORE_INDEX, install_chat_template
from instella_recipes.post_training.tokenization import prepare_dpo_dataset, prepare_sft_dataset

RECIPES = Path(__file__).resolve().parents[3] / "recipes"

U = {"role": "user", "content": "What is 2 + 3?"}
A = {"role": "assistant", "content": "2 + 3 = 5. The answer is 5."}


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return install_chat_template(copy.deepcopy(tiny_tokenizer))  # the session fixture stays untouched


# MMLU auxiliary_train: the authors' 11 templates and data seed, test_exactness_sft.py


def test_named_converters():
    assert converters.openmathinstruct2({"problem": "p", "generated_solution": "s"}, 0)["messages"] == [
        {"role": "user", "content": "p"},
        {"role": "assistant", "content": "s"},
    ]
    assert converters.o1_journey({"question": "q", "longCOT": "long"}, 0)["messages"][1]["content"] == "long"
    assert converters.messages({"messages": [U, A], "id": 1}, 0) == {"messages": [U, A]}


def test_chat_to_text_strips_and_joins_without_role_tags():
    chat = [{"role": "system", "content": " Be nice. "}, U, {"role": "assistant", "content": "5\n\n"}]
    assert converters.chat_to_text(chat) == "Be nice.\nWhat is 2 + 3?\n5\n"


def test_chat_to_text_entry_point(tmp_path):
    from instella_recipes.post_training.chat_to_text import main as chat_to_text_main

    src, out = tmp_path / "chats.jsonl", tmp_path / "text.jsonl"
    Dataset.from_list([{"messages": [U, A]}] * 3).to_json(src)
    assert chat_to_text_main(["--sources", str(src), "--output", str(out)]) == 0
    lines = Path(out).read_text().splitlines()
    assert len(lines) == 3 and '"text": "What is 2 + 3?\\n2 + 3 = 5. The answer is 5.\\n"' in lines[0]


def test_mixture_upsamples_and_subsamples(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    Dataset.from_list([{"messages": [U, A]}] * 5).to_json(a)
    Dataset.from_list([{"problem": f"p{i}", "generated_solution": "s"} for i in range(20)]).to_json(b)
    mixed, report = build_mixture(
        [{"path": str(a), "repeat": 10}, {"path": str(b), "converter": "openmathinstruct2", "max_samples": 7}]
    )
    assert [r["rows"] for r in report] == [50, 7] and len(mixed) == 57
    assert mixed.column_names == ["messages"]
    _, report = build_mixture([{"path": str(a), "repeat": 1.4}])
    assert report[0]["rows"] == 7


def test_mixture_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    Dataset.from_list([{"text": "no messages here"}]).to_json(bad)
    with pytest.raises(RecipeError, match=r"missing field 'messages'.*columns \['text'\]"):
        build_mixture([{"path": str(bad)}])
    with pytest.raises(RecipeError, match="unknown converter"):
        build_mixture([{"path": str(bad), "converter": "nope"}])
    with pytest.raises(RecipeError, match="does not exist"):
        build_mixture([{"path": str(tmp_path / "missing.jsonl")}])
    with pytest.raises(RecipeError, match="unknown key"):
        build_mixture([{"path": str(bad), "weight": 2}])
    with pytest.raises(RecipeError, match="missing field 'chosen'"):
        build_mixture([{"path": str(bad)}], default_converter="preference")


def test_sft_bad_rows_are_skipped_and_counted(tok):
    long = {"role": "assistant", "content": "word " * 200}
    rows = [
        [U, A],
        [{"role": "tool", "content": "x"}, A],  # unknown role
        [U],  # no assistant turn
        [U, {"role": "assistant", "content": "  "}],  # empty assistant message: kept (its EOS trains), as the authors
        [U, long],  # longer than max_length
    ]
    data = Dataset.from_list([{"messages": m} for m in rows])
    kept, report = prepare_sft_dataset(data, tok, max_length=64, overlong="truncate")
    assert report.as_dict() == {
        "rows": 5, "kept": 3, "truncated": 1, "no_signal": 1, "skipped": {"no assistant turn": 1, "unknown role": 1},
    }  # fmt: skip
    assert len(kept) == 3 and all(len(ids) <= 64 for ids in kept["input_ids"])
    assert [t for t in kept[1]["labels"] if t != IGNORE_INDEX] == [tok.eos_token_id]  # the empty answer's EOS
    assert "truncated to max_length: 1" in report.summary() and "unknown role: 1" in report.summary()
    _, report = prepare_sft_dataset(data, tok, max_length=64, overlong="drop")
    assert report.kept == 2 and report.skipped["longer than max_length (dropped)"] == 1
    with pytest.raises(RecipeError, match="max_skip_fraction"):
        report.check(max_skip_fraction=0.1)
    report.check(max_skip_fraction=0.9)
    with pytest.raises(RecipeError, match="no `messages` column"):
        prepare_sft_dataset(Dataset.from_list([{"text": "x"}]), tok, 64)


def test_sft_labels_cover_only_assistant_tokens(tok):
    kept, _ = prepare_sft_dataset(Dataset.from_list([{"messages": [U, A]}]), tok, max_length=None)
    ids, labels = kept[0]["input_ids"], kept[0]["labels"]
    trained = [t for t in labels if t != IGNORE_INDEX]
    assert tok.decode(trained) == A["content"] + "<|endoftext|>"
    # prompt untrained, then the answer + EOS, then the authors' unlabelled "\n" after the final EOS
    n = len(ids) - len(trained) - 1
    assert labels == [IGNORE_INDEX] * n + trained + [IGNORE_INDEX] and tok.decode(ids[-1:]) == "\n"


def test_dpo_bad_pairs_are_skipped_and_counted(tok):
    good = {"prompt": [U], "chosen": [A], "rejected": [{"role": "assistant", "content": "The answer is 6."}]}
    rows = [
        good,
        {**good, "rejected": [A]},  # chosen == rejected: kept, as the authors
        {**good, "chosen": [{"role": "assistant", "content": ""}]},  # empty answer: kept (its EOS is scored)
        {**good, "prompt": [{"role": "robot", "content": "hi"}]},  # unknown role
        {**good, "chosen": [{"role": "assistant", "content": "long " * 200}]},  # too long
        {**good, "prompt": [{"role": "user", "content": "long " * 200}]},  # nothing scored within max_length
    ]
    kept, report = prepare_dpo_dataset(Dataset.from_list(rows), tok, max_length=64, overlong="truncate")
    assert report.as_dict() == {
        "rows": 6, "kept": 4, "truncated": 1, "no_signal": 1,
        "skipped": {"no scored token within max_length": 1, "unknown role": 1},
    }  # fmt: skip
    assert sorted(kept.column_names) == ["chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask"]
    scored = [t for t, m in zip(kept[0]["chosen_ids"], kept[0]["chosen_mask"], strict=True) if m]
    assert tok.decode(scored) == A["content"] + "<|endoftext|>"
    # without a prompt column the conversations are whole (the authors' format): the same rows
    whole = Dataset.from_list([{"chosen": [U, A], "rejected": [U, good["rejected"][0]]}])
    again, report = prepare_dpo_dataset(whole, tok, max_length=64)
    assert report.kept == 1 and again[0] == kept[0]
    _, report = prepare_dpo_dataset(Dataset.from_list(rows), tok, max_length=64, overlong="drop")
    assert report.skipped["longer than max_length (dropped)"] == 2  # the long answer and the long prompt
    with pytest.raises(RecipeError, match=r"no \['rejected'\] column"):
        prepare_dpo_dataset(Dataset.from_list([{"chosen": [U, A]}]), tok, 64)


@pytest.mark.parametrize(
    "path",
    sorted(RECIPES.glob("*/sft*.yaml")) + sorted(RECIPES.glob("*/dpo*.yaml")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_recipes_parse(path):
    from trl import ModelConfig

    from instella_recipes.post_training.dpo import CheckedDPOConfig
    from instella_recipes.post_training.sft import CheckedSFTConfig

    kind = CheckedSFTConfig if path.name.startswith("sft") else CheckedDPOConfig
    # bf16 is the published setting; this CPU machine cannot validate it, so the test overrides it
    args, model_args = parse_recipe([kind, ModelConfig], ["--config", str(path), "--bf16", "false"])
    assert bool(args.sources) != bool(getattr(args, "mds_streams", None)) and args.global_batch_size  # one data kind
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("# ") and "batch" in first_line  # hardware + global batch
    if model_args.use_peft:
        assert model_args.lora_target_modules == [
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
        ]  # fmt: skip


def test_bad_data_stops_the_recipe_before_any_output(tiny_model_dir, tmp_path, capsys):
    from instella_recipes.post_training import sft

    bad = tmp_path / "bad.jsonl"
    Dataset.from_list([{"messages": [U]}, {"messages": [{"role": "tool", "content": "x"}, A]}]).to_json(bad)
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        f"# test\nmodel_name_or_path: {tiny_model_dir}\noutput_dir: {tmp_path / 'out'}\nsources:\n"
        f"  - {{path: {bad}}}\nreport_to: none\nbf16: false\nmax_length: 64\n"
    )
    with pytest.raises(SystemExit) as err:
        sft.main(["--config", str(recipe)])
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert "error: [sft data] 2 rows: kept 0" in message and "no assistant turn: 1" in message
    assert "unknown role: 1" in message and not (tmp_path / "out" / "manifest.json").exists()


def test_sources_and_policies_from_the_command_line(tmp_path):
    from trl import ModelConfig

    from instella_recipes.post_training.sft import CheckedSFTConfig

    common = ["--output_dir", str(tmp_path), "--bf16", "false"]
    args, _ = parse_recipe(
        [CheckedSFTConfig, ModelConfig], ["--sources", "{path: a.jsonl, repeat: 2}", "b.jsonl", *common]
    )
    assert args.sources == [{"path": "a.jsonl", "repeat": 2}, {"path": "b.jsonl"}]
    with pytest.raises(RecipeError, match="overlong must be one of"):
        parse_recipe([CheckedSFTConfig, ModelConfig], ["--overlong", "cut", *common])


def test_missing_input_model_is_a_clear_error(tmp_path, capsys):
    from instella_recipes.post_training import sft

    recipe = Path(__file__).resolve().parents[3] / "recipes" / "tiny" / "sft.yaml"
    with pytest.raises(SystemExit) as err:
        sft.main(
            ["--config", str(recipe), "--model_name_or_path", str(tmp_path / "nope"), "--output_dir", str(tmp_path)]
        )
    assert err.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_instella_recipes_match_the_published_settings():
    """SPEC.md section 2, SFT and DPO rows."""
    from trl import ModelConfig

    from instella_recipes.post_training.dpo import CheckedDPOConfig
    from instella_recipes.post_training.sft import CheckedSFTConfig

    cpu = ["--bf16", "false"]
    t, _ = parse_recipe([CheckedSFTConfig, ModelConfig], ["--config", str(RECIPES / "instella-3b/sft.yaml"), *cpu])
    args = t
    assert (t.learning_rate, t.lr_scheduler_kwargs, t.warmup_steps, t.num_train_epochs) == (
        1e-5,
        {"alpha_f": 0.001},
        500,
        3,
    )
    assert str(t.lr_scheduler_type.value) == "linear" and t.weight_decay == 0.1 and t.max_grad_norm == 1.0
    assert (t.adam_beta1, t.adam_beta2, t.adam_epsilon) == (0.9, 0.95, 1e-8)
    assert args.global_batch_size == 128 and t.max_length == 4096 and t.pad_to_multiple_of == 4096 and not t.packing
    converters_and_repeats = {(s["converter"], s.get("repeat", 1)) for s in args.sources}
    assert converters_and_repeats == {("smoltalk", 1), ("openmathinstruct2", 1), ("tulu3_persona_if", 1),
                                      ("mmlu_auxiliary_train", 1), ("o1_journey", 10)}  # fmt: skip
    t, _ = parse_recipe([CheckedDPOConfig, ModelConfig], ["--config", str(RECIPES / "instella-3b/dpo.yaml"), *cpu])
    args = t
    assert (t.learning_rate, t.warmup_steps, t.weight_decay, t.num_train_epochs, t.beta) == (5e-7, 0.1, 0.0, 1, 5.0)
    assert t.loss_type == ["dpo_norm"] and t.max_length == 2048 and t.gradient_checkpointing
    assert args.global_batch_size == 128 == t.per_device_train_batch_size * t.gradient_accumulation_steps * 8


def test_rows_without_a_training_signal_are_kept_but_a_mixture_of_only_them_is_refused(tok, caplog):
    """Issue 32: single rows without a signal (SFT: every answer empty; DPO: chosen == rejected) stay, as the
    authors keep them; more than NO_SIGNAL_WARN of them is a warning; all of them an error unless allowed."""
    from instella_recipes.post_training.checks import NO_SIGNAL_WARN

    empty = [U, {"role": "assistant", "content": " "}]
    _, report = prepare_sft_dataset(Dataset.from_list([{"messages": m} for m in [[U, A]] * 39 + [empty]]), tok, 64)
    report.check(0.0)  # 1 of 40 (2.5%): kept, no warning
    assert report.as_dict()["no_signal"] == 1 and "without a training signal: 1" in report.summary()
    assert "carry no training signal" not in caplog.text
    _, report = prepare_sft_dataset(Dataset.from_list([{"messages": m} for m in [[U, A], empty]]), tok, 64)
    report.check(0.0)
    assert f"more than {NO_SIGNAL_WARN:.0%}" in caplog.text  # 1 of 2
    _, report = prepare_sft_dataset(Dataset.from_list([{"messages": empty}] * 3), tok, 64)
    with pytest.raises(RecipeError, match=r"None of the 3 kept rows carries a training signal \(every assistant"):
        report.check(0.0)
    report.check(0.0, allow_no_signal=True)
    same = {"prompt": [U], "chosen": [A], "rejected": [A]}
    _, report = prepare_dpo_dataset(Dataset.from_list([same] * 2), tok, 64)
    with pytest.raises(RecipeError, match=r"None of the 2 kept rows .* \(chosen and rejected are the same in each"):
        report.check(0.0)


def test_chat_to_text_refuses_an_unknown_role_with_one_line(tmp_path, capsys):
    from instella_recipes.post_training.chat_to_text import main as chat_to_text_main

    with pytest.raises(ValueError, match="message 1's role is 'wizard', not one of system, user, assistant"):
        converters.chat_to_text([U, {"role": "wizard", "content": "Abracadabra."}])
    src, out = tmp_path / "chats.jsonl", tmp_path / "text.jsonl"
    Dataset.from_list([{"messages": [U, A]}, {"messages": [U, {"role": "wizard", "content": "5"}]}]).to_json(src)
    with pytest.raises(SystemExit) as err:
        chat_to_text_main(["--sources", str(src), "--output", str(out)])
    assert err.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert f"sources {src}: row " in line
    assert "(its first message 'What is 2 + 3?'): message 1's role is 'wizard'" in line
    assert not out.exists()
