"""`lm_eval` in lm-eval's data-parallel mode on CPU processes (launched by the test with torchrun, one per rank).

On GPUs the data-parallel mode is `accelerate launch -m lm_eval --model hf ...` (`evaluate.py --data_parallel_size
N`): lm-eval's HFLM sees more than one process and more than one GPU, splits the requests by rank and gathers the
per-item results. Its check for "more than one device" counts GPUs only (`torch.cuda.device_count()`), so on CPU
every rank would evaluate everything. This worker lets HFLM count the ranks as its devices (only inside lm-eval's hf
module; transformers and accelerate see the real CPU), and accelerate runs on CPU (ACCELERATE_USE_CPU, set by the
test): everything else, the split, the padding of uneven shares and the gather, is lm-eval's own code path.

    torchrun --standalone --nproc_per_node 2 tests/helpers/lm_eval_dp_cpu.py --model hf --device cpu ...
"""

import os
import sys
import types

import lm_eval.models.huggingface as hf
import torch
from lm_eval.__main__ import cli_evaluate


class _Cuda(types.ModuleType):
    def __getattr__(self, name):
        return getattr(torch.cuda, name)

    def device_count(self) -> int:
        return int(os.environ["WORLD_SIZE"])


class _Torch(types.ModuleType):
    cuda = _Cuda("torch.cuda")

    def __getattr__(self, name):
        return getattr(torch, name)


if __name__ == "__main__":
    hf.torch = _Torch("torch")
    sys.argv = ["lm_eval", *sys.argv[1:]]
    cli_evaluate()
