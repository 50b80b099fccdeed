"""Append-only per-seed journals: the run's only state, so a killed run resumes where it stopped.

Each seed problem has `journal/<seed_id>.jsonl`; every finished step appends one JSON line and fsyncs it. A line cut
short by a kill is ignored on replay (its step is simply redone), so no finished step is ever redone and nothing is
recorded twice.
"""

import json
import os
from pathlib import Path


class Journal:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, seed_id: str) -> Path:
        return self.folder / f"{seed_id}.jsonl"

    def append(self, seed_id: str, event: dict) -> None:
        path = self.path(seed_id)
        line = (json.dumps(event, sort_keys=True) + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self._truncate_torn_tail(fd, path)
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _truncate_torn_tail(fd: int, path: Path) -> None:
        """A kill during a write can leave a last line without its newline: cut it before appending."""
        size = os.fstat(fd).st_size
        if size == 0:
            return
        with open(path, "rb") as handle:
            handle.seek(size - 1)
            if handle.read(1) == b"\n":
                return
            data = path.read_bytes()
        os.ftruncate(fd, data.rfind(b"\n") + 1)

    def read(self, seed_id: str) -> list[dict]:
        path = self.path(seed_id)
        if not path.is_file():
            return []
        events = []
        for line in path.read_bytes().split(b"\n"):
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                break  # a torn last line: the step it recorded is redone
        return events
