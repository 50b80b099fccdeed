"""How `make test` spreads the suite over its pytest-xdist workers (tests/conftest.py `worker_group`): by module, with
every module that uses the private Slurm cluster in one group."""

from pathlib import Path

from tests.conftest import worker_group

ROOT = Path(__file__).resolve().parents[3]


def test_a_module_is_one_group_and_the_slurm_modules_are_one():
    assert worker_group("tests/e2e/test_lora.py::test_a[x]") == worker_group("tests/e2e/test_lora.py::test_b")
    assert worker_group("tests/e2e/test_lora.py::test_a") == "tests/e2e/test_lora.py"
    assert {worker_group(f"tests/e2e/{name}::t") for name in ("test_slurm.py", "test_prepare_slurm.py")} == {"slurm"}
    assert worker_group("tests/unit/pipeline/test_pipeline_slurm_cpus.py::t") != "slurm"  # no cluster in units


def test_every_module_on_the_cluster_is_in_the_slurm_group():
    """The modules naming `slurm_cluster` (the fixture or its marker helper) are the ones `worker_group` puts together;
    collection also refuses a test on the cluster outside them (tests/conftest.py)."""
    tests = [p for p in (ROOT / "tests").rglob("test_*.py") if p.resolve() != Path(__file__).resolve()]
    users = {p.relative_to(ROOT).as_posix() for p in tests if "slurm_cluster" in p.read_text()}
    assert users and all(worker_group(f"{module}::t") == "slurm" for module in users), users
