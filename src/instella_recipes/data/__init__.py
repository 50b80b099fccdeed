"""Data helpers: sources and mixtures, tokenisation and packing, tokenizers, the tiny synthetic world, and MDS shards
through mosaicml-streaming (`mds`, the authors' Instella-Long data; `mds_checks`, what a folder is checked for before
a run reads it; `mds_dataset`, streaming's dataset whose background errors stop the run)."""
