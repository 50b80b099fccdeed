"""The local-model backend: batched `generate` with a tiny saved Instella (random weights, no chat template), wired
into the pipeline through the recipe's `backend: transformers`."""

import pytest

from instella_recipes.synthetic_gsm8k.backends import Request, TransformersBackend
from instella_recipes.synthetic_gsm8k.run import NothingSolved, SyntheticGSM8KArguments, run
from tests.helpers.synthetic_fakes import BWRAP_PROBLEM, SEEDS

pytestmark = pytest.mark.usefixtures("one_thread")


def test_batched_generation_shapes(tiny_model_dir):
    backend = TransformersBackend(str(tiny_model_dir), batch_size=2, dtype="float32", device="cpu")
    messages = [{"role": "user", "content": "How many apples?"}]
    requests = [
        Request(messages, n=2, temperature=0.7, max_tokens=4, seed=1),
        Request(messages + [{"role": "assistant", "content": "Two."}], n=2, temperature=0.7, max_tokens=4, seed=1),
        Request(messages, n=1, temperature=0.0, max_tokens=3),
        Request(messages, n=2, temperature=0.0, max_tokens=3),  # greedy: the same text twice
    ]
    replies = backend.generate(requests)
    assert [len(r) for r in replies] == [2, 2, 1, 2]
    assert replies[3] == replies[2] * 2
    assert all(isinstance(text, str) for r in replies for text in r)
    assert backend.generate(requests) == replies  # seeded sampling: a redone step asks for the very same thing


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=str(BWRAP_PROBLEM))
def test_pipeline_with_a_local_model_counts_unusable_replies(tiny_model_dir, tmp_path):
    args = SyntheticGSM8KArguments(
        seeds=str(SEEDS), max_seeds=2, output_dir=str(tmp_path / "out"), backend="transformers",
        model=str(tiny_model_dir), batch_size=2, max_tokens=8, max_program_rounds=1, sandbox_workers=1,
    )  # fmt: skip
    # A random tiny model writes no JSON: both seeds fail at step 1, each counted; with no seed solved there is no
    # dataset, and the run says so (the entry point exits 1) instead of writing an empty one with a manifest.
    with pytest.raises(NothingSolved, match=r"no seed problem was solved \(2 tried; most common rejections: "
                       r"abstract_unparsable 2\)"):  # fmt: skip
        run(args)
    assert not (tmp_path / "out" / "train.parquet").exists() and not (tmp_path / "out" / "manifest.json").exists()
