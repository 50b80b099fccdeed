"""prepare_data's bad inputs: each a clear error naming what to fix, exit code 2, and no output folder."""

import json

import pytest

from instella_recipes.data.prepare import main


@pytest.fixture
def run(tmp_path, tiny_tokenizer, capsys):
    tok = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(tok)

    def _run(sources, **extra):
        out = tmp_path / "out"
        argv = ["--output_dir", str(out), "--tokenizer", str(tok), "--seq_len", "16", "--num_proc", "1"]
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(json.dumps({"sources": sources, **extra}))
        with pytest.raises(SystemExit) as exc:
            main(["--config", str(recipe), *argv])
        assert exc.value.code == 2
        assert not out.exists()
        return capsys.readouterr().err

    return _run


def test_missing_file(run, tmp_path):
    assert "does not exist" in run([str(tmp_path / "nope.jsonl")])


def test_malformed_jsonl_line_is_named(run, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "fine too"}\n{"text": broken\n')
    assert f"{bad}:3: malformed JSON" in run([str(bad)])


def test_missing_text_column(run, tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text('{"content": "hello"}\n')
    err = run([str(src)])
    assert "no text column 'text'" in err and "content" in err


def test_empty_dataset(run, tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "a", "lang": "de"}\n')
    assert "no rows left" in run([{"path": str(src), "filters": [{"column": "lang", "value": "en"}]}])


def test_too_little_data_for_one_window(run, tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "a"}\n')
    assert "fewer than one window" in run([str(src)])


def test_unknown_source_key(run, tmp_path):
    assert "unknown key(s) ['wieght']" in run([{"path": str(tmp_path), "wieght": 2}])


def test_malformed_line_is_named_in_streaming_mode(run, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n' * 5 + "not json\n")
    assert f"{bad}:6: malformed JSON" in run([str(bad)], streaming=True)


def test_empty_jsonl_says_so(run, tmp_path):
    src = tmp_path / "empty.jsonl"
    src.write_text("")
    assert f"{src} is empty (0 bytes)" in run([str(src)])


@pytest.mark.parametrize("key, value", [("weight", float("nan")), ("weight", float("inf")), ("repeat", float("nan"))])
def test_non_finite_weight_or_repeat_is_refused(key, value, tmp_path):
    """What the recipe parser refuses at parse time (YAML `.nan`), `SourceSpec` refuses too, for library callers."""
    from instella_recipes.core import RecipeError
    from instella_recipes.data.sources import SourceSpec

    with pytest.raises(RecipeError, match=rf"sources\[0\]: {key} must be a finite number > 0, got {value}"):
        SourceSpec.from_recipe(0, {"path": str(tmp_path), key: value})


def test_output_dir_that_is_a_file(tmp_path, tiny_tokenizer, capsys):
    src, out = tmp_path / "a.jsonl", tmp_path / "taken"
    src.write_text('{"text": "hello"}\n')
    out.write_text("a file")
    with pytest.raises(SystemExit) as exc:
        main(["--output_dir", str(out), "--sources", str(src), "--train_tokenizer_vocab_size", "300"])
    assert exc.value.code == 2 and f"output_dir {out} is a file, not a folder" in capsys.readouterr().err
    assert out.read_text() == "a file"
