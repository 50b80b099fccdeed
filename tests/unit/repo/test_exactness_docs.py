"""docs/exactness.md stays true: every citation of this repository in its tables (`path:N` (`text`): line N holds
`text`; `path` (`text`): the file holds it) still points at what the row says, and every test a row names exists.
The authors' citations are checked the same way against their repositories when `AUTHORS_MIRROR_DIR` holds bare
clones laid out as `<owner>+<name>/repo` (skipped otherwise: CI has no copy of them)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "exactness.md"
CITATION = re.compile(r"`(?P<path>[^`\s:()]+)(?::(?P<first>\d+)(?:-(?P<last>\d+))?)?` \(`(?P<text>[^`]+)`\)")
LINE_ONLY = re.compile(r"`(?P<path>[^`\s:()]+):\d+(?:-\d+)?`(?! \(`)")
TEST_NAME = re.compile(r"(?P<file>test_\w+\.py)?::(?P<name>test_\w+)")
# (owner+name, commit) of the authors' repositories, by the first folder of a cited path
AUTHORS = {"open_instruct": ("allenai+open-instruct", "4365dea3d"), "pretrain": ("AMD-AIG-AIMA+AMD-LLM", "1f4de24"),
           "cluster": ("AMD-AIG-AIMA+AMD-LLM", "1f4de24"), "lit_gpt": ("AMD-AIG-AIMA+AMD-LLM", "1f4de24"),
           "verl": ("AMD-AIG-AIMA+Instella-Math", "65534d3")}  # fmt: skip
INSTELLA = ("AMD-AIG-AIMA+Instella", "f00a236")


def _cells(line: str) -> list[str]:
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def table_rows() -> list[dict]:
    """Each table row of the doc as {fact, authors, ours, test} (the header names the columns)."""
    rows, header = [], None
    for number, line in enumerate(DOC.read_text().splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
        elif not set(line) <= set("|- "):
            rows.append({"line": number, **dict(zip(("fact", "authors", "ours", "test"), cells, strict=True))})
    return rows


def _holds(lines: list[str], first, last, text: str) -> bool:
    if first is None:
        return any(text in line for line in lines)
    return any(text in line for line in lines[int(first) - 1 : int(last or first)])


def test_the_doc_has_rows_and_each_cites_the_authors_ours_and_a_test():
    rows = table_rows()
    assert len(rows) >= 25
    for row in rows:
        assert CITATION.search(row["ours"]), f"docs/exactness.md:{row['line']}: no citation of ours"
        assert TEST_NAME.search(row["test"]) or row["test"].startswith("same"), f"docs/exactness.md:{row['line']}"


def test_every_citation_of_ours_holds():
    problems = []
    for row in table_rows():
        where = f"docs/exactness.md:{row['line']}"
        problems += [f"{where}: `{m.group(0)}` cites a line without its text" for m in LINE_ONLY.finditer(row["ours"])]
        for cite in CITATION.finditer(row["ours"]):
            path = ROOT / cite["path"]
            if not path.is_file():
                problems.append(f"{where}: {cite['path']} does not exist")
            elif not _holds(lines := path.read_text().splitlines(), cite["first"], cite["last"], cite["text"]):
                now = [str(n) for n, line in enumerate(lines, 1) if cite["text"] in line]
                problems.append(f"{where}: {cite.group(0)} no longer holds (the text is now at: {now or 'nowhere'})")
    assert not problems, "\n".join(problems)


def test_every_named_test_exists():
    problems = []
    for row in table_rows():
        current = None
        for match in TEST_NAME.finditer(row["test"]):
            current = match["file"] or current
            found = sorted((ROOT / "tests").rglob(current)) if current else []
            source = found[0].read_text() if found else ""
            if f"def {match['name']}(" not in source:
                problems.append(f"docs/exactness.md:{row['line']}: {current}::{match['name']} not found")
    assert not problems, "\n".join(problems)


def _authors_file(mirrors: Path, path: str) -> list[str] | None:
    repo, commit = AUTHORS.get(path.split("/")[0], INSTELLA)
    done = subprocess.run(
        ["git", "-C", str(mirrors / repo / "repo"), "show", f"{commit}:{path}"], capture_output=True, text=True
    )
    return done.stdout.splitlines() if done.returncode == 0 else None


@pytest.mark.skipif(not os.environ.get("AUTHORS_MIRROR_DIR"), reason="AUTHORS_MIRROR_DIR not set (the authors' repos)")
def test_every_citation_of_the_authors_holds():
    mirrors = Path(os.environ["AUTHORS_MIRROR_DIR"])
    problems = []
    for row in table_rows():
        where = f"docs/exactness.md:{row['line']}"
        problems += [
            f"{where}: `{m.group(0)}` cites a line without its text" for m in LINE_ONLY.finditer(row["authors"])
        ]
        for cite in CITATION.finditer(row["authors"]):
            lines = _authors_file(mirrors, cite["path"])
            if lines is None:
                problems.append(f"{where}: {cite['path']} not found in the authors' repository")
            elif not _holds(lines, cite["first"], cite["last"], cite["text"]):
                problems.append(f"{where}: {cite.group(0)} does not hold")
    assert not problems, "\n".join(problems)
