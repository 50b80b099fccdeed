"""`scripts/grpo.py` with a recorder on vLLM's `LLM.generate` (tests only, run with the GRPO vLLM venv's Python by
tests/e2e/test_grpo_vllm_rollouts.py): each call's sampling settings go to $GRPO_VLLM_PROBE as one JSON line, so the
test can check that the colocated engine sampled with the recipe's settings."""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def record_sampling_settings(path: str) -> None:
    """Wrap `vllm.LLM.generate`: append {temperature, top_p, top_k, max_tokens, n, prompts} per call to `path`."""
    from vllm import LLM

    generate = LLM.generate

    def recorded(self, prompts, sampling_params=None, *args, **kwargs):
        params = sampling_params[0] if isinstance(sampling_params, list) else sampling_params
        fields = {k: getattr(params, k) for k in ("temperature", "top_p", "top_k", "max_tokens", "n")}
        with open(path, "a") as out:
            out.write(json.dumps({**fields, "prompts": len(prompts)}) + "\n")
        return generate(self, prompts, sampling_params, *args, **kwargs)

    LLM.generate = recorded


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    record_sampling_settings(os.environ["GRPO_VLLM_PROBE"])
    from instella_recipes.post_training.grpo import main

    sys.exit(main(sys.argv[1:]))
