"""Post-training with TRL: SFT (`sft.py`), DPO (`dpo.py`) and GRPO (`grpo.py`), each its settings, Trainer subclass
and `main`, on top of what they share (`shared.py`: common fields, input model, output folder, pre-emption), the
Instella chat template and its label mask (`template.py`), dataset converters and the SFT mixture, the bad-input policy
(`checks.py`) and the tokenization that applies it (`tokenization.py`, `preference.py`)."""
