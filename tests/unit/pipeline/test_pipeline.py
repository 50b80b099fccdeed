"""The pipeline engine (`scripts/pipeline.py`, `instella_recipes/pipeline/`) on cheap dummy stages: order, matrix
expansion,
skip-when-complete, re-run of changed stages and their dependents, failures naming the stage and its log, and
`--stage` checking its inputs first."""

import textwrap
from pathlib import Path

import pytest
import yaml

from instella_recipes.core import RecipeError
from instella_recipes.pipeline.cli import main
from instella_recipes.pipeline.graph import load_pipeline
from instella_recipes.pipeline.runner import read_record, status_text

# A stand-in entry point: appends its name to a shared journal, optionally fails, writes a manifest last.
# Plain json (no project imports) so each stage costs one bare Python start.
DUMMY = textwrap.dedent(
    """
    import argparse, json, sys
    from pathlib import Path
    p = argparse.ArgumentParser()
    p.add_argument("--name"); p.add_argument("--output_dir"); p.add_argument("--journal"); p.add_argument("--config")
    p.add_argument("--inputs", nargs="*", default=[]); p.add_argument("--value", default="0")
    p.add_argument("--fail", default="0"); p.add_argument("--no_manifest", default="0")
    a = p.parse_args()
    for folder in a.inputs:
        assert (Path(folder) / "manifest.json").is_file(), folder
    with open(a.journal, "a") as j:
        j.write(a.name + "\\n")
    print(f"stage {a.name} working\\rstep 1\\rstep 2")
    if a.fail == "1":
        print("something broke", file=sys.stderr)
        sys.exit(3)
    out = Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "value.txt").write_text(a.value)
    if a.config:
        (out / "recipe.yaml").write_text(Path(a.config).read_text())
    if a.no_manifest != "1":
        (out / "manifest.json").write_text(json.dumps({"stage": a.name, "inputs": a.inputs}))
    """
)


def write_pipeline(tmp_path: Path, body: str) -> Path:
    (tmp_path / "dummy.py").write_text(DUMMY)
    (tmp_path / "recipe.yaml").write_text("# dummy recipe\nvalue: 1\nmodel: {hidden: 64, layers: 2}\n")
    path = tmp_path / "pipeline.yaml"
    text = textwrap.dedent(body).replace("DUMMY", str(tmp_path / "dummy.py")).replace("JOURNAL", str(tmp_path / "j"))
    path.write_text(text.replace("RECIPE", str(tmp_path / "recipe.yaml")))
    return path


GRAPH = """
    # dummy pipeline: YAML order differs from the dependency order on purpose
    output_dir: OUT
    vars: {fail_sft: 0, value: 1}
    stages:
      - name: sft
        command: DUMMY
        inputs: [merge]
        args: {name: sft, inputs: ["{merge}"], output_dir: "{output}", journal: JOURNAL, fail: "{fail_sft}"}
      - name: data
        command: DUMMY
        recipe: RECIPE
        args: {name: data, output_dir: "{output}", journal: JOURNAL}
      - name: stage2
        matrix: {seed: [11, 22, 33]}
        command: DUMMY
        inputs: [data]
        args: {name: "stage2_{seed}", value: "{seed}", output_dir: "{output}", journal: JOURNAL}
      - name: merge
        command: DUMMY
        inputs: [stage2]
        args: {name: merge, inputs: "{stage2}", value: "{value}", output_dir: "{output}", journal: JOURNAL}
      - name: report
        command: DUMMY
        inputs: [sft, data]
        writes_manifest: false
        args: {name: report, output_dir: "{output}", journal: JOURNAL, no_manifest: 1}
"""


@pytest.fixture
def graph(tmp_path):
    return write_pipeline(tmp_path, GRAPH.replace("OUT", str(tmp_path / "run")))


def journal(tmp_path) -> list[str]:
    path = tmp_path / "j"
    return path.read_text().split() if path.exists() else []


