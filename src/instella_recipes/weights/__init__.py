"""Model folders on disk, below every stage that reads or writes one: the one safetensors reader/writer
(`safetensors_io`), the check that a folder (or Hub id) is a model before anything loads from it and the loader
wrapper that names a checkpoint which does not fit its config (`model_folder`), and the model built on the meta
device for shapes and parameter counts (`meta_model`)."""

from .meta_model import build_meta_model
from .model_folder import (
    check_hub_model,
    check_model_folder,
    check_tokenizer_folder,
    check_tokenizer_path,
    load_pretrained,
    looks_like_hub_id,
)
from .safetensors_io import check_finite, check_model_finite, check_readable

__all__ = [
    "build_meta_model",
    "check_finite",
    "check_model_finite",
    "check_model_folder",
    "check_readable",
    "check_hub_model",
    "check_tokenizer_folder",
    "check_tokenizer_path",
    "load_pretrained",
    "looks_like_hub_id",
]
