"""One private Slurm cluster per test run (`scripts/slurm/local_cluster.sh` with `SLURM_LOCAL_DIR`): its own
slurm.conf, controller and nodes n1, n2 (each slurmd in its own UTS + mount namespace with its own munged), ports the
OS gave as free, state and logs under pytest's temp folder. Two runs of the suite on one host therefore share no
controller, port, node or state folder, and a test that takes a node away cannot touch another run's jobs (one
cluster shared by both runs could not offer that). The run stops what it started when the session ends; a cluster
it did not start (the machine's `make slurm-local`) is neither used nor touched: SLURM_CONF points the clients at
ours. Without root, the Slurm packages or namespaces, the Slurm tests skip with the reason."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm" / "local_cluster.sh"
NODES = 2
SLURMD_TIMEOUT_S = 10  # a lost node is marked DOWN (and its jobs requeued) this long after its last answer


def cluster_problem() -> str | None:
    """Why this machine cannot run a private cluster, or None."""
    if os.geteuid() != 0:
        return "the Slurm tests start a private cluster and need root (make test installs slurm-wlm + munge as root)"
    missing = [c for c in ("slurmctld", "slurmd", "munged", "sbatch", "unshare") if shutil.which(c) is None]
    if missing:
        return f"{', '.join(missing)} not installed (as root: make slurm-tools, or apt-get install slurm-wlm munge)"
    done = subprocess.run(["unshare", "--mount", "--uts", "true"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create mount + UTS namespaces for the Slurm nodes: {done.stderr.strip()[:200]}"
    return None


class LocalCluster:
    """A running private cluster: `conf` (for SLURM_CONF), node control for the fault tests, job queries."""

    def __init__(self, folder: Path, nodes: int = NODES):
        self.folder, self.nodes, self.conf = Path(folder), nodes, Path(folder) / "slurm.conf"

    def script(self, *args: str, timeout: float = 120) -> str:
        env = {**os.environ, "SLURM_LOCAL_DIR": str(self.folder), "SLURM_LOCAL_SLURMD_TIMEOUT": str(SLURMD_TIMEOUT_S)}
        done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"local_cluster.sh {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> None:
        self.script("start", str(self.nodes))

    def stop(self) -> None:
        self.script("stop")

    def kill_node(self, k: int) -> None:
        """SIGKILL every process of node nK: slurmd, munged, job steps and their tasks (the node is gone)."""
        self.script("kill-node", str(k))

    def start_node(self, k: int) -> None:
        self.script("start-node", str(k))

    def node_states(self) -> dict[str, str]:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_nodes_idle(self, timeout: float = 60) -> None:
        """Until every node is idle again (after a test took one away and brought it back)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.node_states()
            if len(states) == self.nodes and all(s.startswith("idle") for s in states.values()):
                return
            time.sleep(0.5)
        raise AssertionError(f"nodes not idle after {timeout} s: {self.node_states()}")


def job_info(job_id: str) -> dict[str, str]:
    """`scontrol show job` as a dict (JobState, Restarts, NodeList, ...); {} once the controller forgot the job."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The run's private 2-node cluster, started on first use and stopped at the end of the session."""
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)
    cluster = LocalCluster(tmp_path_factory.mktemp("slurm"))
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        cluster.start()
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        cluster.stop()
