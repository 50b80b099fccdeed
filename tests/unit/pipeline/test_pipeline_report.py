"""`scripts/pipeline_report.py` over a synthetic run folder: wall times from the run records, loss curves from
`trainer_state.json` (the three stage-2 seeds on one chart), lm-eval scores side by side, speculative numbers."""

import json

from PIL import Image

from instella_recipes.pipeline.report import main


def _record(run, stage, group, wall, inputs=(), values=None, started="2026-01-01T00:00:00"):
    out = run / stage
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "stage": stage, "group": group, "description": f"{group} step", "status": "done", "wall_s": wall,
        "output": str(out), "inputs": list(inputs), "values": values or {}, "started_at": started, "set": {},
    }  # fmt: skip
    (run / "pipeline").mkdir(parents=True, exist_ok=True)
    (run / "pipeline" / f"{stage}.json").write_text(json.dumps(record))
    return out


def _trainer_state(folder, losses, global_step=None, extra=None):
    history = [{"step": i + 1, "loss": v, "learning_rate": 1e-3, **(extra or {})} for i, v in enumerate(losses)]
    state = {"log_history": history + [{"step": len(losses)}], "global_step": global_step or len(losses)}
    (folder / "trainer_state.json").write_text(json.dumps(state))


def _lm_eval(folder, acc, em, n_mc=24):
    target = folder / "model__dir"
    target.mkdir(parents=True)
    results = {
        "results": {
            "tiny_world_mc": {"alias": "tiny_world_mc", "acc,none": acc, "acc_stderr,none": 0.05},
            "tiny_world_arithmetic": {"exact_match,strict-match": em, "exact_match_stderr,strict-match": 0.1},
            "tiny_world": {"alias": "tiny_world", "sample_len": 24},
        },
        "n-shot": {"tiny_world_mc": 0, "tiny_world_arithmetic": 0},
        "n-samples": {
            "tiny_world_mc": {"original": 24, "effective": n_mc},
            "tiny_world_arithmetic": {"original": 40, "effective": 40},
        },
    }
    (target / "results_2026-01-01T00-00-00.json").write_text(json.dumps(results))


def test_report_tables_and_plots(tmp_path):
    run = tmp_path / "run"
    _trainer_state(_record(run, "stage1", "stage1", 61.0, started="2026-01-01T00:00:01"), [6.0, 4.0, 3.0, 2.5])
    for i, seed in enumerate((5796, 6198, 8915)):
        out = _record(run, f"stage2_{seed}", "stage2", 20.0 + i, ["stage1"], {"seed": seed}, f"2026-01-01T00:01:0{i}")
        _trainer_state(out, [2.5 - 0.1 * i, 2.2, 2.0])
    # SFT ran 5 steps and logged every 2nd (steps 1..3 of the log stand for 1, 3, 5): the table shows the run's 5
    _trainer_state(_record(run, "sft", "sft", 30.0, ["merge"], started="2026-01-01T00:02:00"), [3.0, 1.0, 0.5], 5)
    _lm_eval(_record(run, "eval_stage1", "eval_stage1", 15.0, ["stage1"], started="2026-01-01T00:03:00"), 0.3, 0.0)
    _lm_eval(_record(run, "eval_sft", "eval_sft", 15.0, ["sft"], started="2026-01-01T00:03:30"), 0.8, 0.4, n_mc=10)
    spec = _record(run, "speculative", "speculative", 40.0, ["sft", "draft"], started="2026-01-01T00:04:00")
    summary = {
        "mode": "greedy", "prompts": 4, "acceptance_rate": 0.75, "drafted_tokens": 400, "accepted_tokens": 300,
        "tokens_per_s_base": 100.0, "tokens_per_s_assisted": 180.0, "speedup": 1.8, "identical_outputs": 4,
    }  # fmt: skip
    (spec / "speculative.json").write_text(json.dumps([summary]))
    # the Slurm executor keeps its job ids beside the run records; they are not stages
    (run / "pipeline" / "stage1.slurm.json").write_text(json.dumps({"job_id": "17", "restarts": 0}))

    main(["--run_dir", str(run)])
    report = (run / "report.md").read_text()
    assert "| stage1 | stage1 step | 61.0 s | - | done |" in report
    assert "| **total** | | **3.7 min (224 s)** | 0 s | |" in report
    assert "| stage2 | seed 6198 | 3 | 2.400 | 2.000 |" in report
    assert "| sft | sft | 5 | 3.000 | 0.500 |" in report  # the run's steps, not the last logged step
    # stage1 and sft side by side, each score with lm-eval's standard error, and the item counts (sft: --limit 10)
    assert "| tiny_world_mc | acc | 24 / 10 | 0.300 ± 0.050 | 0.800 ± 0.050 |" in report
    assert "| tiny_world_arithmetic | exact_match (strict-match) | 40 | 0.000 ± 0.100 | 0.400 ± 0.100 |" in report
    assert "one item moves a score by 1/n" in report
    assert "no `--set` overrides" in report
    assert "| speculative | greedy | 0.750 | 400 | 300 | 100.0 | 180.0 | 1.80x | 4/4 |" in report
    plots = run / "report"
    for name in ("wall_time", "loss_stage1", "loss_stage2", "loss_sft", "eval_scores"):
        assert f"(report/{name}.png)" in report
        with Image.open(plots / f"{name}.png") as image:
            assert image.size[0] > 500 and image.size[1] > 200
    assert not (plots / "loss_eval_sft.png").exists()
    assert json.loads((plots / "manifest.json").read_text())["stage"] == "report"


