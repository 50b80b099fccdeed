"""Test-only oracles: the authors' (or their peers') released packages, fetched from PyPI on first use.

They are never dependencies of the project and their code is never copied into it: a test downloads the pinned wheel
(`pip download --no-deps`), unpacks it into a per-user cache and reads or imports it from there. The cache folder is
filled under a temporary name and renamed into place, so two test runs on one host never see a half-unpacked oracle.
Without PyPI the calling test skips with pip's error as its reason; any other pip failure is an error.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

OFFLINE_SIGNS = (
    "No matching distribution",
    "Could not find a version",
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Max retries exceeded",
    "Network is unreachable",
    "timed out",
)
CACHE = Path(os.environ.get("INSTELLA_ORACLE_CACHE", Path.home() / ".cache" / "instella-recipes" / "oracles"))


def unpacked_wheel(name: str, version: str) -> Path:
    """The folder holding the unpacked wheel of `name==version` (downloaded on first use); skips without PyPI."""
    final = CACHE / f"{name}-{version}"
    if final.is_dir():
        return final
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=CACHE))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", f"{name}=={version}",
             "-d", str(work / "wheel")],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if result.returncode != 0:
            if any(sign in result.stderr for sign in OFFLINE_SIGNS):
                pytest.skip(f"PyPI unreachable, no test oracle {name}=={version}: {result.stderr.strip()[-300:]}")
            raise RuntimeError(f"pip download {name}=={version} failed:\n{result.stderr[-3000:]}")
        (wheel,) = (work / "wheel").glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(work / "unpacked")
        try:
            (work / "unpacked").rename(final)
        except OSError:  # another run got there first: its copy is complete (rename is atomic)
            if not final.is_dir():
                raise
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)
