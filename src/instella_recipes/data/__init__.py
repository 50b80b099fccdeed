"""Data helpers: sources and mixtures, tokenisation and packing, tokenizers, and the tiny synthetic world."""
