"""Every accelerate config loads with accelerate's own reader, names its sharding plainly, and sums up."""

from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import load_config_from_file

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "accelerate_configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_and_is_consistent(path):
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("#"), "the first line says the hardware"
    config = load_config_from_file(str(path))
    raw = yaml.safe_load(path.read_text())
    if raw["distributed_type"] == "FSDP":
        assert raw["fsdp_config"]["fsdp_version"] == 2
    if raw["num_machines"] > 1:
        assert config.num_processes % raw["num_machines"] == 0
    replicate = raw.get("parallelism_config", {}).get("parallelism_config_dp_replicate_size")
    if replicate:  # hybrid shard: replicate across nodes x shard inside a node = all processes
        shard = raw["parallelism_config"]["parallelism_config_dp_shard_size"]
        assert replicate * shard == config.num_processes and replicate == raw["num_machines"]
