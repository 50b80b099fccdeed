"""Helpers the training entry points share: recipe parsing, input checks, optimizer and schedule, callbacks."""
