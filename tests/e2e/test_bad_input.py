"""Bad input to the model class and the recipe parser: clear errors that name the field and the fix."""

import dataclasses
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file, save_file

from instella_recipes.core import RecipeError, parse_recipe
from instella_recipes.trainer.checks import check_global_batch, check_tokenizer_fits, fit_accumulation
from modeling_instella import InstellaConfig, InstellaForCausalLM
from tests.conftest import tiny_config
from tests.helpers.argv import overriding


def test_hidden_size_not_divisible_by_heads():
    with pytest.raises(
        StrictDataclassClassValidationError, match=r"hidden_size \(66\) is not divisible by num_attention_heads \(4\)"
    ):
        InstellaConfig(hidden_size=66, num_attention_heads=4)


def test_heads_not_divisible_by_kv_heads():
    with pytest.raises(
        StrictDataclassClassValidationError,
        match=r"num_attention_heads \(4\) is not divisible by num_key_value_heads \(3\)",
    ):
        tiny_config(num_key_value_heads=3)


def test_unknown_attention_backend():
    with pytest.raises(ValueError, match="magic_attention"):
        InstellaForCausalLM._from_config(tiny_config(), attn_implementation="magic_attention")


def test_flash_attention_without_flash_attn_names_the_gpu_extra():
    pytest.importorskip("torch")
    try:
        import flash_attn  # noqa: F401

        pytest.skip("flash-attn is installed here")
    except ImportError:
        pass
    with pytest.raises(ImportError, match=r"\[gpu\]"):
        InstellaForCausalLM._from_config(tiny_config(), attn_implementation="flash_attention_2")


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    InstellaForCausalLM(tiny_config()).save_pretrained(tmp_path)
    return tmp_path, load_file(tmp_path / "model.safetensors")


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"), "missing_keys"),
        (lambda sd: sd.update({"transformer.blocks.0.att_proj.weight": torch.zeros(3, 3)}), "unexpected_keys"),
        (lambda sd: sd.update({"model.norm.weight": torch.ones(32)}), "mismatched_keys"),
    ],
)
def test_checkpoint_that_does_not_match_is_an_error(saved, edit, field):
    folder, state = saved
    edit(state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises((ValueError, RuntimeError), match=field.split("_")[0]) as err:
        InstellaForCausalLM.from_pretrained(folder)
    if field != "mismatched_keys":  # transformers itself raises on shape mismatch, with the key and shapes
        assert "convert_checkpoint.py" in str(err.value)


def test_vocab_smaller_than_tokenizer(tiny_tokenizer):
    with pytest.raises(RecipeError, match=r"vocab_size \(100\) is smaller than the tokenizer \(512 ids"):
        check_tokenizer_fits(tiny_config(vocab_size=100), tiny_tokenizer)
    check_tokenizer_fits(tiny_config(vocab_size=512), tiny_tokenizer)


@dataclasses.dataclass
class Args:
    learning_rate: float = 1e-3
    global_batch_size: int = 8


def test_recipe_unknown_key_names_file_and_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# 1 CPU, global batch 8\nlearning_rate: 0.1\nlearning_rat: 0.2\n")
    with pytest.raises(RecipeError, match=r"r.yaml:3: unknown key 'learning_rat' \(did you mean 'learning_rate'\?\)"):
        parse_recipe([Args], ["--config", str(recipe)])


def test_recipe_cli_overrides_yaml(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps({"learning_rate": 0.1, "global_batch_size": 4}))
    (args,) = parse_recipe([Args], ["--config", str(recipe), "--learning_rate", "0.5"])
    assert args.learning_rate == 0.5 and args.global_batch_size == 4


def test_recipe_missing_file(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        parse_recipe([Args], ["--config", str(tmp_path / "nope.yaml")])


def test_global_batch_mismatch_says_how_to_fix():
    check_global_batch(1024, per_device=8, grad_accum=1, world_size=128)
    with pytest.raises(RecipeError, match="set gradient_accumulation_steps=4"):
        check_global_batch(1024, per_device=2, grad_accum=1, world_size=128)


def test_fit_global_batch_keeps_the_batch_on_another_node_count():
    """`fit_global_batch`: a job requeued on 64 of its 128 GPUs accumulates twice as many micro-batches; a GPU count
    that cannot keep the batch (96) is an error naming it, before any work."""
    assert fit_accumulation(1024, per_device=4, world_size=128) == 2
    assert fit_accumulation(1024, per_device=4, world_size=64) == 4
    with pytest.raises(RecipeError, match=r"fit_global_batch: global_batch_size 1024 .* world size \(96\)"):
        fit_accumulation(1024, per_device=4, world_size=96)


# --- issue 13: one table of bad inputs across the entry points -------------------------------------------------------
# Each case: exit code 2, the `error:` line names the field or file (the expected text), no traceback, and nothing
# that looks complete (a manifest.json) under the output folder. Built from a small world: a tiny model folder, one
# prepared pretraining folder, a few jsonl files; every case stops before any training or generation.

CHAT = {"messages": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "5"}]}
PAIR = {
    "chosen": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "5"}],
    "rejected": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "6"}],
}

