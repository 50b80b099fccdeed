"""The re-cut layout: what `pip install -e .` adds to a user's environment, what `recipes/` holds, and that every
entry point parses through the one recipe parser (`--help` lists `--config`; unknown flags are named)."""

import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted(p.stem for p in (ROOT / "scripts").glob("*.py") if p.stem != "__init__")


def test_only_two_top_level_import_names_are_installed():
    top_level = set(distribution("instella-recipes").read_text("top_level.txt").split())
    assert top_level == {"instella_recipes", "modeling_instella"}
    names = "'recipes', 'eval', 'benchmarks', 'scripts', 'tests'"
    probe = f"import importlib.util as u; print([n for n in ({names}) if u.find_spec(n)])"
    out = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_recipes_hold_only_yaml_jinja_and_prompts():
    """Recipes are data: YAML and templates, plus prompt files, and the authors' tokenizer and token-file lists
    (each with a README saying where it comes from)."""
    data_folders = {"prompts": {".txt", ".jsonl"}, "tokenizer": {".json", ".md"}, "token_files": {".txt", ".md"}}
    files = [p for p in (ROOT / "recipes").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    odd = [
        p for p in files if p.suffix not in {".yaml", ".jinja"} and p.suffix not in data_folders.get(p.parent.name, ())
    ]
    assert files and not odd, odd


def test_every_entry_point_is_a_console_script():
    scripts = {ep.value for ep in distribution("instella-recipes").entry_points if ep.group == "console_scripts"}
    assert {f"instella_recipes.scripts.{name}:main" for name in SCRIPTS} == scripts


def test_no_folder_in_scripts_can_shadow_a_package():
    """`python scripts/x.py` puts scripts/ first on sys.path, so any folder there is importable as a namespace package
    of its name: a `scripts/vllm/` folder made TRL believe vLLM was installed (version 'N/A') and GRPO fail to import.
    Folders in scripts/ hold shell and batch files only, and carry names no library probes."""
    scripts = Path(__file__).resolve().parents[3] / "scripts"
    folders = sorted(p.name for p in scripts.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == ["slurm"], f"new folder(s) in scripts/: {folders}; put Python helpers in the library instead"
    assert not list((scripts / "slurm").glob("*.py"))