def test_report_states_the_set_overrides_each_stage_ran_with(tmp_path):
    run = tmp_path / "run"
    for stage, overrides in (("data", {}), ("sft", {"sft_epochs": 5}), ("dpo", {"sft_epochs": 5}), ("old", None)):
        _record(run, stage, stage, 1.0)
        record = json.loads((run / "pipeline" / f"{stage}.json").read_text())
        if overrides is None:
            del record["set"]
        else:
            record["set"] = overrides
        (run / "pipeline" / f"{stage}.json").write_text(json.dumps(record))
    main(["--run_dir", str(run)])
    report = (run / "report.md").read_text()
    assert "| `sft_epochs=5` | dpo, sft |" in report
    assert "| none (the YAML's `vars`) | data |" in report
    assert "| not recorded (a run record older than this report's format) | old |" in report


def test_report_checks_the_run_against_the_ranges_of_a_healthy_run(tmp_path):
    """`--expect`: every check of the expectations file against this run, ok or OUTSIDE, at the top of the report;
    a check whose stage did not run says so."""
    run = tmp_path / "run"
    _trainer_state(_record(run, "stage1", "stage1", 10.0), [6.2, 3.0, 0.9])
    _trainer_state(_record(run, "dpo", "dpo", 10.0, ["sft"]), [0.69, 0.5], extra={"rewards/margins": 0.8})
    _lm_eval(_record(run, "eval_merge", "eval_merge", 5.0, ["merge"], started="2026-01-01T00:03:00"), 0.25, 0.0)
    _lm_eval(_record(run, "eval_sft", "eval_sft", 5.0, ["sft"], started="2026-01-01T00:03:30"), 0.30, 0.0)
    expect = tmp_path / "expected.yaml"
    expect.write_text(
        "checks:\n"
        "  - name: stage 1 learns\n    loss: {stage: stage1, first: [5.5, 7.5], last: [0.3, 1.5]}\n"
        "  - name: DPO margin\n    log: {stage: dpo, key: rewards/margins, last: [0.1, null]}\n"
        "  - name: SFT raises mc\n"
        "    score: {model: sft, task: tiny_world_mc, metric: acc, range: [0.2, 1.0], above: merge, by: 0.2}\n"
        "  - name: speculative\n    speculative: {mode: greedy, identical: all}\n"
    )
    main(["--run_dir", str(run), "--expect", str(expect)])
    report = (run / "report.md").read_text()
    assert report.index("## What a healthy run shows") < report.index("## Wall time per stage")
    assert "| stage 1 learns | stage1 loss first: 5.5 to 7.5 | 6.200 | ok |" in report
    assert "| stage 1 learns | stage1 loss last: 0.3 to 1.5 | 0.900 | ok |" in report
    assert "| DPO margin | dpo rewards/margins last: >= 0.1 | 0.800 | ok |" in report
    assert "| SFT raises mc | sft tiny_world_mc acc: 0.2 to 1 | 0.300 | ok |" in report
    assert "| SFT raises mc | sft minus merge: >= 0.2 | 0.300 - 0.250 = +0.050 | **OUTSIDE** |" in report
    assert "| speculative | | not run | |" in report
    assert "Verdict: 1 result(s) OUTSIDE their range." in report