def test_graph_order_matrix_and_placeholders(graph, tmp_path):
    pipeline = load_pipeline(graph)
    assert [s.name for s in pipeline.stages] == [
        "data", "stage2_11", "stage2_22", "stage2_33", "merge", "sft", "report",
    ]  # fmt: skip
    assert pipeline.groups == {"stage2": ["stage2_11", "stage2_22", "stage2_33"]}
    merge = pipeline.stage("merge").resolved.argv
    run = tmp_path / "run"
    i = merge.index("--inputs")
    assert merge[i + 1 : i + 4] == [str(run / f"stage2_{s}") for s in (11, 22, 33)]
    data = pipeline.stage("data").resolved.argv
    assert data[2:4] == ["--config", str(tmp_path / "recipe.yaml")]  # the recipe comes right after the script
    assert [s.name for s in pipeline.select("stage2")] == ["stage2_11", "stage2_22", "stage2_33"]
    assert load_pipeline(graph, tmp_path / "elsewhere").output_of(pipeline.stage("sft")) == tmp_path / "elsewhere/sft"


def test_recipe_overrides_are_merged_into_a_recorded_recipe(tmp_path):
    graph = write_pipeline(
        tmp_path,
        f"""
        # dummy
        output_dir: {tmp_path / "run"}
        vars: {{layers: 4}}
        stages:
          - name: train
            command: DUMMY
            recipe: RECIPE
            recipe_overrides: {{model: {{layers: "{{layers}}"}}, data: ["{{run}}/x.jsonl"]}}
            args: {{name: train, output_dir: "{{output}}", journal: JOURNAL}}
        """,
    )
    assert main(["--config", str(graph)]) == 0
    used = (tmp_path / "run" / "train" / "recipe.yaml").read_text()
    assert used.startswith("# dummy recipe\n# ") and "overrides of stage 'train'" in used
    assert yaml.safe_load(used) == {
        "value": 1,
        "model": {"hidden": 64, "layers": 4},
        "data": [f"{tmp_path}/run/x.jsonl"],
    }
    assert main(["--config", str(graph), "--set", "layers=6"]) == 0  # a changed override re-runs the stage
    assert journal(tmp_path) == ["train", "train"]
    assert yaml.safe_load((tmp_path / "run" / "train" / "recipe.yaml").read_text())["model"]["layers"] == 6


def test_failure_names_stage_and_log_and_stops(graph, tmp_path, capsys):
    assert main(["--config", str(graph), "--set", "fail_sft=1"]) == 1
    err = capsys.readouterr().err
    log = tmp_path / "run" / "logs" / "sft.log"
    assert "stage 'sft' failed: exited with code 3" in err and str(log) in err
    assert "something broke" in err and "something broke" in log.read_text()
    assert "report" not in journal(tmp_path)  # nothing after the failed stage ran
    assert not (tmp_path / "run" / "sft" / "manifest.json").exists()
    pipeline = load_pipeline(graph)
    assert read_record(pipeline.stage("sft"))["status"] == "failed"

    # fixed: the next run skips what is complete and finishes the rest
    assert main(["--config", str(graph)]) == 0
    assert journal(tmp_path)[-2:] == ["sft", "report"] and journal(tmp_path).count("merge") == 1


def test_stage_without_manifest_is_a_failure(tmp_path, capsys):
    graph = write_pipeline(
        tmp_path,
        f"""
        output_dir: {tmp_path / "run"}
        stages:
          - name: train
            command: DUMMY
            args: {{name: train, output_dir: "{{output}}", journal: JOURNAL, no_manifest: 1}}
        """,
    )
    assert main(["--config", str(graph)]) == 1
    assert "stage 'train' failed: exited 0 but wrote no manifest.json" in capsys.readouterr().err


def test_single_stage_checks_its_inputs_first(graph, tmp_path, capsys):
    with pytest.raises(SystemExit, match="2"):
        main(["--config", str(graph), "--stage", "merge"])
    err = capsys.readouterr().err
    assert "stage 'merge' needs the output of stage 'stage2_11'" in err and "--stage stage2\n" in err
    assert journal(tmp_path) == []

    assert main(["--config", str(graph), "--stage", "data", "--stage", "stage2"]) == 0
    assert main(["--config", str(graph), "--stage", "merge"]) == 0
    assert journal(tmp_path) == ["data", "stage2_11", "stage2_22", "stage2_33", "merge"]
    assert main(["--config", str(graph), "--stage", "merge"]) == 0  # complete: skipped
    assert main(["--config", str(graph), "--stage", "merge", "--force"]) == 0
    assert journal(tmp_path)[-2:] == ["merge", "merge"]


