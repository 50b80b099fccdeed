"""Record a benchmark's result: `benchmarks/results/<name>.md` (one file per benchmark, so runs never clash),
then `benchmarks/RESULTS.md` is rebuilt as the concatenation of every result file, sorted by name."""

import platform
import shlex
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def machine() -> str:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({torch.get_num_threads()} threads)"
    return f"{device}, torch {torch.__version__}, Python {platform.python_version()}"


def record(name: str, title: str, body_markdown: str, command: str | None = None) -> Path:
    """Write one benchmark's section (title, command, machine, date, body) and rebuild RESULTS.md."""
    command = command or "python " + " ".join(shlex.quote(a) for a in sys.argv)
    section = (
        f"## {title}\n\n"
        f"Command: `{command}`  \nMachine: {machine()}  \nDate: {time.strftime('%Y-%m-%d')}\n\n"
        f"{body_markdown.strip()}\n"
    )
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    path = results / f"{name}.md"
    path.write_text(section)
    rebuild()
    return path


def rebuild() -> Path:
    parts = [p.read_text().strip() for p in sorted((HERE / "results").glob("*.md"))]
    header = (
        "# Benchmark results\n\nEach section is written by the script named in its command line; ratios compare our "
        "code with the library or peer baseline in the same run. Regenerate a section by re-running its command.\n"
    )
    out = HERE / "RESULTS.md"
    out.write_text(header + "\n" + "\n\n".join(parts) + "\n")
    return out
