"""Input checks that every training entry point runs before it starts work."""

from .args import RecipeError


def check_tokenizer_fits(config, tokenizer) -> None:
    """The model's embedding must have a row for every token id the tokenizer can produce."""
    n_ids = len(tokenizer)
    if config.vocab_size < n_ids:
        raise RecipeError(
            f"config.vocab_size ({config.vocab_size}) is smaller than the tokenizer ({n_ids} ids, "
            f"{getattr(tokenizer, 'name_or_path', '')}): set vocab_size >= {n_ids} in the model config "
            f"(Instella pads 50280 ids to 50304, a multiple of 64)."
        )
