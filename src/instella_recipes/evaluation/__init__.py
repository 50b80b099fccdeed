"""Evaluation helpers: lm-eval checks, the report against published numbers, judge inputs, speculative decoding."""
