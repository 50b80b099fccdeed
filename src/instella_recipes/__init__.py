"""instella_recipes: the library behind the entry points in `scripts/` (one concern per subpackage).

Packages by layer, low to high; each imports only lower layers (CONTRIBUTING.md, checked by the layering test):

- 0 `core`: the one bad-input error, the recipe parser (YAML + flags), atomic output folders, manifests, logging;
- 1 `weights`: model folders on disk (safetensors I/O, the model-folder check, the meta-device model builder);
- 2 `data`: sources and mixtures, tokenise and pack, token files, the TinyWorld demo data;
  `sandbox`: the bubblewrap sandbox for generated programs;
- 3 `trainer`: Trainer glue shared by pretraining, SFT and DPO (schedules, checked arguments, callbacks,
  checkpoints, mixed precision, FLOPs);
- 4 `training`: pretraining (init, MoE plugins); `post_training`: SFT/DPO on TRL, the chat template, tokenisation
  with assistant-only labels, the published mixes;
- 5 `systems`: sizing rules and collective benchmarks; `evaluation`: lm-eval helpers and result readers, report,
  judge inputs, HumanEval, speculative decoding;
- 6 `checkpoint`: OLMo <-> Hub conversion, merge, DCP reshape, release folders; `synthetic_gsm8k`: the 4-step
  generator;
- 7 `pipeline`: the stage graph and its executors, the demo report.
"""