def test_a_malformed_expectations_file_is_named(tmp_path):
    import pytest

    from instella_recipes.core import RecipeError
    from instella_recipes.pipeline.health import load_expectations

    bad = tmp_path / "bad.yaml"
    bad.write_text("checks:\n  - name: x\n    loss: {stage: s, last: [1]}\n")
    with pytest.raises(RecipeError, match=r"bad.yaml: checks\[0\].loss.last: a range is \[low, high\]"):
        load_expectations(bad)


def test_the_demos_expectations_file_parses():
    from pathlib import Path

    from instella_recipes.pipeline.health import load_expectations

    root = Path(__file__).resolve().parents[3]
    checks = load_expectations(root / "eval/expected/tiny_demo.yaml")
    assert any("SFT raises facts accuracy" in c["name"] for c in checks)


def test_the_docs_quote_the_recorded_demo_report():
    """docs/pipeline.md "Measured" quotes docs/demo_report.md (a `make demo-record` run): every number it gives is in
    that report, and it names the report's date and machine."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    recorded = (root / "docs" / "demo_report.md").read_text()
    section = (root / "docs" / "pipeline.md").read_text().split("## Measured", 1)[1].split("\n## ", 1)[0]
    header = re.search(r"written (\d{4}-\d{2}-\d{2}) [\d:]+ on (.+?), \d+ cores", recorded)  # "Intel(R) ..."
    assert header, "the recorded report names its date and machine"
    date, machine = header.groups()
    assert date in section and machine in section, "the Measured section names the recorded run's date and machine"
    assert "Verdict: every result is inside its range." in recorded  # the recorded run is a healthy one
    numbers = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", section))
    assert numbers, "the Measured section quotes numbers"
    missing = sorted(n for n in numbers if n not in recorded)
    assert not missing, f"docs/pipeline.md quotes numbers that are not in docs/demo_report.md: {missing}"
    # elsewhere: a paragraph that cites the recorded report quotes only its numbers, with its date and machine
    for doc in sorted((root / "docs").glob("*.md")):
        for paragraph in doc.read_text().split("\n\n"):
            if "(demo_report.md)" in paragraph and doc.name != "pipeline.md":
                assert date in paragraph and machine in paragraph, f"{doc.name}: cite the run's date and machine"
                quoted = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", paragraph))
                assert quoted <= set(re.findall(r"\d+\.\d+", recorded)), f"{doc.name}: {sorted(quoted)}"


def test_score_chart_leaves_out_stages_not_evaluated_and_marks_lower_is_better():
    """Issue 42: the demo's chart drew the long-context stages' missing tiny_world scores as 0.00 bars and labelled
    bits per byte "higher is better"."""
    from instella_recipes.pipeline.report import chart_bars, chart_label

    keys = [("tiny_world_mc", "acc"), ("tiny_long_bpb", "bits_per_byte")]
    scores = {"stage1": {keys[0]: 0.5}, "long": {keys[1]: 1.7}, "both": {keys[0]: 0.6, keys[1]: 1.2}}
    assert chart_bars(scores, keys) == {"stage1": [0], "long": [1], "both": [0, 1]}
    assert chart_label(*keys[1]).endswith("(lower is better)")
    assert "lower" not in chart_label(*keys[0])
