"""Every command in README.md and docs/*.md works as written.

The commands are read from the Markdown itself (bash code blocks, with `\\` continuations joined and `for` loops
expanded, plus inline `python scripts/...` spans), so a new or edited line is checked without touching this file:

- the tiny ones (a `recipes/tiny/` or `recipes/zaya1/tiny_*` recipe or the demo's model, the merge of the tiny
  seeds, sizing) run for
  real, in document order (docs/pretraining.md, then docs/post_training.md, then the rest) in a scratch folder, with
  `--max_steps 2` added to training so the chain is quick; each one's inputs must come from an earlier command (the
  by-hand chain writes its own folders, `runs/tiny/<stage>`; the pages after it read the demo's, `runs/demo/<stage>`,
  as `make demo` leaves them);
- the tiny pipeline commands run with `--dry_run` (the demo itself is tests/e2e/test_pipeline_e2e.py);
- those that need a cluster, a GPU, the Hub or a placeholder (`<dir>`) parse as written: the script's own parser
  sees the documented flags and recipe (unknown flags and recipe keys are errors) and then `--help`;
- `lm_eval`: the include path exists and defines every task named; `sbatch`: the launcher and the recipe exist;
  `accelerate launch` / `torchrun`: the config file exists, the script's part parses as above; `make`: the target.
"""

import importlib
import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_FIRST = ["docs/pretraining.md", "docs/post_training.md"]  # the tiny chain: pretraining feeds post-training
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`(python scripts/[^`]+)`")
LOOP = re.compile(r"for (\w+) in ([^;\n]+);\s*do\s+(.*?)[;\s]*done", re.S)
EXTERNAL = {"squeue": "Slurm's queue", "alpaca_eval": "the judge's API", "pip": "installation", ".": "installation"}


def _strip_comment(line: str) -> str:
    """The line up to an unquoted `#` that starts a word (a shell comment)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _split(line: str) -> list[str]:
    """Shell words, with `<placeholder words>` as one word and `[optional parts]` unbracketed."""
    line = re.sub(r"<[^>]*>", "placeholder", line)
    try:
        # an empty word ('') is an argument (`--data_dir ''` unsets a recipe's value); a bare `[]` is not
        return [tok.strip("[]") for tok in shlex.split(line) if tok == "" or tok.strip("[]")]
    except ValueError:  # unbalanced quotes: not a shell command
        return []


