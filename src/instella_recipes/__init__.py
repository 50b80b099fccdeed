"""instella_recipes: the library behind the entry points in `scripts/` (one concern per subpackage).

- `core`: the one bad-input error, the recipe parser (YAML + flags), atomic output folders, manifests, model-folder
  checks, logging;
- `data`: sources and mixtures, tokenise and pack, the TinyWorld demo data;
- `training`: Trainer glue (schedules, callbacks, model factory, init, MoE plugins, FLOPs);
- `post_training`: the chat template, assistant-only labels, the published SFT/DPO mixes, TRL glue;
- `checkpoint`: safetensors I/O, OLMo <-> Hub conversion, merge, DCP reshape, release folders;
- `pipeline`: the stage graph and its executors, the demo report;
- `systems`: sizing rules and collective benchmarks;
- `synthetic_gsm8k`: the 4-step generator and its sandbox;
- `evaluation`: lm-eval helpers, report, judge inputs, speculative decoding.
"""
