"""An optimizer-state folder (`optimizer_state_from`, `load_optimizer_state`; trainer/features/optimizer_state.py) is
checked before training: a truncated data file or `.metadata` and a state saved from another model shape are one
`RecipeError` naming the folder (and the parameter), never a traceback in DCP's load."""

import pytest
import torch

from instella_recipes.core import RecipeError
from instella_recipes.trainer.features.optimizer_state import (
    check_optimizer_shapes,
    check_optimizer_state,
    load_optimizer_state,
    save_optimizer_state,
)


def _model(hidden=4):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, hidden), torch.nn.Linear(hidden, 2))


@pytest.fixture
def saved(tmp_path):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    save_optimizer_state(model, optimizer, tmp_path / "state")
    return tmp_path / "state"


def test_a_sound_folder_of_the_same_shape_passes_and_loads(saved):
    assert check_optimizer_state(saved, "optimizer_state_from") == saved
    model = _model()
    check_optimizer_shapes(model, saved)
    optimizer = torch.optim.AdamW(model.parameters())
    load_optimizer_state(model, optimizer, saved)
    assert int(optimizer.state[model[0].weight]["step"]) == 1


def test_truncated_files_are_one_error_naming_them(saved):
    data = saved / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(RecipeError, match=r"optimizer_state_from: optimizer state .*__0_0\.distcp is \d+ bytes, its "
                       r"\.metadata needs \d+ \(truncated\)"):  # fmt: skip
        check_optimizer_state(saved, "optimizer_state_from")
    data.unlink()
    with pytest.raises(RecipeError, match=r"__0_0\.distcp is missing"):
        check_optimizer_state(saved, "optimizer_state_from")
    meta = saved / ".metadata"
    meta.write_bytes(meta.read_bytes()[:50])
    with pytest.raises(RecipeError, match=r"its \.metadata cannot be read"):
        check_optimizer_state(saved, "optimizer_state_from")


def test_a_state_of_another_model_shape_is_one_error_naming_the_parameter(saved):
    with pytest.raises(RecipeError, match=r"parameter 0\.weight is \[4, 3\] there, \[8, 3\] in this model"):
        check_optimizer_shapes(_model(hidden=8), saved)
    deeper = torch.nn.Sequential(*_model(), torch.nn.Linear(2, 2))
    with pytest.raises(RecipeError, match=r"has no state for parameter 2\.weight"):
        check_optimizer_shapes(deeper, saved)
    with pytest.raises(RecipeError, match=r"holds parameters this model lacks \(1\.bias, 2 in all\)"):
        check_optimizer_shapes(torch.nn.Sequential(torch.nn.Linear(3, 4)), saved)
