"""Glue on top of transformers' `Trainer` that every training stage shares: pretraining (`pretraining/`), SFT, DPO and
GRPO (`post_training/`, through TRL's trainers, which subclass `Trainer`).

- `features/`: the training features, one module each (settings, checks, Trainer hooks), which every stage composes
  from one declared tuple: `sequence_parallel` (Ulysses), `mds_streams` (streaming's MDS rows), `optimizer_state`
  (another run's AdamW state), `fp32_reduce` (FSDP gradients reduced in fp32 under bf16), `optimizer` (weight decay
  on every parameter, the OLMo schedule with the authors' step indexing), `loss_reduction` (the loss divisor).
- `stage`: the lifecycle every training stage runs (`Stage`, `run_stage`): pre-emption, the output folder checked
  against the run's identity and claimed, one resume rule, the full-state-dict final save, the manifest last.
- `settings`: `StageSettings` (mixed into each stage's settings class) and the field roles (`run`, `data`,
  `launch`) that the run identity, the manifest and the model card read.
- `checks`: `CheckedTrainingArguments` (numeric fields range-checked at parse time), `readers` / `rows_per_step`
  (the global batch in rows), the global-batch and tokenizer-fits checks every entry point runs before any work.
- `checkpoints`: only complete, readable checkpoints are resumed from (`resume_from_checkpoint: auto`).
- `stop_requests` + `callbacks`: SIGTERM / SIGUSR1 caught from an entry point's first line, then turned into a
  checkpoint and exit 0 at the next step (`PreemptionCallback`).
- `flops`: parameter counts, FLOPs per token and MFU (the throughput plugin and the sizing tool).
- `liger`: Liger kernels for Instella (`use_liger_kernel: true`), registered in liger-kernel's own table when it loads
  (`liger_hook`).

Why it is ours: transformers and TRL leave these to the user (their extension points, mixins and callbacks, are used
here; no training loop is copied). It is its own package, below `pretraining/` and `post_training/`, so both stages
import the same code one way down and neither imports the other.
"""

from .liger_hook import install as _install_liger_hook

# Instella's Liger patch in liger-kernel's own table, so `use_liger_kernel: true` (transformers' apply_liger_kernel,
# run by the Trainer) finds it: added when liger's table loads, so this import stays light (trainer/liger_hook.py).
_install_liger_hook()