EMPTY_ANSWER = {"messages": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": ""}]}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_tokenizer):
    """Inputs the cases point at (good and damaged), made once."""
    from tests.helpers.pretrain_utils import prepare_tiny

    root = tmp_path_factory.mktemp("bad_inputs")
    torch.manual_seed(0)
    model = root / "model"
    InstellaForCausalLM(tiny_config(vocab_size=len(tiny_tokenizer))).save_pretrained(model)
    tiny_tokenizer.save_pretrained(model)
    damaged = {}
    for kind in ("truncated", "random", "nan"):
        folder = root / f"model_{kind}"
        shutil.copytree(model, folder)
        weights = folder / "model.safetensors"
        if kind == "truncated":
            weights.write_bytes(weights.read_bytes()[:2000])
        elif kind == "random":
            weights.write_bytes(bytes(range(256)) * 64)
        else:
            state = load_file(weights)
            state["model.layers.0.self_attn.q_proj.weight"].view(-1)[7] = float("nan")
            save_file(state, str(weights), metadata={"format": "pt"})
        damaged[kind] = folder
    files = {
        "chat": "\n".join([json.dumps(CHAT)] * 8) + "\n",
        "pairs": "\n".join([json.dumps(PAIR)] * 8) + "\n",
        "broken_chat": json.dumps(CHAT) + "\n" + '{"messages": [{"role": "user", "content": "x"}\n',
        "broken_pairs": json.dumps(PAIR) + "\nnot json at all\n",
        "empty_answers": "\n".join([json.dumps(EMPTY_ANSWER)] * 8) + "\n",
        "same_pairs": "\n".join([json.dumps({"chosen": PAIR["chosen"], "rejected": PAIR["chosen"]})] * 8) + "\n",
    }
    paths = {}
    for name, text in files.items():
        paths[name] = root / f"{name}.jsonl"
        paths[name].write_text(text)
    paths["latin1"] = root / "latin1.jsonl"
    paths["latin1"].write_bytes(json.dumps(CHAT).encode() + b'\n{"text": "caf\xe9"}\n')
    paths["a_file"] = root / "a_file.txt"
    paths["a_file"].write_text("not a folder")
    paths.update(_token_files(root / "tokens"))
    paths["empty"] = root / "empty.jsonl"
    paths["empty"].write_text("")
    world = {"root": root, "model": model, **{f"model_{k}": v for k, v in damaged.items()}, **paths,
             "data": prepare_tiny(root / "data")}  # fmt: skip
    world.update(_issue24_world(root, model, world["data"]))
    world.update(_unfinished_world(root, model))
    return world


def _unfinished_world(root, model) -> dict:
    """Issue 32: model folders of stages that did not finish (this project's run files, no manifest): SFT killed
    after writing its weights and data report, pretraining with its run pin and a checkpoint."""
    sft = root / "unfinished_sft"
    shutil.copytree(model, sft)
    (sft / "data_report.json").write_text("{}\n")
    (sft / "trainer_state.json").write_text('{"global_step": 1}\n')
    pretrain = root / "unfinished_pretrain"
    shutil.copytree(model, pretrain)
    (pretrain / "run.json").write_text("{}\n")
    shutil.copytree(model, pretrain / "checkpoint-2")
    return {"unfinished_sft": sft, "unfinished_pretrain": pretrain}


LONG = "x" * 300  # one path component over NAME_MAX (255 bytes on Linux filesystems)
DEEP = "/".join(["d" * 200] * 21)  # a path over PATH_MAX (4096 bytes), every component within NAME_MAX


def _complete_stage(folder, model, stage: str):
    """A complete `stage` output as that stage leaves it: the model, its trainer state, data report and logs, and
    the manifest last."""
    from instella_recipes.core import write_manifest

    shutil.copytree(model, folder)
    (folder / "trainer_state.json").write_text('{"global_step": 3}\n')
    (folder / "data_report.json").write_text("{}\n")
    (folder / "runs").mkdir()
    (folder / "runs" / "events.out.tfevents").write_bytes(b"logs")
    write_manifest(folder, stage, global_step=3)
    return folder


def _issue24_world(root, model, data) -> dict:
    """Issue 24's inputs: complete outputs of several stages (which no case may change), prepared data damaged
    after its manifest was written, model folders that do not load, and recipes with duplicate keys or NaNs."""
    from instella_recipes.pretraining.pretrain import main as pretrain_main
    from tests.helpers.pretrain_utils import TINY_MODEL, pretrain_argv

    stages = ("sft", "dpo", "synthetic_gsm8k")
    out = {f"complete_{stage}": _complete_stage(root / f"complete_{stage}", model, stage) for stage in stages}
    out["release_self"] = _complete_stage(root / "release_self", model, "sft")
    out["complete_pretrain"] = root / "complete_pretrain"  # a real run: its checkpoint-2 could be resumed from
    assert pretrain_main(pretrain_argv(data, out["complete_pretrain"], max_steps=2, save_steps=2)) == 0
    out["pretrained"] = root / "pretrained"  # the same model elsewhere: SFT from it could resume that checkpoint-2
    shutil.copytree(out["complete_pretrain"], out["pretrained"], ignore=shutil.ignore_patterns("checkpoint-*"))
    for kind in ("truncated", "corrupted"):
        folder = out[f"data_{kind}"] = root / f"data_{kind}"
        shutil.copytree(data, folder)
        tokens = bytearray((folder / "tokens.bin").read_bytes())
        if kind == "truncated":
            del tokens[-128:]
        else:
            tokens[len(tokens) // 2 : len(tokens) // 2 + 8] = bytes(b ^ 0xFF for b in tokens[len(tokens) // 2 :][:8])
        (folder / "tokens.bin").write_bytes(bytes(tokens))
    out["model_no_tokenizer"] = root / "model_no_tokenizer"
    shutil.copytree(model, out["model_no_tokenizer"], ignore=shutil.ignore_patterns("tokenizer*", "special_tok*"))
    out["model_bad_shapes"] = root / "model_bad_shapes"
    shutil.copytree(model, out["model_bad_shapes"])
    config = json.loads((model / "config.json").read_text())
    (out["model_bad_shapes"] / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    out["text"] = root / "text.jsonl"
    out["text"].write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(40)))
    recipes = {
        "dup_key": "# CPU, global batch 4\nlearning_rate: 0.001\nwarmup_steps: 3\nlearning_rate: 1.0\n",
        "dup_nested_key": f"# CPU\nsources:\n  - path: {out['text']}\n    repeat: 2\n    repeat: 3\n",
        "nan_weight": f"sources:\n  - {{path: {out['text']}, weight: .nan}}\n  - {{path: {out['text']}, name: b}}\n",
        "inf_weight": f"sources:\n  - {{path: {out['text']}, weight: .inf}}\n  - {{path: {out['text']}, name: b}}\n",
    }  # fmt: skip
    for name, text in recipes.items():
        out[name] = root / f"{name}.yaml"
        out[name].write_text(text)
    out["model_config"] = lambda **fields: json.dumps({**TINY_MODEL, **fields})
    out.update(_olmo_world(root))
    out.update(_issue32_world(root, model, out["olmo_docs"]))
    out.update(_issue42_world(root))
    return out


def _issue42_world(root) -> dict:
    """Issue 42's optimizer states (`optimizer_state_from`): one saved from the tiny model with another MLP width,
    and a copy of it whose data file was cut."""
    from instella_recipes.trainer.features.optimizer_state import OPTIMIZER_DIR, save_optimizer_state
    from tests.helpers.pretrain_utils import TINY_MODEL

    model = InstellaForCausalLM(InstellaConfig(**{**TINY_MODEL, "intermediate_size": 96}))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[2, 3, 4]]), labels=torch.tensor([[2, 3, 4]])).loss.backward()
    optimizer.step()
    out = {"opt_other_shape": root / "opt_other_shape", "opt_truncated": root / "opt_truncated"}
    save_optimizer_state(model, optimizer, out["opt_other_shape"] / OPTIMIZER_DIR)
    shutil.copytree(out["opt_other_shape"], out["opt_truncated"])
    data = out["opt_truncated"] / OPTIMIZER_DIR / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:-1000])
    return out


