"""The end-to-end half of tests/unit/synthetic_gsm8k/test_synthetic_transformers_backend.py
(processes, whole runs, oracles); the in-process tests are there.

The local-model backend: batched `generate` with a tiny saved Instella (random weights, no chat template), wired
into the pipeline through the recipe's `backend: transformers`."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_our_checkpoint_loads_without_a_terminal(tiny_model_dir, tmp_path):
    """A folder this project saved (config with `auto_map`) in a fresh interpreter with stdin closed: transformers
    would ask "Do you wish to run the custom code? [y/N]" and fail with EOFError; the backend serves it with the
    installed Instella class instead, and generates."""
    child = (
        "import sys\n"
        "from instella_recipes.synthetic_gsm8k.backends import Request, TransformersBackend\n"
        "backend = TransformersBackend(sys.argv[1], dtype='float32', device='cpu')\n"
        "reply = backend.generate([Request([{'role': 'user', 'content': 'hi'}], temperature=0.0, max_tokens=3)])\n"
        "print(type(backend.model).__module__, len(reply[0]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    result = subprocess.run(
        [sys.executable, "-c", child, str(tiny_model_dir)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "custom code" not in result.stderr + result.stdout
    assert result.stdout.split() == ["modeling_instella.modeling_instella", "1"]
