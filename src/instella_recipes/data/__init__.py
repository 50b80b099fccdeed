"""Data helpers: sources and mixtures, tokenisation and packing, tokenizers, the tiny synthetic world, and MDS shards
through mosaicml-streaming (`mds`, the authors' Instella-Long data)."""
