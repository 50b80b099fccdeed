"""The end-to-end half of tests/unit/checkpoint/test_release.py
(processes, whole runs, oracles); the in-process tests are there.

`scripts/release.py`: a stage output becomes a Hub-ready folder (shards + index, auto_map + modeling file, tokenizer
with chat template, generation config, model card with the eval table) that reloads with trust_remote_code in a
process that never imports this project."""

import json
import os
import re
import subprocess
import sys
import textwrap

import torch
import yaml

from instella_recipes.checkpoint.release import main
from modeling_instella import InstellaForCausalLM
from tests.unit.checkpoint import test_release as unit_half  # fixtures and helpers both halves use

LMEVAL_RESULTS, stage_output = unit_half.LMEVAL_RESULTS, unit_half.stage_output


def test_release_folder_is_hub_ready_and_reloads_as_remote_code(stage_output, tmp_path):
    model_dir, recipe, evals = stage_output
    out = tmp_path / "release"
    main(["--model_dir", str(model_dir), "--output_dir", str(out), "--max_shard_size", "150KB"])
    main(["--model_dir", str(model_dir), "--output_dir", str(tmp_path / "r2"), "--eval_results", str(evals)])

    names = sorted(p.name for p in out.iterdir())
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) > 1 and all("-of-" in n for n in shards)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    expected = {"config.json", "modeling_instella.py", "generation_config.json", "README.md", "manifest.json"}
    assert expected <= set(names)
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "modeling_instella.InstellaConfig",
        "AutoModelForCausalLM": "modeling_instella.InstellaForCausalLM",
        "AutoModel": "modeling_instella.InstellaModel",  # beyond the published map: the base model (AutoModel)
    }
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (0, 0, 1)
    # one shard is still written as -00001-of-00001 with an index
    single = tmp_path / "r2"
    assert (single / "model-00001-of-00001.safetensors").is_file() and not (single / "model.safetensors").exists()
    assert json.loads((single / "model.safetensors.index.json").read_text())["metadata"]["total_size"] > 0

    card = (single / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert header["library_name"] == "transformers" and header["model-index"][0]["results"]
    assert str(recipe) in card and "learning_rate: 0.0001" in card and "sft.jsonl" in card  # recipe, hparams, data
    assert "| tiny_world_mc | acc | 0 | 0.6250 | 0.1000 |" in card and "sample_len" not in card
    assert "| tiny_world_arithmetic | exact_match (strict-match) | 0 | 0.2500 | - |" in card
    assert (single / "training_recipe.yaml").read_text() == recipe.read_text()

    # Reload in a fresh interpreter that cannot see this project: only the folder's own remote code.
    ids = [[0, 5, 17, 42, 99, 7]]
    with torch.no_grad():
        expected = InstellaForCausalLM.from_pretrained(model_dir)(torch.tensor(ids)).logits
    script = textwrap.dedent(
        f"""
        import json, sys
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
        model = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)
        tok = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)
        hi = [{{"role": "user", "content": "hi"}}]
        chat = tok.apply_chat_template(hi, tokenize=False, add_generation_prompt=True)
        gen = GenerationConfig.from_pretrained({str(out)!r})
        ours = ("instella_recipes", "modeling_instella")
        assert not any(m.split(".")[0] in ours for m in sys.modules), "project imported"
        logits = model(torch.tensor({ids})).logits
        print(json.dumps({{"module": type(model).__module__, "chat": chat, "pad": gen.pad_token_id,
                           "logits": logits.flatten().tolist()}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-I", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["module"].startswith("transformers_modules.")
    assert loaded["chat"] == "<|endoftext|><|user|>\nhi\n<|assistant|>\n" and loaded["pad"] == 1
    torch.testing.assert_close(torch.tensor(loaded["logits"]), expected.flatten())


# Blocks this project's packages, so only what the release folder holds can serve the card's code.
NO_PROJECT = (
    "import sys\n"
    "class _Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('modeling_instella', 'instella_recipes'):\n"
    "            raise ImportError('this project must not be imported by the model card: ' + name)\n"
    "sys.meta_path.insert(0, _Block())\n"
)


def test_every_code_block_of_the_model_card_runs_without_a_terminal(stage_output, tmp_path):
    """What a user copies from the card works as written: each ```python block runs in a fresh interpreter with
    stdin closed (a "Do you wish to run the custom code? [y/N]" question would fail), a clean environment (no
    PYTHONPATH, an empty HF cache, HF_HUB_OFFLINE=1), the Hub id standing for the released folder."""
    model_dir, _, _ = stage_output
    repo_id = "amd-demo/Instella-tiny-test"
    main(["--model_dir", str(model_dir), "--output_dir", str(tmp_path / "release"), "--repo_id", repo_id])
    blocks = re.findall(r"^```python\n(.*?)^```", (tmp_path / "release" / "README.md").read_text(), re.S | re.M)
    assert blocks and all(repo_id in block for block in blocks[:1])
    user = tmp_path / "user"  # the Hub id resolves to the released folder, as a local path in the user's folder
    (user / "amd-demo").mkdir(parents=True)
    (user / repo_id).symlink_to(tmp_path / "release")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    env.update(HF_HOME=str(tmp_path / "hf_home"), TOKENIZERS_PARALLELISM="false")
    for block in blocks:
        result = subprocess.run(
            [sys.executable, "-I", "-c", NO_PROJECT + block],
            cwd=user, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, f"card block failed:\n{block}\n{result.stderr[-3000:]}"
        # AutoTokenizer asks (on stdout) and, on EOF, falls back to a plain config: the question must not come
        assert "custom code" not in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]
