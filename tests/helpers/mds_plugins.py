"""Pretraining plugins for MDS tests (`--plugins tests.helpers.mds_plugins:<name>`)."""

from pathlib import Path


def drop_shard_at_start(model, plugin_args: dict) -> list:
    """Plugin: removes the file `plugin_args["drop"]` when training begins, after every start-up check (a shard lost
    while streaming reads: its background thread fails)."""
    from transformers import TrainerCallback  # the helper is imported by name from the recipe, like the library's

    class Drop(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            Path(plugin_args["drop"]).unlink()

    return [Drop()]