def test_dry_run_prints_commands_and_status(graph, capsys):
    assert main(["--config", str(graph), "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "# data: missing" in out and "# merge: waiting" in out and "--name stage2_22" in out


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("  - name: a\n    command: DUMMY\n    imputs: [b]\n", "pipeline.yaml:5: unknown stage key 'imputs'"),
        ("  - name: a\n    command: DUMMY\n    inputs: [b]\n", "stage 'a' has unknown input 'b'"),
        (
            "  - name: a\n    command: DUMMY\n    inputs: [b]\n  - name: b\n    command: DUMMY\n    inputs: [a]\n",
            "cycle among: a, b",
        ),
        ("  - name: a\n    command: DUMMY\n    args: {x: '{nope}'}\n", "unknown placeholder {nope}"),
        ("  - name: a\n    command: DUMMY\n    recipe: missing.yaml\n", "recipe missing.yaml does not exist"),
        ("  - name: a\n    command: nothere.py\n", "entry point nothere.py does not exist"),
        ("  - name: a\n    command: DUMMY\n    output: ../escape\n", "must be a folder inside the output_dir"),
        (
            "  - name: a\n    command: DUMMY\n    command: OTHER\n",
            "pipeline.yaml:5: duplicate key 'command'",
        ),
    ],
)
def test_bad_pipeline_files_are_clear_errors(tmp_path, body, message):
    graph = write_pipeline(tmp_path, "# bad\nstages:\n" + body)
    with pytest.raises(RecipeError, match=message.replace("{", r"\{").replace("}", r"\}")):
        load_pipeline(graph)


def test_shipped_pipelines_resolve(tmp_path, capsys):
    """The demo and the published-run graphs load, name real recipes and entry points, and order their stages."""
    tiny = load_pipeline("recipes/tiny/pipeline.yaml", tmp_path / "demo")
    names = [s.name for s in tiny.stages]
    assert names[:5] == ["data", "tokenizer", "prepare", "stage1", "stage2_5796"] and names[-1] == "report"
    assert names.index("merge") < names.index("sft") < names.index("dpo") < names.index("eval_dpo")
    assert {"eval_stage1", "eval_merge", "eval_sft", "eval_dpo", "draft", "speculative", "release"} <= set(names)
    assert tiny.output_dir == tmp_path / "demo" and load_pipeline("recipes/tiny/pipeline.yaml").output_dir.parts == (
        "runs",
        "demo",
    )
    published = load_pipeline("recipes/instella-3b/pipeline.yaml", tmp_path / "i3b")
    stage1 = published.stage("stage1").resolved.argv
    assert stage1[1:4] == ["launch", "--config_file", "accelerate_configs/fsdp2_hybrid_shard_16x8_mi300x.yaml"]
    assert "recipes/instella-3b/pretrain_stage1.yaml" in stage1
    assert [s.values["seed"] for s in published.select("stage2")] == [5796, 6198, 8915]
    assert main(["--config", "recipes/instella-3b/pipeline.yaml", "--output_dir", str(tmp_path), "--dry_run"]) == 0
    assert "# sft: waiting" in capsys.readouterr().out


