"""Synthetic GSM8K end to end on the shipped seed problems: a scripted backend with known-good and known-bad replies
(acceptance logic checked count by count), a real OpenAI-compatible HTTP server on 127.0.0.1, resume after SIGKILL,
and the entry point's input checks."""

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from instella_recipes.core import RecipeError
from instella_recipes.sandbox import pool as sandbox_module
from instella_recipes.synthetic_gsm8k.parsing import extract_code
from instella_recipes.synthetic_gsm8k.run import SyntheticGSM8KArguments, run
from instella_recipes.synthetic_gsm8k.run import main as synthetic_main
from tests.helpers.synthetic_fakes import BWRAP_PROBLEM, ROOT, SEEDS, TABLE, OracleServer, ScriptedBackend, compute

needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=str(BWRAP_PROBLEM))

MALFORMED = [
    '{"question": "How many apples are left?", "answer": "There are some apples left."}',  # no ####
    '{"question": "How many pears?", "answer": "She has 3 + 4 pears.\\n#### forty"}',  # non-numeric
    "this line is not JSON",
]
SMALL = dict(target_per_seed=10, cot_samples_per_request=4, max_cot_rounds=3, program_timeout=2, sandbox_workers=2)


@pytest.fixture
def seeds_file(tmp_path) -> Path:
    path = tmp_path / "seeds.jsonl"
    path.write_text(SEEDS.read_text() + "\n".join(MALFORMED) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@needs_bwrap
def test_scripted_backend_acceptance_is_exact(tmp_path, seeds_file):
    args = SyntheticGSM8KArguments(
        seeds=str(seeds_file), output_dir=str(tmp_path / "out"), output_format="jsonl",
        extra_splits=["train_small:7"], **SMALL,
    )  # fmt: skip
    backend = ScriptedBackend()
    summary = run(args, backend=backend)
    # Worked out by hand from ScriptedBackend.BAD and the oracle (every 4th chain of thought is wrong):
    assert summary["seed_rows"] == 9 and summary["seed_problems"] == 6
    assert summary["seed_problems_solved"] == 5  # seed 2 never gets a correct program in 3 rounds
    assert summary["programs_verified"] == 5
    assert summary["variants"] == 5 + 5 + 5 + 2 + 4  # seed 4: 3 bad variants; seed 5: one rewrite dropped
    assert summary["samples_kept"] == 50  # 10 per solved seed
    assert summary["splits"] == {"train": 50, "train_small": 7}
    assert summary["rejections"] == {
        "seed_no_answer_marker": 1,
        "seed_non_numeric_answer": 1,
        "seed_unparsable": 1,
        "abstract_unparsable": 1,
        "program_wrong_answer": 3,
        "program_unbounded_loop": 1,
        "program_exception": 1,
        "program_non_numeric": 1,
        "variant_invalid": 1,
        "variant_bad_answer": 1,
        "variant_exception": 1,
        "rewrite_mismatch": 1,
        "solution_no_answer": 5,  # seed 1: one per request, 5 requests
        "solution_wrong_answer": 23,  # one per request: 5 + 5 + 5 + (2 + 2) + 4
    }
    # 12 abstract + 11 program + 5 variants + 22 rewrites + 23 chain-of-thought requests
    assert backend.requests == 73

    rows = read_jsonl(tmp_path / "out" / "train.jsonl")
    assert len(rows) == 50
    verified = {i: entry["program"] for i, entry in enumerate(TABLE)}
    verified[5] = extract_code(ScriptedBackend.BAD[(5, "program", 1)][0])  # the second try, which prints too
    assert len({(r["messages"][0]["content"], r["messages"][1]["content"]) for r in rows}) == 50
    for row in rows:
        user, assistant = row["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        index = int(row["seed_id"].split("-")[1])
        entry, params = TABLE[index], json.loads(row["parameters"])
        assert row["program_sha256"] == hashlib.sha256(verified[index].encode()).hexdigest()
        assert float(row["answer"]) == compute(entry, params)
        assert assistant["content"].endswith(f"The answer is {row['answer']}.")
        assert params != entry["params"]  # new values, not the seed's
    assert {r["seed_id"] for r in rows} == {"seed-000000", "seed-000001", "seed-000003", "seed-000004", "seed-000005"}
    subset = read_jsonl(tmp_path / "out" / "train_small.jsonl")
    assert len(subset) == 7 and all(r in rows for r in subset)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["stage"] == "synthetic_gsm8k" and manifest["summary"] == summary

    # A finished run is not written into without --overwrite (the output-folder rule); with it, the same settings
    # ask the backend nothing and write the same dataset; so does a run killed after each seed's last step was
    # recorded but before its "done" record (the last line of every journal cut off).
    with pytest.raises(RecipeError, match="holds a complete 'synthetic_gsm8k' output"):
        run(args, backend=ScriptedBackend())
    args = dataclasses.replace(args, overwrite=True)
    for cut in (False, True):
        if cut:
            for path in (tmp_path / "out" / "journal").glob("*.jsonl"):
                lines = path.read_text().splitlines(keepends=True)
                assert json.loads(lines[-1])["event"] == "done"
                path.write_text("".join(lines[:-1]))
        again = ScriptedBackend()
        assert run(args, backend=again) == summary and again.requests == 0
        assert read_jsonl(tmp_path / "out" / "train.jsonl") == rows


def entry_main():
    """The entry point's `main` (exit status 0), returning the run's `summary.json` as the library's `run` does."""

    def main_then_summary(argv: list[str]) -> dict:
        assert synthetic_main(argv) == 0
        return json.loads((Path(argv[argv.index("--output_dir") + 1]) / "summary.json").read_text())

    return main_then_summary


@needs_bwrap
def test_openai_compatible_server_end_to_end_through_the_entry_point(tmp_path, capsys):
    with OracleServer() as server:
        argv = ["--config", str(ROOT / "recipes" / "synthetic_gsm8k" / "tiny.yaml"), "--base_url", server.url]
        argv += ["--output_dir", str(tmp_path / "out"), "--target_per_seed", "10", "--cot_samples_per_request", "4"]
        argv += ["--max_cot_rounds", "3", "--program_timeout", "2"]
        summary = entry_main()(argv)
    assert summary["seed_problems_solved"] == 6 and summary["programs_verified"] == 6
    assert summary["samples_kept"] == 60 and summary["variants"] == 30
    assert summary["rejections"] == {"solution_wrong_answer": 30}
    assert "seed problems solved: 6 / 6" in capsys.readouterr().out
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out" / "train.parquet")
    assert table.num_rows == 60
    assert set(table.column_names) >= {"messages", "seed_id", "parameters", "answer", "program_sha256"}
    assert table.column("messages")[0].as_py()[0]["role"] == "user"
    cot = [body for body in server.log if len(body["messages"]) > 1]
    assert cot and all(b["n"] == 4 and b["model"] == "Qwen/Qwen2.5-0.5B-Instruct" and "seed" in b for b in cot)
    assert len(cot[0]["messages"]) == 17  # 8 worked examples (user + assistant) + the question


def test_entry_point_rejects_bad_input_before_work(tmp_path, capsys):
    main = entry_main()
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("seeds: x.jsonl\ntarget_per_sed: 3\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(recipe)])
    assert exit_info.value.code == 2
    assert "bad.yaml:2: unknown key 'target_per_sed'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--seeds", str(tmp_path / "missing.jsonl"), "--output_dir", str(tmp_path / "o")])
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--seeds", str(SEEDS), "--sandbox", "none"])
    assert "sandbox must be bwrap or rlimits-only" in capsys.readouterr().err


def _journal_lines(folder: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in folder.glob("*.jsonl")) if folder.is_dir() else 0


@needs_bwrap
def test_settings_change_refused_on_resume(tmp_path):
    out = tmp_path / "out"
    args = SyntheticGSM8KArguments(seeds=str(SEEDS), output_dir=str(out), max_seeds=1, overwrite=True, **SMALL)
    run(args, backend=ScriptedBackend())
    import fcntl

    with open(out / ".lock", "w") as held:  # another run holds the folder
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(RecipeError, match="another run is using"):
            run(args, backend=ScriptedBackend())
    (out / "manifest.json").unlink()  # an interrupted run: resumed without --overwrite, with its own settings only
    with pytest.raises(RecipeError, match="different settings.*target_per_seed.*--overwrite true"):
        run(
            SyntheticGSM8KArguments(
                seeds=str(SEEDS), output_dir=str(out), max_seeds=1, **{**SMALL, "target_per_seed": 5}
            )
        )


@needs_bwrap
def test_a_finished_run_is_written_into_only_with_overwrite(tmp_path, capsys):
    """The output-folder rule: a complete output (this stage's or another's) needs --overwrite, and its manifest
    goes first. Same settings: the journals are kept (a grown max_seeds generates only the new seeds); other
    settings, or another stage's output: the folder is emptied and the run starts anew."""
    from instella_recipes.core import read_manifest, write_manifest

    out = tmp_path / "out"
    common = dict(seeds=str(SEEDS), output_dir=str(out), **SMALL)
    first = run(SyntheticGSM8KArguments(max_seeds=2, **common), backend=ScriptedBackend())
    before = {p.name: p.read_bytes() for p in (out / "journal").iterdir()}
    with pytest.raises(SystemExit) as exit_info:  # the entry point: one line, exit 2, nothing touched
        entry_main()(["--seeds", str(SEEDS), "--output_dir", str(out), "--max_seeds", "3", "--model", "m"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 2 and len(lines) == 1 and "--overwrite true" in lines[0]
    assert read_manifest(out)["summary"] == first and len(before) == 2

    grown = run(SyntheticGSM8KArguments(max_seeds=3, overwrite=True, **common), backend=ScriptedBackend())
    after = {p.name: p.read_bytes() for p in (out / "journal").iterdir()}
    assert {k: after[k] for k in before} == before and len(after) == 3  # two seeds kept as they were, one added
    assert grown["seed_problems"] == 3 and read_manifest(out)["summary"] == grown

    backend = ScriptedBackend()
    anew = run(
        SyntheticGSM8KArguments(max_seeds=2, overwrite=True, **{**common, "target_per_seed": 5}), backend=backend
    )
    assert len(list((out / "journal").iterdir())) == 2 and backend.requests > 0 and anew["samples_kept"] <= 10

    other = tmp_path / "pretrain"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"weights")
    write_manifest(other, "pretrain", global_step=3)
    with pytest.raises(RecipeError, match="holds a complete 'pretrain' output"):
        run(SyntheticGSM8KArguments(**{**common, "output_dir": str(other)}, max_seeds=1), backend=ScriptedBackend())
    run(
        SyntheticGSM8KArguments(**{**common, "output_dir": str(other)}, max_seeds=1, overwrite=True),
        backend=ScriptedBackend(),
    )
    assert not (other / "model.safetensors").exists() and read_manifest(other)["stage"] == "synthetic_gsm8k"


def test_missing_bubblewrap_fails_closed_before_any_generation(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name: None)
    backend = ScriptedBackend()
    with pytest.raises(RecipeError, match="bubblewrap"):
        run(SyntheticGSM8KArguments(seeds=str(SEEDS), output_dir=str(tmp_path / "out"), **SMALL), backend=backend)
    assert backend.requests == 0


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@needs_bwrap
def test_server_outage_fails_the_run_and_the_same_command_retries_every_seed(tmp_path, capsys):
    """Issue 13.1: with the server down the run exits 1 with the backend's error, writes no manifest or dataset and
    journals no seed as done; once the server is up, the same command generates the whole dataset."""
    port = _free_port()
    argv = ["--config", str(ROOT / "recipes" / "synthetic_gsm8k" / "tiny.yaml"), "--output_dir", str(tmp_path / "o")]
    argv += ["--base_url", f"http://127.0.0.1:{port}/v1", "--max_retries", "1", "--target_per_seed", "10"]
    argv += ["--cot_samples_per_request", "4", "--max_cot_rounds", "3", "--program_timeout", "2"]
    with pytest.raises(SystemExit) as exit_info:
        entry_main()(argv)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "failed for 6 of 6 seed problems" in err and "APIConnectionError" in err
    out = tmp_path / "o"
    assert not (out / "manifest.json").exists() and not (out / "train.parquet").exists()
    assert _journal_lines(out / "journal") == 0  # no step, and no seed, recorded as done or failed
    with OracleServer(port=port) as server:
        summary = entry_main()(argv)
    assert len(server.log) > 0 and summary["seed_problems_solved"] == 6 and summary["samples_kept"] == 60
    assert (out / "manifest.json").is_file()


@needs_bwrap
def test_backend_errors_within_the_stated_fraction_still_finish_and_are_retried_next_run(tmp_path):
    class Flaky(ScriptedBackend):
        """Fails every request about seed 2 (the bike question) on the first run only."""

        broken = True

        def generate(self, requests):
            from instella_recipes.synthetic_gsm8k.backends import Failed

            replies = super().generate(requests)
            return [
                Failed("APIConnectionError: down") if self.broken and "bike" in r.messages[-1]["content"] else reply
                for r, reply in zip(requests, replies)
            ]

    out = tmp_path / "out"
    backend = Flaky()
    common = dict(seeds=str(SEEDS), output_dir=str(out), **SMALL)
    with pytest.raises(Exception, match="failed for 1 of 6 seed problems .*first error: APIConnectionError: down"):
        run(SyntheticGSM8KArguments(**common), backend=backend)
    assert not (out / "manifest.json").exists()
    summary = run(SyntheticGSM8KArguments(**common, max_backend_error_fraction=0.2), backend=backend)
    assert summary["seed_problems_left_for_backend_errors"] == 1 and (out / "manifest.json").is_file()
    backend.broken = False
    summary = run(SyntheticGSM8KArguments(**common, overwrite=True), backend=backend)  # a complete output: --overwrite
    assert summary["seed_problems_left_for_backend_errors"] == 0
    assert summary["seed_problems"] == 6 and "backend_error" not in summary["rejections"]
