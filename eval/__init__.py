"""Evaluation: lm-eval task suites, published numbers, the report and the speculative-decoding benchmark."""