# A stage that records its pid (and, with --child, the pid of a process it starts) and then works for a long time.
SLEEPER = textwrap.dedent(
    """
    import argparse, os, subprocess, sys, time
    from pathlib import Path
    p = argparse.ArgumentParser(); p.add_argument("--pid_file"); p.add_argument("--output_dir")
    a = p.parse_args()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    Path(a.pid_file + ".partial").write_text(f"{os.getpid()} {child.pid}")
    os.replace(a.pid_file + ".partial", a.pid_file)
    time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie may wait for a busy init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _wait_until(predicate, limit: float = 60.0) -> bool:
    import time

    deadline = time.monotonic() + limit
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def _default_sigint() -> None:
    """The runner starts with SIGINT at its default, as from a terminal: a suite launched in the background (`cmd &`
    in a non-interactive shell) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_runner(tmp_path: Path, name: str):
    import os
    import subprocess
    import sys

    (tmp_path / "sleeper.py").write_text(SLEEPER)
    graph = tmp_path / "slow.yaml"
    graph.write_text(
        f"output_dir: {tmp_path / 'run'}\nstages:\n  - name: slow\n    command: {tmp_path / 'sleeper.py'}\n"
        f"    args: {{pid_file: {tmp_path / name}, output_dir: '{{output}}'}}\n"
    )
    root = Path(__file__).resolve().parents[3]
    runner = subprocess.Popen(
        [sys.executable, str(root / "scripts" / "pipeline.py"), "--config", str(graph)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=_default_sigint,
    )  # fmt: skip
    assert _wait_until(lambda: (tmp_path / name).is_file()), runner.communicate(timeout=5)
    return graph, runner, [int(x) for x in (tmp_path / name).read_text().split()]


def test_progress_line_keeps_the_start_of_a_log_line_and_the_end_of_a_bar():
    log = "[INFO|trainer.py:1618] 2026-11-24 15:59:11,382 >> ***** Running training *****"
    assert status_text(log) == "[INFO] ***** Running training *****"
    long = (
        "[INFO|instella_recipes.post_training.run] [sft data] 424 rows: kept 424 (truncated to max_length: 0); x" * 2
    )
    assert status_text(long) == long[:39] + "…" + long[-40:]
    bar = "tokenize SFT: 100%|" + "█" * 80 + "| 424/424 [00:00<00:00, 1705.76 examples/s]"
    shown = status_text(bar)
    assert shown.startswith("tokenize SFT") and shown.endswith("1705.76 examples/s]") and "…" in shown


def test_each_stage_is_resolved_and_rendered_once_per_invocation(tmp_path, monkeypatch, capsys):
    """One pipeline invocation resolves (argv, env, merged recipe, paths) and renders each stage's recipe exactly
    once, however often the runner checks a stage's status; the Slurm job (`run_job`) likewise."""
    from instella_recipes.pipeline import graph as graph_module
    from instella_recipes.pipeline.slurm import run_job

    resolved, rendered = [], []
    resolve, render = graph_module.resolve_stage, graph_module.render_recipe
    monkeypatch.setattr(graph_module, "resolve_stage", lambda p, s: resolved.append(s.name) or resolve(p, s))
    monkeypatch.setattr(graph_module, "render_recipe", lambda p, s, v=None: rendered.append(s.name) or render(p, s, v))
    body = GRAPH.replace("OUT", str(tmp_path / "run")).replace(
        "recipe: RECIPE\n", 'recipe: RECIPE\n        recipe_overrides: {value: "{value}"}\n'
    )
    path = write_pipeline(tmp_path, body)
    names = ["data", "stage2_11", "stage2_22", "stage2_33", "merge", "sft", "report"]
    for argv in ([], ["--dry_run"], []):  # a full run, a plan, a run that skips everything
        resolved.clear(), rendered.clear()
        assert main(["--config", str(path), *argv]) == 0
        assert sorted(resolved) == sorted(names) and rendered == ["data"]  # only `data` has recipe_overrides
    resolved.clear(), rendered.clear()
    job = ["--config", str(path), "--output_dir", str(tmp_path / "run"), "--stage", "data", "--set", "value=3"]
    assert run_job(job) == 0  # a changed var: the job runs its stage again, from the one resolution
    assert sorted(resolved) == sorted(names) and rendered == ["data"]
    assert "value: 3" in (tmp_path / "run" / "data" / "recipe.yaml").read_text()


@pytest.mark.parametrize("which", ["pipeline", "slurm job"])
def test_a_set_without_equals_is_the_same_clear_error_everywhere(graph, tmp_path, capsys, which):
    """`scripts/pipeline.py` and the Slurm job read `--set` with one parser (`core.variables.parse_assignments`)."""
    from instella_recipes.pipeline.slurm import run_job

    argv = ["--config", str(graph), "--output_dir", str(tmp_path / "run"), "--set", "value"]
    with pytest.raises(SystemExit, match="2"):
        main(argv) if which == "pipeline" else run_job([*argv, "--stage", "data"])
    assert capsys.readouterr().err.strip() == "error: --set expects VAR=VALUE, got 'value'"
    assert journal(tmp_path) == []


def test_placeholders_are_one_syntax_with_a_named_error():
    """The one placeholder function (pipeline YAMLs and pretraining's `output_dir: runs/stage2_{seed}`)."""
    from instella_recipes.core import fill_placeholders

    assert fill_placeholders("runs/stage2_{seed}", {"seed": 5796}, "output_dir") == "runs/stage2_5796"
    assert fill_placeholders('{"a": 1} {}', {}, "x") == '{"a": 1} {}'  # not a placeholder: left as it is
    with pytest.raises(RecipeError, match=r"^output_dir: unknown placeholder \{sed\} \(did you mean 'seed'\?\)$"):
        fill_placeholders("runs/stage2_{sed}", {"seed": 5796}, "output_dir")
