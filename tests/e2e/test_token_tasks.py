"""`prepare_data --layout olmo --executor local --tasks N`: the groups spread over datatrove tasks write the bytes of
the one-process run for any N; a killed task reruns alone (finished tasks are skipped by datatrove's completion
markers, finished groups by ours); a node without an input file or with another tokenizer, and a second run on the
same output, stop with one line and leave nothing that looks complete."""

import fcntl
import json
import shutil
from pathlib import Path

import pytest

from instella_recipes.core import RecipeError
from instella_recipes.data import dolma_tokens
from instella_recipes.data.prepare import main as prepare_main
from instella_recipes.data.token_tasks import PLAN, TokenGroupsStep, assigned, tasks_root
from tests.helpers.argv import overriding
from tests.unit.data.test_dolma_tokens import TOKENIZER, write_documents

SETTINGS = ["--processes", "3", "--max_size", "6000", "--batch_size", "3"]


def two_source_argv(tmp_path: Path, out: Path, *extra: str, tokenizer: Path = TOKENIZER) -> list[str]:
    """Two sources (3 and 2 groups: 5 groups for the tasks to share), the olmo layout."""
    sources = [
        {"name": "a", "path": str(tmp_path / "docs"), "data_files": ["*"], "destination": "web/a"},
        {"name": "b", "path": str(tmp_path / "more"), "data_files": ["*"], "destination": "b", "processes": 2},
    ]
    argv = overriding(
        ["--layout", "olmo", "--output_dir", str(out), "--tokenizer", str(tokenizer), *SETTINGS], list(extra)
    )
    return argv + [item for s in sources for item in ("--sources", json.dumps(s))]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    write_documents(tmp / "docs", seed=1)
    write_documents(tmp / "more", seed=2)
    return tmp


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file under output_dir, manifests without their time stamp (nor, in the root's, the checksums of the
    destinations' manifests, which hold theirs)."""
    files = {}
    for path in sorted(out.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "manifest.json":
                record = json.loads(data)
                record.pop("finished_at")
                described = record["integrity"]["files"]
                for name in [n for n in described if n.endswith("/manifest.json")]:
                    described[name].pop("xxh3_128")
                data = json.dumps(record, sort_keys=True).encode()
            files[str(path.relative_to(out))] = data
    return files


@pytest.fixture(scope="module")
def one_process(corpus):
    out = corpus / "one"
    assert prepare_main(two_source_argv(corpus, out)) == 0
    return snapshot(out)


def test_groups_go_round_robin_over_the_tasks():
    items = [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]]
    assert assigned(items, 0, 2) == [[0, 0], [0, 2], [1, 1]] and assigned(items, 1, 2) == [[0, 1], [1, 0]]
    assert sum((assigned(items, r, 3) for r in range(3)), []) == [items[i] for i in (0, 3, 1, 4, 2)]


@pytest.mark.parametrize("tasks", [1, 2, 3])
def test_any_number_of_tasks_writes_the_one_process_bytes(corpus, one_process, tasks):
    """Token files, their metadata, every manifest and token_files.txt: the same bytes for 1, 2 and 3 tasks."""
    out = corpus / f"tasks{tasks}"
    assert prepare_main(two_source_argv(corpus, out, "--executor", "local", "--tasks", str(tasks))) == 0
    got = snapshot(out)
    assert got == one_process
    assert len([k for k in got if k.endswith(".npy")]) >= 5 and "token_files.txt" in got
    run = next(tasks_root(out).glob(f"*/{PLAN}")).parent
    assert sorted(p.name for p in (run / "datatrove" / "completions").iterdir()) == [f"{r:05d}" for r in range(tasks)]
    stats = json.loads((run / "datatrove" / "stats.json").read_text())
    (step,) = stats  # datatrove's stats of every task, merged: groups and tokens per group
    manifest = json.loads((out / "manifest.json").read_text())
    assert step["stats"]["groups"] == 5 and step["stats"]["tokens"]["total"] == manifest["total_tokens"]


@pytest.mark.parametrize(
    "extra", [["--num_proc", "2"], ["--executor", "local", "--tasks", "2", "--workers", "2", "--num_proc", "2"]]
)
def test_forked_workers_and_tasks_write_the_one_process_bytes(corpus, one_process, extra):
    """`num_proc` workers and datatrove's parallel workers are forked (group_writer.py says why): same bytes."""
    out = corpus / ("_".join(extra).replace("-", ""))
    assert prepare_main(two_source_argv(corpus, out, *extra)) == 0
    assert snapshot(out) == one_process


def _kill_group(monkeypatch, victim: int) -> None:
    original = dolma_tokens.write_group

    def dies(group, paths, *args, **kwargs):
        if group == victim and "more" in paths[0]:
            raise KeyboardInterrupt  # as a killed task: no completion marker, no group record
        return original(group, paths, *args, **kwargs)

    monkeypatch.setattr(dolma_tokens, "write_group", dies)


def test_a_killed_task_reruns_alone_and_the_finished_ones_are_skipped(corpus, one_process, monkeypatch, capsys):
    """Task 1 of 2 dies in its second group (source b's group 0; items a0 b0 | a1 b1 | a2 -> task 1 has a1, b0):
    nothing looks complete; the rerun skips task 0 (its files untouched) and rewrites only the killed group."""
    out = corpus / "killed"
    argv = two_source_argv(corpus, out, "--executor", "local", "--tasks", "2")
    _kill_group(monkeypatch, 0)
    with pytest.raises(SystemExit) as stopped:  # Ctrl-C: one line, exit 130 (core/errors.py)
        prepare_main(argv)
    assert stopped.value.code == 130
    monkeypatch.undo()
    assert not (out / "manifest.json").exists() and not (out / "token_files.txt").exists()
    assert not (out / "web" / "a").exists() and not (out / "b").exists()  # only partial folders
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.npy")}
    assert prepare_main([*argv, "--status", "true"]) == 0
    status = capsys.readouterr().out
    assert "1 of 2 tasks done; not done: [1]" in status and "not complete" in status
    assert prepare_main(argv) == 0
    assert snapshot(out) == one_process
    after = {p.name: p.stat().st_mtime_ns for p in out.rglob("*.npy")}
    kept = {p.name: t for p, t in before.items()}
    assert all(after[name] == t for name, t in kept.items() if name.startswith("part-0-") or "web" in name)


def test_a_node_without_an_input_file_or_with_another_tokenizer_stops_with_one_line(corpus, monkeypatch, tmp_path):
    """What only a task's node can see: its tokenizer file differs from the planned one, an input file is missing.
    One error naming the node and file; the run's other groups stay, and the rerun finishes."""
    docs = tmp_path / "docs"
    shutil.copytree(corpus / "docs", docs)
    shutil.copytree(corpus / "more", tmp_path / "more")
    tok = tmp_path / "tokenizer.json"
    shutil.copy(TOKENIZER, tok)
    out = tmp_path / "out"
    argv = two_source_argv(tmp_path, out, "--executor", "local", "--tasks", "2", tokenizer=tok)
    _kill_group(monkeypatch, 0)
    with pytest.raises(SystemExit) as stopped:  # Ctrl-C: one line, exit 130 (core/errors.py)
        prepare_main(argv)
    assert stopped.value.code == 130
    monkeypatch.undo()
    plan_file = next(tasks_root(out).glob(f"*/{PLAN}"))
    step = TokenGroupsStep(str(plan_file))

    other = json.loads(TOKENIZER.read_text())
    other["added_tokens"][-1]["content"] += "x"
    tok.write_text(json.dumps(other))
    with pytest.raises(RecipeError, match="is not the one this run was planned with"):
        step.run(rank=1, world_size=2)
    shutil.copy(TOKENIZER, tok)

    moved = sorted(docs.iterdir())[0]
    moved.rename(tmp_path / moved.name)
    with pytest.raises(RecipeError, match=f"input file {moved} is missing on"):
        step.run(rank=1, world_size=2)
    (tmp_path / moved.name).rename(moved)
    assert not (out / "manifest.json").exists()
    assert prepare_main(argv) == 0
    assert (out / "manifest.json").is_file()


def test_a_second_run_on_the_same_output_is_refused(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    lock = tasks_root(out) / "lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "a+") as handle:
        handle.write("pid 1 on elsewhere")
        handle.flush()
        fcntl.flock(handle, fcntl.LOCK_EX)
        with pytest.raises(SystemExit) as err:
            prepare_main(two_source_argv(corpus, out, "--executor", "local", "--tasks", "2"))
    assert err.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert "is being written by another prepare_data run (pid 1 on elsewhere); wait for it to end" in line
    assert not out.exists()


def test_tasks_need_an_executor_and_the_olmo_layout():
    with pytest.raises(SystemExit) as err:
        prepare_main(["--layout", "olmo", "--output_dir", "x", "--tasks", "2"])
    assert err.value.code == 2
    with pytest.raises(SystemExit):
        prepare_main(["--output_dir", "x", "--executor", "local"])