def _issue32_world(root, model, docs) -> dict:
    """Issue 32's data: an interrupted `data_paths` run whose token file was then rewritten (same name and size,
    other tokens); olmo-layout token files with a byte flipped after their manifest (prepared by hand, and by
    `prepare_data`); a folder and a symbolic-link loop listed as token files."""
    import os

    import numpy as np

    from instella_recipes.core import write_manifest
    from instella_recipes.data.prepare import main as prepare_main
    from instella_recipes.pretraining.pretrain import main as pretrain_main

    out = {"resume_tokens": root / "resume_tokens" / "part-0-00000.npy", "resumed_run": root / "resumed_run"}
    out["resume_tokens"].parent.mkdir()
    tokens = np.arange(2, 502, dtype="<u2")
    tokens.tofile(out["resume_tokens"])
    argv = _tokens({"model": model, "root": root}, out["resumed_run"], out["resume_tokens"], save_steps=2)
    assert pretrain_main([str(a) for a in argv]) == 0
    (out["resumed_run"] / "manifest.json").unlink()  # interrupted after its checkpoint-2
    tokens[::-1].copy().tofile(out["resume_tokens"])  # same name and size, other tokens
    flipped = root / "flipped_tokens"
    flipped.mkdir()
    np.arange(2, 502, dtype="<u2").tofile(flipped / "part-0-00000.npy")
    write_manifest(flipped, "prepare_data", layout="olmo")
    _flip_byte(flipped / "part-0-00000.npy", 300)
    out["flipped_tokens"] = flipped / "part-0-00000.npy"
    out["prepared_olmo"] = root / "prepared_olmo"
    assert prepare_main([str(a) for a in _olmo(out["prepared_olmo"], docs)]) == 0
    _flip_byte(next((out["prepared_olmo"] / "s").glob("part-*.npy")), 5)
    late = np.arange(131072, dtype="<u2") % 500 + 2  # ids beyond the tokenizer outside the start-up check's samples
    late[32768:49152] = late[81920:98304] = 600  # (head, middle and tail 32768 tokens: 0, 49152 and 98304)
    out["late_bad_ids"] = root / "late_bad_ids.npy"
    late.tofile(out["late_bad_ids"])
    nonstring = {"messages": [{"role": "user", "content": 12345}, {"role": "assistant", "content": "5"}]}
    out["nonstring_chat"] = root / "nonstring_chat.jsonl"
    out["nonstring_chat"].write_text(json.dumps(nonstring) + "\n")
    out["eval_truncated"] = root / "results_2026-11-26T00-00-00.json"
    out["eval_truncated"].write_text('{"results": {"tiny_world_mc": {"acc,none": 0.5')
    out["eval_nan"] = root / "results_nan.json"
    nan = {
        "tiny_world_mc": {"acc,none": float("nan"), "acc_stderr,none": float("nan")},
        "tiny_world_arithmetic": {"exact_match,strict-match": 0.5, "exact_match_stderr,strict-match": 0.1},
    }
    out["eval_nan"].write_text(json.dumps({"results": nan}))  # json writes NaN, as lm-eval's results files hold it
    out["model_bf16"] = root / "model_bf16"
    shutil.copytree(model, out["model_bf16"])
    state = {k: v.to(torch.bfloat16) for k, v in load_file(model / "model.safetensors").items()}
    save_file(state, str(out["model_bf16"] / "model.safetensors"), metadata={"format": "pt"})
    links = root / "links"
    (links / "a_folder.npy").mkdir(parents=True)
    os.symlink("loop.npy", links / "loop.npy")
    out.update({"token_folder": links / "a_folder.npy", "token_loop": links / "loop.npy"})
    return out


