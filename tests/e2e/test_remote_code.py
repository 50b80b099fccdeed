"""A saved Instella folder is Hub remote code: a separate process that never imports this project loads it with
`trust_remote_code=True` and gets identical logits."""

import json
import os
import subprocess
import sys
import textwrap

import torch

from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config

# The child blocks every import of this project's packages, so only the copied modeling file can serve the model.
CHILD = textwrap.dedent(
    """
    import sys, json, torch
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("modeling_instella", "instella_recipes"):
                raise ImportError("this project must not be imported here: " + name)
    sys.meta_path.insert(0, Block())
    torch.set_num_threads(int(sys.argv[4]))  # the parent's: the matmuls' summation order, so the logits, depend on it
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True, dtype=torch.float32).eval()
    ids = torch.tensor(json.loads(sys.argv[2]))
    with torch.no_grad():
        torch.save(model(ids).logits, sys.argv[3])
    print(type(model).__module__, type(model).__name__)
    """
)


def test_saved_folder_loads_as_remote_code_in_a_clean_process(tmp_path):
    torch.manual_seed(0)
    model = InstellaForCausalLM(tiny_config()).eval()
    model.save_pretrained(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["model_type"] == "instella"
    assert config["architectures"] == ["InstellaForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "modeling_instella.InstellaConfig",
        "AutoModelForCausalLM": "modeling_instella.InstellaForCausalLM",
        "AutoModel": "modeling_instella.InstellaModel",  # beyond the published map: the base model (AutoModel)
    }
    assert (tmp_path / "model" / "modeling_instella.py").is_file()

    ids = [[5, 17, 42, 7, 99, 3]]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "hf_modules")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(tmp_path / "model"),
            json.dumps(ids),
            str(tmp_path / "logits.pt"),
            str(torch.get_num_threads()),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[0].startswith("transformers_modules.")  # the copied file, not this package
    with torch.no_grad():
        expected = model(torch.tensor(ids)).logits
    assert torch.equal(torch.load(tmp_path / "logits.pt"), expected)
