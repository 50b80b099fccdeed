"""The one check that a folder (or Hub id) is a model before anything is loaded from it."""

from pathlib import Path

from .errors import RecipeError


def looks_like_hub_id(name: str) -> bool:
    """`org/name` that is not a local path: left to `from_pretrained` (and the Hub) to resolve."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not Path(name).exists()


def check_model_folder(path: str | Path | None, what: str = "model folder", allow_hub_id: bool = False) -> Path:
    """`path` as a Path when it is a folder holding `config.json`; otherwise a `RecipeError` that names `what`
    (the field or role, e.g. `model_name_or_path`, `draft`) and says how to fix it. Its safetensors files must
    open (headers only: a truncated or random-bytes file is named here, not as a traceback from the loader)."""
    if path is None or str(path) == "":
        raise RecipeError(
            f"{what} is not set: point it at a model folder (a stage output or a save_pretrained folder)"
        )
    if allow_hub_id and looks_like_hub_id(str(path)):
        return Path(path)
    path = Path(path)
    if not path.exists():
        raise RecipeError(f"{what} {path} does not exist: run the stage that makes it first, or fix the path")
    if not path.is_dir():
        raise RecipeError(f"{what} {path} is a file, not a model folder: pass the folder that holds config.json")
    if not (path / "config.json").is_file():
        raise RecipeError(
            f"{what} {path} is not a model folder: it has no config.json (did the stage that writes it finish? "
            f"models are written with save_pretrained)"
        )
    from instella_recipes.checkpoint.safetensors_io import check_readable  # torch: only once a folder is checked

    check_readable(path)
    return path