def _flip_byte(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _olmo_world(root) -> dict:
    """Token files as `prepare_data --layout olmo` leaves them (a manifest beside them with their sizes), then one
    cut short by a token (an even size, so only the manifest tells) and one added after the manifest."""
    import numpy as np

    from instella_recipes.core import write_manifest

    folder = root / "olmo_tokens" / "sub"
    folder.mkdir(parents=True)
    for g in range(3):
        np.arange(2 + g, 502, dtype="<u2").tofile(folder / f"part-{g}-00000.npy")
    write_manifest(folder, "prepare_data", layout="olmo")
    cut = folder / "part-1-00000.npy"
    cut.write_bytes(cut.read_bytes()[:-2])
    np.arange(2, 502, dtype="<u2").tofile(folder / "part-9-00000.npy")
    lists = {"olmo_cut": ["sub/part-0-00000.npy", "sub/part-1-00000.npy"], "olmo_added": ["sub/part-9-00000.npy"]}
    out = {}
    for name, lines in lists.items():
        out[name] = root / "olmo_tokens" / f"{name}.txt"
        out[name].write_text("\n".join(lines) + "\n")
    out["olmo_docs"] = root / "olmo_docs.jsonl"
    out["olmo_docs"].write_text("".join(json.dumps({"id": str(i), "text": f"document {i}"}) + "\n" for i in range(9)))
    return out


def _prep(w, out, *extra, sources=None):
    base = ["--output_dir", str(out), "--sources", str(sources or w["text"]), "--train_tokenizer_vocab_size", "300",
            "--seq_len", "16", "--num_proc", "1"]  # fmt: skip
    return overriding(base, list(extra))


def _token_files(folder):
    """OLMo token files (flat uint16): one good, one of an odd size, one holding an id beyond the tiny vocabulary,
    and a path list naming a file that does not exist."""
    import numpy as np

    folder.mkdir()
    good = np.arange(2, 502, dtype="<u2")
    good.tofile(folder / "good.npy")
    (folder / "odd.npy").write_bytes(good.tobytes() + b"\0")
    np.concatenate([good, np.array([600], dtype="<u2")]).tofile(folder / "big_id.npy")
    (folder / "missing.txt").write_text("good.npy\nnot_there.npy\n")
    return {f"tokens_{p.stem}": p for p in folder.iterdir()}


def _tokens(w, out, data_paths, root="tokens", **overrides):
    from tests.helpers.token_file_utils import token_argv

    argv = token_argv(data_paths, w["model"], out, **{"max_steps": 2, "save_steps": 100, **overrides})
    return [*argv, "--data_root", str(w["root"] / root)]


def _src(path, converter="messages"):
    return json.dumps({"path": str(path), "converter": converter})


def _pretrain(w, out, **overrides):
    from tests.helpers.pretrain_utils import pretrain_argv

    data = overrides.pop("data_dir", w["data"])
    return pretrain_argv(data, out, **{"max_steps": 2, "save_steps": 100, **overrides})


def _stage2(w, out, model):
    argv = _pretrain(w, out, model_config="")
    index = argv.index("--model_config")
    return argv[:index] + argv[index + 2 :] + ["--model_name_or_path", str(model)]


def _post(w, out, model=None, source=None, converter="messages", *extra):
    return overriding(["--model_name_or_path", str(model or w["model"]), "--output_dir", str(out),
            "--sources", _src(source or w["chat" if converter == "messages" else "pairs"], converter),
            "--max_length", "64", "--per_device_train_batch_size", "2", "--num_train_epochs", "1",
            "--learning_rate", "1e-3", "--save_strategy", "no", "--report_to", "none", "--use_cpu", "true",
            "--bf16", "false", "--max_steps", "1"], list(extra))  # fmt: skip


def _sft(w, out, *extra, **kw):
    return _post(w, out, kw.get("model"), kw.get("source"), "messages", *extra)


def _dpo(w, out, *extra, **kw):
    return _post(w, out, kw.get("model"), kw.get("source"), "preference", *extra)


def _olmo(out, path, *extra, destination="s", **fields):
    """prepare_data writing the authors' token files (layout olmo) from one local source."""
    from tests.unit.data.test_dolma_tokens import TOKENIZER

    source = json.dumps({"name": "s", "path": str(path), "destination": destination, **fields})
    base = ["--layout", "olmo", "--output_dir", str(out), "--sources", source, "--tokenizer", str(TOKENIZER)]
    return overriding(base, list(extra))


def _syn(w, out, *extra):
    from tests.helpers.synthetic_fakes import SEEDS

    return overriding(["--seeds", str(SEEDS), "--output_dir", str(out), "--model", "m"], list(extra))


# (id, entry point, argv builder(world, out), text the error line must contain)
BAD_INPUTS = [
    # pretraining
    ("pretrain-negative-lr", "pretrain", lambda w, o: _pretrain(w, o, learning_rate=-0.001), "learning_rate must be >= 0"),  # noqa: E501
    ("pretrain-zero-epochs", "pretrain", lambda w, o: _pretrain(w, o, max_steps=-1, num_train_epochs=0), "num_train_epochs must be > 0"),  # noqa: E501
    ("pretrain-zero-steps", "pretrain", lambda w, o: _pretrain(w, o, max_steps=0), "max_steps must be >= 1"),
    ("pretrain-zero-batch", "pretrain", lambda w, o: _pretrain(w, o, per_device_train_batch_size=0), "per_device_train_batch_size must be >= 1"),  # noqa: E501
    ("pretrain-zero-accum", "pretrain", lambda w, o: _pretrain(w, o, gradient_accumulation_steps=0), "gradient_accumulation_steps must be >= 1"),  # noqa: E501
    ("pretrain-negative-warmup", "pretrain", lambda w, o: _pretrain(w, o, warmup_steps=-3), "warmup_steps must be >= 0"),  # noqa: E501
    ("pretrain-beta2", "pretrain", lambda w, o: _pretrain(w, o, adam_beta2=1.5), "adam_beta2 must be in [0, 1)"),
    ("pretrain-negative-wd", "pretrain", lambda w, o: _pretrain(w, o, weight_decay=-0.1), "weight_decay must be >= 0"),
    ("pretrain-eps", "pretrain", lambda w, o: _pretrain(w, o, adam_epsilon=0), "adam_epsilon must be > 0"),
    ("pretrain-grad-norm", "pretrain", lambda w, o: _pretrain(w, o, max_grad_norm=-1), "max_grad_norm must be >= 0"),
    ("pretrain-nonfinite-limit", "pretrain", lambda w, o: _pretrain(w, o, max_consecutive_nonfinite=0), "max_consecutive_nonfinite must be >= 1"),  # noqa: E501
    ("pretrain-global-batch", "pretrain", lambda w, o: _pretrain(w, o, global_batch_size=0), "global_batch_size must be >= 1"),  # noqa: E501
    ("pretrain-threads", "pretrain", lambda w, o: _pretrain(w, o, torch_num_threads=0), "torch_num_threads must be >= 1"),  # noqa: E501
    ("pretrain-seed", "pretrain", lambda w, o: _pretrain(w, o, seed=-1), "seed must be >= 0"),
    ("pretrain-logging-steps", "pretrain", lambda w, o: _pretrain(w, o, logging_steps=0), "logging_steps must be > 0"),
    ("pretrain-flag-typo", "pretrain", lambda w, o: _pretrain(w, o) + ["--learning_rat", "1"], "unknown flag '--learning_rat' (did you mean '--learning_rate'?)"),  # noqa: E501
    ("pretrain-output-is-file", "pretrain", lambda w, o: _pretrain(w, w["a_file"]), "a_file.txt"),
    ("pretrain-output-under-a-file", "pretrain", lambda w, o: _pretrain(w, w["a_file"] / "run"), "a_file.txt is a file, so no folder"),  # noqa: E501
    ("pretrain-missing-data", "pretrain", lambda w, o: _pretrain(w, o, data_dir=w["root"] / "nope"), "not a finished stage output"),  # noqa: E501
    ("pretrain-token-file-odd-size", "pretrain", lambda w, o: _tokens(w, o, w["tokens_odd"]), "odd.npy: 1001 bytes is not a whole number of uint16 tokens"),  # noqa: E501
    ("pretrain-token-list-missing-file", "pretrain", lambda w, o: _tokens(w, o, w["tokens_missing"]), "missing.txt:2: token file"),  # noqa: E501
    ("pretrain-token-id-beyond-vocab", "pretrain", lambda w, o: _tokens(w, o, w["tokens_big_id"]), "token id 600 at token 500 is >= the tokenizer's 512 ids"),  # noqa: E501
    ("pretrain-token-files-under-one-batch", "pretrain", lambda w, o: _tokens(w, o, w["tokens_good"], seq_len=128), "3 instances of 128 tokens are fewer than one global batch (4)"),  # noqa: E501
    ("pretrain-data-dir-and-paths", "pretrain", lambda w, o: [*_tokens(w, o, w["tokens_good"]), "--data_dir", w["data"]], "set one of data_dir (the output folder of scripts/prepare_data.py), data_paths (OLMo token files) or mds_streams (MDS folders), not data_dir and data_paths"),  # noqa: E501
    ("pretrain-seq-len-beyond-context", "pretrain", lambda w, o: _tokens(w, o, w["tokens_good"], seq_len=256), "seq_len 256 is longer than the model's max_position_embeddings (128)"),  # noqa: E501
    ("stage2-truncated-weights", "pretrain", lambda w, o: _stage2(w, o, w["model_truncated"]), "not a readable safetensors file"),  # noqa: E501
    ("stage2-random-weights", "pretrain", lambda w, o: _stage2(w, o, w["model_random"]), "not a readable safetensors file"),  # noqa: E501
    ("stage2-nan-weights", "pretrain", lambda w, o: _stage2(w, o, w["model_nan"]), "tensor model.layers.0.self_attn.q_proj.weight holds 1 non-finite"),  # noqa: E501
    # SFT
    ("sft-max-length", "sft", lambda w, o: _sft(w, o, "--max_length", "-1"), "max_length must be >= 1"),
    ("sft-negative-lr", "sft", lambda w, o: _sft(w, o, "--learning_rate", "-0.01"), "learning_rate must be >= 0"),
    ("sft-zero-batch", "sft", lambda w, o: _sft(w, o, "--per_device_train_batch_size", "0"), "per_device_train_batch_size must be >= 1"),  # noqa: E501
    ("sft-zero-epochs", "sft", lambda w, o: _sft(w, o, "--max_steps", "-1", "--num_train_epochs", "0"), "num_train_epochs must be > 0"),  # noqa: E501
    ("sft-lora-rank", "sft", lambda w, o: _sft(w, o, "--use_peft", "true", "--lora_r", "0"), "lora_r must be >= 1"),
    ("sft-lora-dropout", "sft", lambda w, o: _sft(w, o, "--use_peft", "true", "--lora_dropout", "1.5"), "lora_dropout must be in [0, 1)"),  # noqa: E501
    ("sft-skip-fraction", "sft", lambda w, o: _sft(w, o, "--max_skip_fraction", "2"), "max_skip_fraction must be in [0, 1]"),  # noqa: E501
    ("sft-max-samples", "sft", lambda w, o: _sft(w, o, "--max_samples", "0"), "max_samples must be >= 1"),
    ("sft-truncation-mode", "sft", lambda w, o: _sft(w, o, "--truncation_mode", "keep_end"), "truncation_mode 'keep_end' would be ignored"),  # noqa: E501
    ("sft-non-utf8-jsonl", "sft", lambda w, o: _sft(w, o, source=w["latin1"]), "latin1.jsonl:2: not UTF-8"),
    ("sft-broken-jsonl", "sft", lambda w, o: _sft(w, o, source=w["broken_chat"]), "broken_chat.jsonl:2"),
    ("sft-truncated-model", "sft", lambda w, o: _sft(w, o, model=w["model_truncated"]), "not a readable safetensors file"),  # noqa: E501
    ("sft-output-is-file", "sft", lambda w, o: _sft(w, w["a_file"]), "a_file.txt"),
    # DPO
    ("dpo-negative-beta", "dpo", lambda w, o: _dpo(w, o, "--beta", "-5"), "beta must be > 0"),
    ("dpo-loss-typo", "dpo", lambda w, o: _dpo(w, o, "--loss_type", "dpo_nrom"), "did you mean 'dpo_norm'?"),
    ("dpo-max-length", "dpo", lambda w, o: _dpo(w, o, "--max_length", "0"), "max_length must be >= 1"),
    ("dpo-truncation-mode", "dpo", lambda w, o: _dpo(w, o, "--truncation_mode", "keep_end"), "truncation_mode 'keep_end' would be ignored"),  # noqa: E501
    ("dpo-label-smoothing", "dpo", lambda w, o: _dpo(w, o, "--label_smoothing", "0.7"), "label_smoothing must be in [0, 0.5)"),  # noqa: E501
    ("dpo-broken-jsonl", "dpo", lambda w, o: _dpo(w, o, source=w["broken_pairs"]), "broken_pairs.jsonl:2"),
    ("dpo-nan-model", "dpo", lambda w, o: _dpo(w, o, model=w["model_nan"]), "non-finite value"),
    # synthetic GSM8K (before the sandbox or the server is touched)
    ("syn-program-timeout", "synthetic_gsm8k", lambda w, o: _syn(w, o, "--program_timeout", "0"), "program_timeout must be > 0"),  # noqa: E501
    ("syn-program-memory", "synthetic_gsm8k", lambda w, o: _syn(w, o, "--program_memory_mb", "-1"), "program_memory_mb must be >= 1"),  # noqa: E501
    ("syn-sandbox-workers", "synthetic_gsm8k", lambda w, o: _syn(w, o, "--sandbox_workers", "0"), "sandbox_workers must be in [1, 256]"),  # noqa: E501
    ("syn-concurrency", "synthetic_gsm8k", lambda w, o: _syn(w, o, "--max_concurrency", "0"), "max_concurrency must be >= 1"),  # noqa: E501
    ("syn-error-fraction", "synthetic_gsm8k", lambda w, o: _syn(w, o, "--max_backend_error_fraction", "1.5"), "max_backend_error_fraction must be in [0, 1]"),  # noqa: E501
    ("syn-temperature", "synthetic_gsm8k", lambda w, o: _syn(w, o, "--temperature", "-1"), "temperature must be >= 0"),
    ("syn-retries", "synthetic_gsm8k", lambda w, o: _syn(w, o, "--max_retries", "-1"), "max_retries must be >= 0"),
    # checkpoints
    ("merge-truncated-input", "merge", lambda w, o: ["--inputs", str(w["model"]), str(w["model_truncated"]), "--output_dir", str(o)], "not a readable safetensors file"),  # noqa: E501
    ("convert-random-bytes", "convert_checkpoint", lambda w, o: ["to-training", "--input", str(w["model_random"]), "--output", str(o)], "not a readable safetensors file"),  # noqa: E501
    ("release-nan-model", "release", lambda w, o: ["--model_dir", str(w["model_nan"]), "--output_dir", str(o)], "non-finite value"),  # noqa: E501
    # data preparation
    ("prepare-seq-len", "prepare_data", lambda w, o: ["--output_dir", str(o), "--sources", str(w["chat"]), "--seq_len", "1"], "seq_len must be >= 2"),  # noqa: E501
    ("prepare-non-utf8", "prepare_data", lambda w, o: ["--output_dir", str(o), "--sources", str(w["latin1"]), "--train_tokenizer_vocab_size", "300", "--seq_len", "16"], "latin1.jsonl:2: not UTF-8"),  # noqa: E501
    ("prepare-olmo-no-text", "prepare_data", lambda w, o: _olmo(o, w["chat"]), "chat.jsonl:1: no string 'id'"),
    ("prepare-olmo-output-is-file", "prepare_data", lambda w, o: _olmo(w["a_file"], w["chat"]), "a_file.txt is a file"),  # noqa: E501
    ("prepare-olmo-layout-typo", "prepare_data", lambda w, o: _olmo(o, w["chat"], "--layout", "olmoo"), "layout"),
    # evaluation and tools
    ("evaluate-task-typo", "evaluate", lambda w, o: ["--model_dir", str(w["model"]), "--tasks", "instella_tiny_arithmetc", "--check_only", "true"], "did you mean"),  # noqa: E501
    ("evaluate-limit", "evaluate", lambda w, o: ["--model_dir", str(w["model"]), "--tasks", "x", "--limit", "0"], "limit must be >= 1"),  # noqa: E501
    ("sizing-nodes", "sizing", lambda w, o: ["--nodes", "0"], "nodes must be >= 1"),
    ("sizing-mfu", "sizing", lambda w, o: ["--target_mfu", "0"], "target_mfu must be in (0, 1]"),
    ("speculative-repeats", "speculative", lambda w, o: ["--target", str(w["model"]), "--draft", str(w["model"]), "--repeats", "0"], "repeats must be >= 1"),  # noqa: E501
    ("tokenizer-vocab", "train_tokenizer", lambda w, o: ["--output_dir", str(o), "--corpus", str(w["chat"]), "--vocab_size", "0"], "vocab_size must be >= 1"),  # noqa: E501
    ("tiny-world-entities", "make_tiny_world", lambda w, o: ["--output_dir", str(o), "--n_entities", "0"], "n_entities must be >= 1"),  # noqa: E501
    ("tiny-world-long-docs", "make_tiny_world", lambda w, o: ["--output_dir", str(o), "--long_docs", "-1"], "long_docs must be >= 0"),  # noqa: E501
    # --- issue 24 ---
    # one rule for every stage's output folder: a complete output of any stage is replaced only with --overwrite
    ("sft-into-complete-sft", "sft", lambda w, o: _sft(w, w["complete_sft"]), "holds a complete 'sft' output"),
    ("dpo-into-complete-dpo", "dpo", lambda w, o: _dpo(w, w["complete_dpo"]), "holds a complete 'dpo' output"),
    ("sft-into-complete-pretrain", "sft", lambda w, o: _sft(w, w["complete_pretrain"], model=w["pretrained"]), "holds a complete 'pretrain' output"),  # noqa: E501
    ("dpo-into-complete-sft", "dpo", lambda w, o: _dpo(w, w["complete_sft"]), "holds a complete 'sft' output"),
    ("pretrain-into-complete-sft", "pretrain", lambda w, o: _pretrain(w, w["complete_sft"]), "holds a complete 'sft' output"),  # noqa: E501
    ("prepare-into-complete-sft", "prepare_data", lambda w, o: _prep(w, w["complete_sft"]), "holds a complete 'sft' output"),  # noqa: E501
    ("merge-into-complete-dpo", "merge", lambda w, o: ["--inputs", str(w["model"]), str(w["model"]), "--output_dir", str(w["complete_dpo"])], "holds a complete 'dpo' output"),  # noqa: E501
    ("release-into-complete-sft", "release", lambda w, o: ["--model_dir", str(w["model"]), "--output_dir", str(w["complete_sft"])], "holds a complete 'sft' output"),  # noqa: E501
    ("release-into-its-own-input", "release", lambda w, o: ["--model_dir", str(w["release_self"]), "--output_dir", str(w["release_self"]), "--overwrite", "true"], "is model_dir itself"),  # noqa: E501
    ("sft-into-its-own-input", "sft", lambda w, o: _sft(w, w["release_self"], "--overwrite", "true", model=w["release_self"]), "is model_name_or_path itself"),  # noqa: E501
    # manifests record sizes and checksums; readers check them
    ("pretrain-tokens-truncated", "pretrain", lambda w, o: _pretrain(w, o, data_dir=w["data_truncated"]), "tokens.bin is 39040 bytes, its manifest.json says 39168"),  # noqa: E501
    ("pretrain-tokens-corrupted", "pretrain", lambda w, o: _pretrain(w, o, data_dir=w["data_corrupted"]), "tokens.bin does not match the checksum"),  # noqa: E501
    # duplicate keys
    ("recipe-duplicate-key", "pretrain", lambda w, o: ["--config", w["dup_key"], *_pretrain(w, o)], "dup_key.yaml:4: duplicate key 'learning_rate' (first at line 2)"),  # noqa: E501
    ("recipe-duplicate-nested-key", "prepare_data", lambda w, o: ["--config", w["dup_nested_key"], *_prep(w, o)[:2], "--train_tokenizer_vocab_size", "300"], "dup_nested_key.yaml:5: duplicate key 'repeat' (first at line 4)"),  # noqa: E501
    # non-finite and absurd numbers, refused at parse time (or, for what depends on the data, before any work)
    ("merge-nan-weight", "merge", lambda w, o: ["--inputs", str(w["model"]), str(w["model"]), "--output_dir", str(o), "--weights", "nan", "1"], "weights[0] must be a finite number, got nan"),  # noqa: E501
    ("merge-inf-weight", "merge", lambda w, o: ["--inputs", str(w["model"]), str(w["model"]), "--output_dir", str(o), "--weights", "1", "inf"], "weights[1] must be a finite number, got inf"),  # noqa: E501
    ("pretrain-output-dir-unknown-placeholder", "pretrain", lambda w, o: _pretrain(w, f"{o}_{{sed}}"), "output_dir: unknown placeholder {sed} (did you mean 'seed'?)"),  # noqa: E501
    ("pretrain-nan-float", "pretrain", lambda w, o: _pretrain(w, o, label_smoothing_factor="nan"), "label_smoothing_factor must be a finite number, got nan"),  # noqa: E501
    ("sft-inf-float", "sft", lambda w, o: _sft(w, o, "--neftune_noise_alpha", "inf"), "neftune_noise_alpha must be a finite number, got inf"),  # noqa: E501
    ("pretrain-max-steps-beyond-int64", "pretrain", lambda w, o: _pretrain(w, o, max_steps=10**20), "max_steps must be an integer within int64"),  # noqa: E501
    ("sft-max-steps-beyond-int64", "sft", lambda w, o: _sft(w, o, "--max_steps", str(10**20)), "max_steps must be an integer within int64"),  # noqa: E501
    ("pretrain-max-steps-beyond-data", "pretrain", lambda w, o: _pretrain(w, o, max_steps=10**9), "max_steps 1000000000 is 13071895 passes over the 306 windows of data_dir (4 per step)"),  # noqa: E501
    ("sft-max-steps-not-an-integer", "sft", lambda w, o: _sft(w, o, "--max_steps", "1e9"), "command line: argument --max_steps/--max-steps: invalid int value: '1e9'"),  # noqa: E501
    ("sft-max-steps-beyond-data", "sft", lambda w, o: _sft(w, o, "--max_steps", str(10**8)), "max_steps 100000000 is 25000000 passes over the 8 rows"),  # noqa: E501
    ("sft-epochs-beyond-data", "sft", lambda w, o: _sft(w, o, "--max_steps", "-1", "--num_train_epochs", "1e9"), "num_train_epochs 1000000000.0 is more than"),  # noqa: E501
    ("prepare-nan-weight", "prepare_data", lambda w, o: ["--config", w["nan_weight"], *_prep(w, o)[:2], "--train_tokenizer_vocab_size", "300", "--seq_len", "16"], "nan_weight.yaml: sources[0].weight must be a finite number, got nan"),  # noqa: E501
    ("prepare-inf-weight", "prepare_data", lambda w, o: ["--config", w["inf_weight"], *_prep(w, o)[:2], "--train_tokenizer_vocab_size", "300", "--seq_len", "16"], "inf_weight.yaml: sources[0].weight must be a finite number, got inf"),  # noqa: E501
    ("sft-nan-repeat", "sft", lambda w, o: _sft(w, o)[:5] + [f"{{path: {w['chat']}, repeat: .nan}}"] + _sft(w, o)[6:], "sources[0].repeat must be a finite number, got nan"),  # noqa: E501
    ("pretrain-heads-not-dividing-hidden", "pretrain", lambda w, o: _pretrain(w, o, model_config=w["model_config"](num_attention_heads=3, num_key_value_heads=3)), "model_config: hidden_size (32) is not divisible by num_attention_heads (3)"),  # noqa: E501
    ("pretrain-kv-heads-not-dividing", "pretrain", lambda w, o: _pretrain(w, o, model_config=w["model_config"](num_key_value_heads=3)), "model_config: num_attention_heads (4) is not divisible by num_key_value_heads (3)"),  # noqa: E501
    ("pretrain-hidden-size-zero", "pretrain", lambda w, o: _pretrain(w, o, model_config=w["model_config"](hidden_size=0)), "model_config: hidden_size must be >= 1, got 0"),  # noqa: E501
    ("pretrain-nan-model-field", "pretrain", lambda w, o: _pretrain(w, o, model_config=w["model_config"](rms_norm_eps=float("nan"))), "model_config.rms_norm_eps must be a finite number, got nan"),  # noqa: E501
    # one line naming the path and the cause
    ("sft-model-without-tokenizer", "sft", lambda w, o: _sft(w, o, model=w["model_no_tokenizer"]), "model_no_tokenizer has no tokenizer"),  # noqa: E501
    ("release-model-without-tokenizer", "release", lambda w, o: ["--model_dir", str(w["model_no_tokenizer"]), "--output_dir", str(o)], "model_no_tokenizer has no tokenizer"),  # noqa: E501
    ("sft-shapes-do-not-match-config", "sft", lambda w, o: _sft(w, o, model=w["model_bad_shapes"]), "do not match its config.json"),  # noqa: E501
    ("release-shapes-do-not-match-config", "release", lambda w, o: ["--model_dir", str(w["model_bad_shapes"]), "--output_dir", str(o)], "do not match its config.json"),  # noqa: E501
    ("pretrain-output-component-too-long", "pretrain", lambda w, o: _pretrain(w, o / LONG), "is 300 bytes, over the limit of 255"),  # noqa: E501
    ("sft-output-path-too-long", "sft", lambda w, o: _sft(w, o / DEEP), "more than PATH_MAX (4096) allows"),
    ("prepare-output-component-too-long", "prepare_data", lambda w, o: _prep(w, o / LONG), "is 300 bytes, over the limit of 255"),  # noqa: E501
    ("sft-model-component-too-long", "sft", lambda w, o: _sft(w, o, model=w["root"] / LONG), "is 300 bytes, over the limit of 255"),  # noqa: E501
    ("prepare-source-component-too-long", "prepare_data", lambda w, o: _prep(w, o, sources=w["root"] / LONG / "a.jsonl"), "is 300 bytes, over the limit of 255"),  # noqa: E501
    ("prepare-output-is-a-file", "prepare_data", lambda w, o: _prep(w, w["a_file"]), "a_file.txt is a file, not a folder"),  # noqa: E501
    ("prepare-empty-jsonl", "prepare_data", lambda w, o: _prep(w, o, sources=w["empty"]), "empty.jsonl is empty (0 bytes)"),  # noqa: E501
    ("sft-empty-jsonl", "sft", lambda w, o: _sft(w, o, source=w["empty"]), "empty.jsonl is empty (0 bytes)"),
    # --- follow-up of issues 22/24: the authors' token files under the same rule and integrity records ---
    ("prepare-olmo-into-complete-sft", "prepare_data", lambda w, o: _olmo(w["complete_sft"], w["olmo_docs"]), "output_dir " + "{root}/complete_sft holds a complete 'sft' output"),  # noqa: E501
    ("prepare-olmo-destination-complete-dpo", "prepare_data", lambda w, o: _olmo(w["root"], w["olmo_docs"], destination="complete_dpo"), "source 's' destination {root}/complete_dpo holds a complete 'dpo' output"),  # noqa: E501
    ("prepare-olmo-source-inside-destination", "prepare_data", lambda w, o: _olmo(w["root"], w["olmo_docs"], destination="."), "holds source 's' path"),  # noqa: E501
    ("prepare-olmo-sample-fraction", "prepare_data", lambda w, o: _olmo(o, w["olmo_docs"], sample={"fraction": 1.5}), "source 's': sample.fraction must be in (0, 1], got 1.5"),  # noqa: E501
    ("prepare-olmo-sample-nan", "prepare_data", lambda w, o: _olmo(o, w["olmo_docs"], sample={"fraction": float("nan")}), "source 's': sample.fraction must be a finite number in (0, 1], got nan"),  # noqa: E501
    ("prepare-olmo-sample-files", "prepare_data", lambda w, o: _olmo(o, w["olmo_docs"], sample={"files": 2}), "source 's': sample.files is 2, but only 1 input files match"),  # noqa: E501
    ("prepare-olmo-sample-shape", "prepare_data", lambda w, o: _olmo(o, w["olmo_docs"], sample={"share": 0.5}), "source 's': sample must be {fraction: p}"),  # noqa: E501
    ("pretrain-token-file-cut-after-its-manifest", "pretrain", lambda w, o: _tokens(w, o, w["olmo_cut"], root="olmo_tokens"), "olmo_cut.txt:2: token file {root}/olmo_tokens/sub/part-1-00000.npy is 996 bytes, the manifest.json beside it says 998"),  # noqa: E501
    ("pretrain-token-file-added-after-its-manifest", "pretrain", lambda w, o: _tokens(w, o, w["olmo_added"], root="olmo_tokens"), "part-9-00000.npy is not one of the files the manifest.json beside it describes"),  # noqa: E501
    ("syn-into-complete-synthetic", "synthetic_gsm8k", lambda w, o: _syn(w, w["complete_synthetic_gsm8k"]), "holds a complete 'synthetic_gsm8k' output"),  # noqa: E501
    # --- issue 32: data that cannot change under a resume, every checksum checked ---
    ("pretrain-resume-on-rewritten-token-files", "pretrain", lambda w, o: _tokens(w, w["resumed_run"], w["resume_tokens"], save_steps=2), "data_paths: token file {root}/resume_tokens/part-0-00000.npy has other contents than when the checkpoints were written (same size, other tokens)"),  # noqa: E501
    ("pretrain-token-file-flipped-byte", "pretrain", lambda w, o: _tokens(w, o, w["flipped_tokens"]), "flipped_tokens/part-0-00000.npy does not match the checksum in the manifest.json beside it"),  # noqa: E501
    ("prepare-olmo-rerun-on-flipped-byte", "prepare_data", lambda w, o: _olmo(w["prepared_olmo"], w["olmo_docs"]), "part-0-00000.npy does not match the checksum in the manifest.json beside it"),  # noqa: E501
    ("pretrain-token-path-is-a-folder", "pretrain", lambda w, o: _tokens(w, o, w["token_folder"]), "a_folder.npy is a folder, not a token file"),  # noqa: E501
    ("sft-no-row-with-a-signal", "sft", lambda w, o: _sft(w, o, source=w["empty_answers"]), "None of the 8 kept rows carries a training signal (every assistant message is empty in each)"),  # noqa: E501
    ("dpo-no-row-with-a-signal", "dpo", lambda w, o: _dpo(w, o, source=w["same_pairs"]), "None of the 8 kept rows carries a training signal (chosen and rejected are the same in each)"),  # noqa: E501
    ("pretrain-token-id-beyond-vocab-after-start", "pretrain", lambda w, o: _tokens(w, o, w["late_bad_ids"], max_steps=5), "late_bad_ids.npy: an id >= the tokenizer's 512 ids in tokens"),  # noqa: E501
    ("chat-to-text-non-string-content", "chat_to_text", lambda w, o: ["--sources", w["nonstring_chat"], "--output", o / "text.jsonl"], "message 0's content is int (12345), not text"),  # noqa: E501
    ("eval-report-truncated-results", "eval_report", lambda w, o: ["--suite", "tiny_world", "--results", w["eval_truncated"], "--output_dir", o], "results_2026-11-26T00-00-00.json: not a readable lm-eval result file"),  # noqa: E501
    ("merge-float32-with-bfloat16", "merge", lambda w, o: ["--inputs", w["model"], w["model_bf16"], "--output_dir", o], "the inputs hold tensors in different dtypes (tensor lm_head.weight: float32 in {root}/model, bfloat16 in {root}/model_bf16): pass --dtype float32 or --dtype bfloat16"),  # noqa: E501
    ("pretrain-token-path-symlink-loop", "pretrain", lambda w, o: _tokens(w, o, w["token_loop"]), "loop.npy is a symbolic link that loops"),  # noqa: E501
    # --- issue 32: the first hour, second round ---
    # a misspelled or unreachable Hub model id: one line, as for datasets (the tests run with HF_HUB_OFFLINE=1)
    ("sft-hub-model-typo", "sft", lambda w, o: _sft(w, o, model="amd/Instela-3B"), "model_name_or_path amd/Instela-3B: no local folder of that name, and the Hub cannot be reached"),  # noqa: E501
    # a typo in a tokenizer folder path: not the Hub's "Repo id must be in the form"
    ("sft-tokenizer-folder-typo", "sft", lambda w, o: _sft(w, o, "--tokenizer_name_or_path", "runs/demo/mergee"), "tokenizer runs/demo/mergee: folder does not exist"),  # noqa: E501
    # a half-written input model folder (our run files, no manifest) is unfinished, not "made elsewhere"
    ("sft-from-unfinished-sft", "sft", lambda w, o: _sft(w, o, model=w["unfinished_sft"]), "unfinished_sft is an unfinished stage output: it holds this project's run files (data_report.json) but no manifest.json"),  # noqa: E501
    ("pretrain-optimizer-state-of-another-shape", "pretrain", lambda w, o: _pretrain(w, o, optimizer_state_from=w["opt_other_shape"]), "optimizer state {root}/opt_other_shape/optimizer_state: parameter model.layers.0.mlp.gate_proj.weight is [96, 32] there, [64, 32] in this model"),  # noqa: E501
    ("pretrain-optimizer-state-truncated", "pretrain", lambda w, o: _pretrain(w, o, optimizer_state_from=w["opt_truncated"]), "optimizer_state_from: optimizer state {root}/opt_truncated/optimizer_state: __0_0.distcp is"),  # noqa: E501
    ("stage2-from-unfinished-pretrain", "pretrain", lambda w, o: _stage2(w, o, w["unfinished_pretrain"]), "unfinished_pretrain is an unfinished stage output: it holds this project's run files (run.json, checkpoint-2)"),  # noqa: E501
    ("prepare-tokenizer-folder-typo", "prepare_data", lambda w, o: ["--output_dir", str(o), "--sources", str(w["text"]), "--tokenizer", "runs/demo/tokenizr", "--seq_len", "16", "--num_proc", "1"], "tokenizer runs/demo/tokenizr: folder does not exist"),  # noqa: E501
]  # fmt: skip


@pytest.mark.parametrize("entry, build, expected", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_clear_line_before_any_work(world, tmp_path, capsys, entry, build, expected):
    import importlib

    main = importlib.import_module(f"instella_recipes.scripts.{entry}").main
    out = tmp_path / "out"
    complete = {name: _snapshot(folder) for name, folder in world.items() if name.startswith(COMPLETE)}
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in build(world, out)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 2, err[-3000:]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    assert expected.replace("{root}", str(world["root"])) in lines[0]
    assert not list(tmp_path.rglob("manifest.json")) and not list(world["root"].rglob("*/out/manifest.json"))
    assert {name: _snapshot(world[name]) for name in complete} == complete  # earlier complete outputs untouched


COMPLETE = ("complete_", "release_self", "data", "model")  # the world's folders that no case may change


def _snapshot(folder) -> dict | None:
    """Every file under `folder` with its size and modification time (None for what is not a folder)."""
    if not hasattr(folder, "is_dir") or not folder.is_dir():
        return None
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


# Inputs that are not errors but must not pass silently: (id, entry point, argv builder, text on stdout, stderr or the
# log). Each exits 0.
NOTED_INPUTS = [
    ("eval-report-nan-metric", "eval_report", lambda w, o: ["--suite", "tiny_world", "--results", w["eval_nan"], "--output_dir", o], "results_nan.json: tiny_world_mc is NaN (not a number: the metric could not be computed); shown as '-'"),  # noqa: E501
    ("pipeline-bare-lm-eval-command", "pipeline", lambda w, o: ["--config", "recipes/tiny/pipeline.yaml", "--output_dir", o, "--dry_run"], "# note: `lm_eval` does not check {out}/stage1 against the checksums in its manifest.json (the pipeline does before it runs this stage); run by hand, check first: python scripts/verify_data.py --folders {out}/stage1"),  # noqa: E501
]  # fmt: skip


@pytest.mark.parametrize("entry, build, expected", [c[1:] for c in NOTED_INPUTS], ids=[c[0] for c in NOTED_INPUTS])
def test_a_doubtful_input_is_noted_in_one_line(world, tmp_path, capsys, caplog, entry, build, expected):
    import importlib

    main = importlib.import_module(f"instella_recipes.scripts.{entry}").main
    out = tmp_path / "out"
    assert main([str(a) for a in build(world, out)]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err + caplog.text
    assert expected.replace("{root}", str(world["root"])).replace("{out}", str(out)) in text, text[-3000:]


def test_a_read_only_output_location_is_named_before_any_work(tmp_path, monkeypatch):
    """Root ignores folder permissions, so a read-only mount is simulated the way the kernel reports it: no W_OK."""
    import os

    from instella_recipes.core import check_output_location

    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path))
    with pytest.raises(RecipeError, match=rf"output_dir {tmp_path}/run: {tmp_path} is not writable \(read-only\)"):
        check_output_location(tmp_path / "run")


class _HTMLHandler(BaseHTTPRequestHandler):
    """A web server's front page where an OpenAI-compatible API was expected (a proxy, a login page, a wrong port).
    `content_type` is what it claims to send: a gateway's error page labelled application/json made the client raise
    a JSONDecodeError (issue 32)."""

    content_type = "text/html"

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b"<!DOCTYPE html><html><body><h1>Welcome to nginx!</h1></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("content_type", ["text/html", "application/json"])
def test_a_server_answering_html_is_one_line_naming_it(tmp_path, capsys, content_type):
    """Synthetic GSM8K against a server that answers HTML: exit 1 (the server failed, as in an outage), one line
    naming the URL and what came back, no manifest or dataset; also when the page is labelled JSON."""
    from instella_recipes.synthetic_gsm8k.backends import OpenAIBackend, Request
    from instella_recipes.synthetic_gsm8k.run import main as synthetic_main
    from tests.helpers.synthetic_fakes import SEEDS, bwrap_problem

    handler = type("Handler", (_HTMLHandler,), {"content_type": content_type})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        (reply,) = OpenAIBackend(url, "m", max_retries=0).generate([Request([{"role": "user", "content": "hi"}])])
        assert not reply and f"the server at {url}/ answered a chat-completions request with HTML" in reply.error
        if bwrap_problem() is not None:
            pytest.skip(f"the entry point needs the sandbox: {bwrap_problem()}")
        out = tmp_path / "out"
        argv = ["--seeds", str(SEEDS), "--output_dir", str(out), "--model", "m", "--base_url", url,
                "--max_retries", "0", "--sandbox_workers", "1"]  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            synthetic_main(argv)
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 1 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert f"the server at {url}/ answered a chat-completions request with HTML" in lines[0]
    assert not (out / "manifest.json").exists() and not list(out.glob("train.*"))


class _UselessModelHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible server whose model answers every request with nothing usable."""

    def do_POST(self):  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        choices = [{"index": i, "message": {"role": "assistant", "content": "I do not know."}, "finish_reason": "stop"}
                   for i in range(request.get("n") or 1)]  # fmt: skip
        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": choices})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def test_no_seed_solved_is_exit_1_with_no_dataset(tmp_path, capsys):
    """Issue 32: synthetic GSM8K whose model solves no seed problem exits 1 (as docs/synthetic_gsm8k.md says) with
    one line naming the rejections, and writes no dataset and no manifest (it wrote an empty one, exit 0)."""
    from instella_recipes.synthetic_gsm8k.run import main as synthetic_main
    from tests.helpers.synthetic_fakes import SEEDS, bwrap_problem

    if bwrap_problem() is not None:
        pytest.skip(f"the entry point needs the sandbox: {bwrap_problem()}")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _UselessModelHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = tmp_path / "out"
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    argv = ["--seeds", str(SEEDS), "--output_dir", str(out), "--model", "m", "--max_seeds", "3", "--base_url", url,
            "--max_retries", "0", "--sandbox_workers", "1"]  # fmt: skip
    try:
        with pytest.raises(SystemExit) as exit_info:
            synthetic_main(argv)
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 1 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "no seed problem was solved (3 tried; most common rejections: abstract_unparsable" in lines[0]
    assert not (out / "manifest.json").exists() and not list(out.glob("train.*"))


def _without_use_cpu(argv: list[str]) -> list[str]:
    if "--use_cpu" in argv:
        i = argv.index("--use_cpu")
        argv = argv[:i] + argv[i + 2 :]
    return argv


@pytest.mark.parametrize(
    "entry, build",
    [("pretrain", lambda w, o: _without_use_cpu(_pretrain(w, o))), ("sft", lambda w, o: _without_use_cpu(_sft(w, o)))],
)
def test_several_cpu_processes_without_use_cpu_name_the_flag(world, tmp_path, capsys, monkeypatch, entry, build):
    """Issue 32: `torchrun --nproc_per_node 2` on a machine without a GPU and without `--use_cpu true` failed with a
    global-batch message (each process trained alone): one line naming the flag, exit 2, before any work."""
    import importlib

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(f"instella_recipes.scripts.{entry}").main([str(a) for a in build(world, tmp_path)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "2 processes (WORLD_SIZE=2: torchrun or srun) on a machine without a GPU: add --use_cpu true" in lines[0]
    assert not list(tmp_path.rglob("manifest.json"))
