"""The one check that a folder (or Hub id) is a model before anything is loaded from it, and the loader wrapper
that turns a model that does not build from its own files into one clear line."""

import re
from pathlib import Path

from instella_recipes.core import RecipeError, check_path_length, read_manifest, verify_files

from .safetensors_io import check_readable

# Any one of these makes a folder loadable with AutoTokenizer (a fast tokenizer, its config, or a slow one's vocab).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


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
    path = check_path_length(path, what)
    if allow_hub_id and looks_like_hub_id(str(path)):
        check_hub_model(str(path), what)
        return path
    if not path.exists():
        raise RecipeError(f"{what} {path} does not exist: run the stage that makes it first, or fix the path")
    if not path.is_dir():
        raise RecipeError(f"{what} {path} is a file, not a model folder: pass the folder that holds config.json")
    if not (path / "config.json").is_file():
        raise RecipeError(
            f"{what} {path} is not a model folder: it has no config.json (did the stage that writes it finish? "
            f"models are written with save_pretrained)"
        )
    manifest = read_manifest(path)
    if manifest is not None:  # a stage output: its files as the stage wrote them
        verify_files(path, manifest, what)
    else:
        check_not_unfinished(path, what)
    check_readable(path)
    return path


# What this project's training stages write into their output folder before its manifest (the manifest comes last):
# pretraining's run pin (pretraining/pretrain.py RUN_FILE), post-training's data report, checkpoints and the staging
# folder they are written in (trainer/checkpoints.py). A folder with one of them but no manifest is a stage that has
# not finished; another tool's save_pretrained folder has none of them.
RUN_FILES = ("run.json", "data_report.json", ".staging")


def check_not_unfinished(path: Path, what: str = "model folder") -> None:
    """A `RecipeError` for a model folder that holds this project's run files (`RUN_FILES`, `checkpoint-*`) but no
    manifest.json: a stage that was interrupted or is still running, whose weights may be any step's. A folder made
    elsewhere (none of those files) is used as it is."""
    found = [name for name in RUN_FILES if (path / name).exists()]
    found += sorted(p.name for p in path.glob("checkpoint-*") if p.is_dir())[:2]
    if found:
        raise RecipeError(
            f"{what} {path} is an unfinished stage output: it holds this project's run files ({', '.join(found)}) "
            f"but no manifest.json (written last, when a stage finishes): run that stage again to finish it (it "
            f"resumes), or point to a finished folder"
        )


def check_hub_model(name: str, what: str = "model", revision: str | None = None) -> None:
    """A Hub model id that resolves: its config.json is fetched (or found in the local cache offline) now, so a typo
    or an unreachable Hub is one `RecipeError` before any work, as for datasets, not the loader's traceback. A
    name that is neither a local folder nor a Hub model is said to be both."""
    # imported here: only Hub ids need them
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        hf_hub_download(name, "config.json", revision=revision)
    except GatedRepoError:
        raise RecipeError(
            f"{what} {name}: a gated model on the Hub: accept its terms on its page, then `hf auth login`"
        ) from None
    except RepositoryNotFoundError:
        raise RecipeError(
            f"{what} {name}: no local folder of that name, and no model of that name on the Hugging Face Hub (a typo? "
            f"a private model needs `hf auth login`)"
        ) from None
    except RevisionNotFoundError:
        raise RecipeError(f"{what} {name}: the Hub model has no revision {revision!r}") from None
    except LocalEntryNotFoundError:  # before EntryNotFoundError, its base class
        raise RecipeError(
            f"{what} {name}: no local folder of that name, and the Hub cannot be reached (offline, HF_HUB_OFFLINE=1, "
            f"or no network) with nothing of it in the local cache: fix the path, or download the model first"
        ) from None
    except EntryNotFoundError:
        raise RecipeError(f"{what} {name}: the Hub repository has no config.json (not a transformers model)") from None
    except HfHubHTTPError as err:
        raise RecipeError(f"{what} {name}: the Hugging Face Hub answered {_first_line(str(err))}") from None


def check_tokenizer_path(path: str | Path, what: str = "tokenizer_name_or_path") -> None:
    """A tokenizer given as a local path must exist (a typo of a folder is not a Hub id: the Hub's "Repo id must be
    in the form ..." names no fix); a Hub id is checked as a model is (`check_hub_model`)."""
    if looks_like_hub_id(str(path)):
        check_hub_model(str(path), what)
    elif not Path(path).exists():
        raise RecipeError(f"{what} {path}: folder does not exist: fix the path, or run the stage that makes it first")
    else:
        check_tokenizer_folder(path, what)


def check_tokenizer_folder(path: str | Path, what: str = "model folder", fix: str = "") -> None:
    """A local folder that `AutoTokenizer` can load from (one of `TOKENIZER_FILES`); otherwise a `RecipeError`
    naming `what` and the files looked for (`fix` says what else the user can pass). Hub ids are left alone."""
    path = Path(path)
    if path.is_dir() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise RecipeError(
            f"{what} {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save the tokenizer into it "
            f"(tokenizer.save_pretrained){fix}"
        )


def load_pretrained(load, path, what: str = "model folder", **kwargs):
    """`load(path, **kwargs)` (a `from_pretrained`), with a checkpoint that does not fit its own config.json (tensor
    shapes, missing files) turned into a `RecipeError` naming `what`, the folder and the first mismatch. Failures of
    the machine (an `OSError` with an errno: disk, permissions) pass through for the entry point to name."""
    try:
        return load(path, **kwargs)
    except OSError as err:
        if err.errno is not None:
            raise
        raise RecipeError(f"{what} {path}: {_first_line(str(err))}") from None
    except (RuntimeError, ValueError) as err:
        text = str(err)
        mismatch = re.search(r"size mismatch for ([\w.]+): copying a param with shape (.*?) from checkpoint, the "
                             r"shape in current model is (.*?)\.?$", text, re.MULTILINE)  # fmt: skip
        if mismatch:
            key, stored, wanted = mismatch.groups()
            raise RecipeError(
                f"{what} {path}: its weights do not match its config.json ({key}: {_shape(stored)} in the checkpoint, "
                f"{_shape(wanted)} from the config): restore the config.json the weights were saved with"
            ) from None
        if "mismatch" in text.lower() or "shape" in text.lower():
            raise RecipeError(
                f"{what} {path}: its weights do not match its config.json ({_first_line(text)})"
            ) from None
        raise


def _shape(text: str) -> str:
    return text.replace("torch.Size(", "").rstrip(")")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "could not be loaded"
