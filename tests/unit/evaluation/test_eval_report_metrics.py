"""`eval_report.py` on result files whose metrics are not numbers: each such column is shown as "-", left out of the
average, and named in one warning (file, column, task, metric, value)."""

import json
import math

from instella_recipes.evaluation import report


def test_string_metric_is_shown_as_dash_with_a_warning_naming_it(tmp_path, caplog):
    results = tmp_path / "results_strings.json"
    metrics = {
        "tiny_world_mc": {"acc,none": "N/A"},
        "tiny_world_arithmetic": {"exact_match,strict-match": 0.5},
        "tiny_world_facts_chat": {"acc,none": 0.25},
    }
    results.write_text(json.dumps({"results": metrics}))
    with caplog.at_level("WARNING"):
        _, rows = report.build_rows("tiny_world", [results])
    ours = rows[0]
    assert "tiny_world_mc" not in ours["scores"] and ours["n"] == 2
    assert math.isclose(
        ours["avg"], ours["scores"]["tiny_world_arithmetic"] / 2 + ours["scores"]["tiny_world_facts_chat"] / 2
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"{results}: tiny_world_mc (tiny_world_mc acc,none) is 'N/A' (str), not a number; shown as '-' and left out "
        f"of the average"
    ]
    assert report.markdown_table(report.load_published("tiny_world"), rows).count(" - ") >= 1
