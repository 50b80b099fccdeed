"""Post-training helpers shared by `scripts/sft.py` and `scripts/dpo.py`: the Instella chat template and its label
mask, dataset converters and the SFT mixture, input checks with skip counts, LoRA merge-and-save, output folders."""
