"""Post-training helpers shared by `recipes/sft.py` and `recipes/dpo.py`: the Instella chat template and its label
mask, dataset converters and the SFT mixture, input checks with skip counts, LoRA merge-and-save, output folders."""