def _block_commands(body: str) -> list[str]:
    body = re.sub(r"\\\n\s*", " ", body)
    body = "\n".join(_strip_comment(line) for line in body.splitlines())
    body = LOOP.sub(lambda m: "\n".join(m[3].replace(f"${m[1]}", v) for v in m[2].split()), body)
    return [line for line in body.splitlines() if line.strip()]


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every shell command in the docs, in document order."""
    found = []
    for doc in DOCS:
        text, rel = doc.read_text(), doc.relative_to(ROOT).as_posix()
        for lang, body in FENCE.findall(text):
            if lang in ("bash", "sh", ""):
                found += [(rel, _split(line)) for line in _block_commands(body)]
        found += [(rel, _split(cmd)) for cmd in INLINE.findall(text)]
    known = ("python", "python3", "torchrun", "accelerate", "lm_eval", "sbatch", "make", ".venv/bin/tensorboard")
    return [(where, argv) for where, argv in found if argv and (argv[0] in known or argv[0] in EXTERNAL)]


def _script_part(argv: list[str]) -> list[str]:
    """`python scripts/x.py ...`, `torchrun ... scripts/x.py ...`, `accelerate launch ... scripts/x.py ...` ->
    ["scripts/x.py", ...]."""
    start = next(i for i, tok in enumerate(argv) if tok.endswith(".py"))
    return argv[start:]


def _is_tiny(script: str, args: list[str]) -> bool:
    text = " ".join(args)
    if script == "sizing":
        return True
    if script == "merge":
        return "runs/demo/" in text or "runs/tiny/" in text
    tiny_recipe = re.search(r"--config recipes/(tiny/|zaya1/tiny_)", text)
    tiny_model = re.search(r"--model_name_or_path runs/(demo|tiny)/", text)  # a cluster recipe on a tiny model
    return bool(tiny_recipe or tiny_model) and "<" not in text


def classify(argv: list[str]) -> str:
    if argv[0] in EXTERNAL or argv[:3] == ["python3", "-m", "venv"]:
        return "external"
    if argv[0] in ("make", "sbatch", "lm_eval", ".venv/bin/tensorboard") or argv[:2] == ["python", "-m"]:
        return argv[0] if argv[0] != "python" else "module"
    script, *args = _script_part(argv)
    if argv[0] == "python" and Path(script).stem == "pipeline" and "recipes/tiny/" in " ".join(args):
        return "dry_run"
    if argv[0] == "python" and _is_tiny(Path(script).stem, args):
        return "run"
    return "parse"


COMMANDS = documented_commands()
RUN = sorted(
    {tuple(a): (w, a) for w, a in reversed(COMMANDS) if classify(a) == "run"}.values(),  # each once, first place
    key=lambda c: (RUN_FIRST.index(c[0]) if c[0] in RUN_FIRST else len(RUN_FIRST), COMMANDS.index(c)),
)
CHECKED = [(w, a) for w, a in COMMANDS if classify(a) not in ("run", "external")]


def _main(script: str):
    return importlib.import_module(f"instella_recipes.scripts.{Path(script).stem}").main


def _expect_exit_zero(main, argv):
    try:
        main(argv)
    except SystemExit as done:
        assert done.code in (0, None), f"{argv}: exit {done.code}"


def _parse_as_written(args: list[str]) -> list[str]:
    """The documented flags, less `...` (more flags of the same kind)."""
    return [tok for tok in args if tok != "..."]


def test_the_docs_hold_commands_of_every_kind():
    kinds = {classify(a) for _, a in COMMANDS}
    assert {"run", "dry_run", "parse", "lm_eval", "sbatch", "make"} <= kinds
    assert len(RUN) >= 12  # the tiny pretraining chain, SFT / DPO / LoRA SFT, ZAYA, sizing


@pytest.mark.parametrize("where, argv", CHECKED, ids=[f"{w}: {shlex.join(a)[:70]}" for w, a in CHECKED])
def test_documented_command_parses_as_written(where, argv, tmp_path, monkeypatch, capsys):
    kind = classify(argv)
    monkeypatch.chdir(ROOT)
    if kind == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        named = [a for a in argv[1:] if "=" not in a]  # `make slurm-local NODES=2`: a variable, not a target
        assert set(named) <= targets, f"{where}: no Makefile target {named}"
    elif kind == "sbatch":  # sbatch [options] <batch script> <recipe> ...
        script = next(i for i, a in enumerate(argv) if a.endswith(".sbatch"))
        assert Path(argv[script]).is_file() and (ROOT / "recipes" / f"{argv[script + 1]}.yaml").is_file(), where
    elif kind == "module":
        assert importlib.util.find_spec(argv[2]) is not None, f"{where}: no module {argv[2]}"
    elif kind == ".venv/bin/tensorboard":
        assert importlib.util.find_spec("tensorboard") is not None
        assert (Path(sys.executable).parent / "tensorboard").is_file(), "the tensorboard command is not installed"
    elif kind == "lm_eval":
        include = Path(argv[argv.index("--include_path") + 1])
        defined = set(re.findall(r"^(?:task|group|tag): *(\S+)", _yaml_text(include), re.M))
        tasks = argv[argv.index("--tasks") + 1].split(",")
        assert set(tasks) <= defined, f"{where}: tasks {set(tasks) - defined} are not defined in {include}"
    else:
        if argv[0] == "accelerate" and "--config_file" in argv:
            assert Path(argv[argv.index("--config_file") + 1]).is_file(), where
        script, *args = _script_part(argv)
        assert Path(script).is_file(), f"{where}: no {script}"
        # --help first: argparse stops there, so metavariables (`--limit N`) pass; the flags and the recipe's keys
        # are still checked (core.recipe does that before argparse runs)
        dry = [] if "--dry_run" in args else ["--dry_run"]  # a flag given twice is an error
        args = _parse_as_written(args) + dry if kind == "dry_run" else ["--help", *_parse_as_written(args)]
        _expect_exit_zero(_main(script), args)
        assert "unknown" not in capsys.readouterr().err


def _yaml_text(folder: Path) -> str:
    return "\n".join(p.read_text() for p in folder.rglob("*.yaml"))


@pytest.mark.parametrize("flag", ["--learning_rat", "--learning-rat", "--learn"])
def test_abbreviated_or_misspelt_flag_is_an_error_with_the_nearest(flag, capsys):
    """argparse would take `--learning_rat` / `--learn` as `--learning_rate` (prefix matching); ours refuse it."""
    with pytest.raises(SystemExit) as exit_info:
        _main("sft")(["--config", str(ROOT / "recipes/tiny/sft.yaml"), flag, "1e-3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"unknown flag '{flag}'" in err and re.search(r"did you mean '--learning[-_]rate'", err)
