"""Pretraining on the transformers Trainer: the run and its settings (`pretrain.py`), `PretrainTrainer`, model
construction and initialisation, the carried-over optimizer state, MoE and throughput plugins, fault injection. The
Trainer glue it shares with SFT and DPO is in `instella_recipes.trainer`."""
