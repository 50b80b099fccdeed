"""Speculative decoding (instella_recipes.evaluation.speculative, scripts/speculative.py): counts read from
transformers' candidate generator, the draft = target identity, the published vocab padding (draft vocab < target
vocab), warmed-up interleaved repeats, the Leviathan et al. bound, sandboxed pass@1 on real HumanEval, bad input."""

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from instella_recipes.core import RecipeError
from instella_recipes.data.tokenizer import train_bpe_tokenizer
from instella_recipes.evaluation import speculative as spec
from tests.helpers.synthetic_fakes import BWRAP_PROBLEM

MAX_NEW = 12


def _llama(folder, tokenizer, vocab_size, seed, hidden=32):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_tokenizer):
    """A tiny Llama target (vocab padded by 16 ids, like CodeLlama's 32016 vs 32000) and a smaller random draft."""
    root = tmp_path_factory.mktemp("spec")
    target = _llama(root / "target", tiny_tokenizer, len(tiny_tokenizer) + 16, seed=0, hidden=48)
    draft = _llama(root / "draft", tiny_tokenizer, len(tiny_tokenizer), seed=1)
    return target, draft


def test_draft_equal_to_target_accepts_every_token_and_keeps_greedy_output(pair):
    target_dir, _ = pair
    target, draft, tok = spec.load_pair(target_dir, target_dir)
    # draft 4 tokens per round, never stopping early on low draft confidence (fewer rounds, same property)
    draft.generation_config.num_assistant_tokens, draft.generation_config.assistant_confidence_threshold = 4, 0.0
    prompts = spec.load_prompts(spec.HUMANEVAL, limit=2)
    no_eos = {"eos_token_id": None}
    result = spec.run_mode(target, draft, tok, prompts, "greedy", MAX_NEW, gen_overrides=no_eos, repeats=2)
    assert result.counts.drafted >= 2 * 2 * (MAX_NEW - 4)  # per prompt and repeat: all but the bonus tokens drafted
    assert result.counts.accepted == result.counts.drafted
    assert result.counts.rejections == 0 and result.counts.token_acceptance == 1.0
    assert result.identical == result.prompts == 2
    assert result.new_tokens_base == result.new_tokens_assisted == 2 * 2 * MAX_NEW  # 2 repeats, warm-up not counted
    assert [len(ids) for ids in result.token_ids_base] == [MAX_NEW, MAX_NEW]  # the target's own tokens, 1st repeat
    summary = result.summary()
    assert summary["repeats"] == 2 and summary["speedup_min"] <= summary["speedup"] <= summary["speedup_max"]

    sampled = spec.run_mode(target, draft, tok, prompts[:1], "sampled", MAX_NEW, gen_overrides=no_eos)
    assert sampled.counts.drafted > 0 and sampled.counts.accepted == sampled.counts.drafted


def test_smaller_vocab_draft_is_padded_and_greedy_output_stays_the_targets(pair):
    target_dir, draft_dir = pair
    target, draft, tok = spec.load_pair(target_dir, draft_dir)
    assert draft.config.vocab_size == target.config.vocab_size == len(tok) + 16
    logits = draft(torch.tensor([[5, len(tok) + 3]])).logits  # a target-only id goes in, padded logits come out
    assert logits.shape[-1] == len(tok) + 16
    assert torch.isinf(logits[..., len(tok) :]).all() and torch.isfinite(logits[..., : len(tok)]).all()
    draft.generation_config.num_assistant_tokens, draft.generation_config.assistant_confidence_threshold = 3, 0.0
    prompts = spec.load_prompts(spec.HUMANEVAL, limit=1)
    result = spec.run_mode(target, draft, tok, prompts, "greedy", MAX_NEW)
    assert result.identical == 1  # assisted greedy is exact whatever the draft proposes
    assert 0 <= result.counts.accepted <= result.counts.drafted
    assert result.counts.rejections <= result.counts.rounds
    summary = result.summary()
    assert summary["acceptance_rate"] == result.counts.accepted / result.counts.drafted
    assert "| greedy |" in spec.format_markdown([summary])


def test_token_acceptance_counts_only_judged_draft_tokens():
    # k = 4, three rounds: 4 accepted (no rejection), 1 accepted then a rejection, 0 accepted (rejected at once).
    # accepted / drafted = 5 / 12; the tokens after a rejection are never judged, so a = 5 / (5 + 2)
    counts = spec.DraftCounts(drafted=12, accepted=5, rounds=3, rejections=2)
    assert counts.acceptance_rate == pytest.approx(5 / 12) and counts.token_acceptance == pytest.approx(5 / 7)


def test_speedup_bound_matches_hand_computation():
    # a = 0.5, k = 3, c = 0.1: (1 - 0.5^4) / (0.5 * 1.3) = 0.9375 / 0.65
    assert spec.speedup_bound(0.5, 3, 0.1) == pytest.approx(0.9375 / 0.65)
    assert spec.speedup_bound(1.0, 4, 0.0) == 5.0  # every draft accepted, free draft: k + 1 tokens per target pass
    assert spec.speedup_bound(0.0, 8, 0.05) == pytest.approx(1 / 1.4)  # nothing accepted: the draft is pure cost
    # a verification over k + 1 tokens that costs 1.5 decoding steps: the same tokens for k*c + 1.5
    assert spec.speedup_bound(0.5, 3, 0.1, verify_cost=1.5) == pytest.approx(0.9375 / (0.5 * 1.8))


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=str(BWRAP_PROBLEM))
def test_pass_at_1_runs_in_the_sandbox(pair, tmp_path):
    from instella_recipes.evaluation import humaneval
    from instella_recipes.sandbox import SandboxPool

    target_dir, draft_dir = pair
    target, draft, tok = spec.load_pair(target_dir, draft_dir)
    prompts = spec.load_prompts(spec.HUMANEVAL, limit=2)
    with SandboxPool(humaneval.sandbox_config(timeout=3.0)) as pool:
        result = spec.run_mode(target, draft, tok, prompts, "greedy", 4, pool=pool)
    assert result.passed_base == result.passed_assisted == 0  # a random model's 4 tokens solve nothing
    assert len(result.completions_base) == 2 and result.summary()["pass@1_base"] == 0.0

    out = tmp_path / "spec.json"
    argv = ["--target", str(target_dir), "--draft", str(draft_dir), "--limit", "1", "--max_new_tokens", "4"]
    assert spec.main([*argv, "--modes", "greedy", "--repeats", "1", "--output", str(out)]) == 0
    (summary,) = json.loads(out.read_text())
    assert summary["pass@1_base"] == 0.0 and summary["identical_outputs"] == 1


def test_bad_inputs_fail_before_any_weights_are_read(pair, tmp_path):
    target_dir, draft_dir = pair
    with pytest.raises(RecipeError, match="does not exist"):
        spec.load_pair(tmp_path / "missing", draft_dir)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecipeError, match="no config.json"):
        spec.load_pair(target_dir, tmp_path / "empty")

    # A draft whose tokenizer numbers tokens differently; its weights file holds none of the model's tensors (a
    # readable header, so the folder check passes), so reaching it would fail with a loading error instead of ours.
    other_tok = train_bpe_tokenizer(["completely different text " * 50, "zebra quartz yodel " * 50], vocab_size=300)
    bad = _llama(tmp_path / "bad", other_tok, len(other_tok), seed=2)
    save_file({"not_weights": torch.zeros(1)}, str(bad / "model.safetensors"))
    with pytest.raises(RecipeError, match="tokenizer is incompatible"):
        spec.load_pair(target_dir, bad)
    with pytest.raises(SystemExit) as exit_info:
        spec.main(["--target", str(target_dir), "--draft", str(bad), "--no-execute"])
    assert exit_info.value.code == 2

    bigger = _llama(tmp_path / "bigger", other_tok, 4096, seed=3)
    with pytest.raises(RecipeError, match="draft vocab_size 4096 > target"):
        spec.load_pair(target_dir, bigger)

    broken = tmp_path / "prompts.jsonl"
    broken.write_text(json.dumps({"task_id": "x", "prompt": "def f():\n"}) + "\n")
    with pytest.raises(RecipeError, match="missing fields"):
        spec.load_prompts(broken)


def _recorded_rounds(target, draft, input_ids, draft_loop, **gen):
    """Assisted generation (greedy unless `gen` says) and, per round, the candidate generator's class, the drafted
    ids and the draft scores."""
    spec.count_drafts(target, spec.DraftCounts(), draft_loop)
    build, rounds = target._get_candidate_generator, []

    def recording(*args, **kwargs):
        generator = build(*args, **kwargs)
        inner = generator.get_candidates

        def get_candidates(ids, *a, **kw):
            candidates, scores = inner(ids, *a, **kw)
            rounds.append((type(generator).__name__, candidates[0, ids.shape[1] :].tolist(), scores))
            return candidates, scores

        generator.get_candidates = get_candidates
        return generator

    target._get_candidate_generator = recording
    with torch.inference_mode():
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft,
                              pad_token_id=0, **{"do_sample": False, **gen})  # fmt: skip
    return out, rounds


@pytest.mark.parametrize(
    "draft_is_target, gen",
    [
        (True, {"max_new_tokens": MAX_NEW, "eos_token_id": None}),  # every draft accepted: the cache only grows
        (False, {"max_new_tokens": MAX_NEW, "eos_token_id": None}),  # rejections: the cache is cropped each round
        (False, {"max_new_tokens": MAX_NEW, "repetition_penalty": 1.5, "eos_token_id": None}),  # a processor
        (False, {"max_new_tokens": MAX_NEW, "min_new_tokens": 6}),  # EOS masked, then allowed and stopped at
    ],
)
def test_draft_loop_drafts_exactly_what_transformers_generator_drafts(pair, draft_is_target, gen):
    """Our draft loop against transformers' own AssistedCandidateGenerator, round by round: the same drafted ids,
    the same draft scores, the same final output, which is the target's own greedy output."""
    target_dir, draft_dir = pair
    target, draft, tok = spec.load_pair(target_dir, target_dir if draft_is_target else draft_dir)
    spec.set_draft_length(draft, 4)
    input_ids = tok(spec.load_prompts(spec.HUMANEVAL, limit=1)[0]["prompt"], return_tensors="pt").input_ids
    if "min_new_tokens" in gen:  # make EOS the draft's favourite token, so both the masking and the stop are hit

        def favour_eos(module, inputs, logits):
            return logits.index_add(-1, torch.tensor([tok.eos_token_id]), torch.full_like(logits[..., :1], 1e3))

        draft.lm_head.register_forward_hook(favour_eos)
    ours, ours_rounds = _recorded_rounds(target, draft, input_ids, True, **gen)
    theirs, their_rounds = _recorded_rounds(target, draft, input_ids, False, **gen)
    assert {name for name, _, _ in ours_rounds} == {"DraftLoopCandidateGenerator"}
    assert {name for name, _, _ in their_rounds} == {"AssistedCandidateGenerator"}
    assert [ids for _, ids, _ in ours_rounds] == [ids for _, ids, _ in their_rounds]
    for (_, _, mine), (_, _, reference) in zip(ours_rounds, their_rounds):
        if reference is None:  # a round with no room left to draft (max_length reached): the parent answers it
            assert mine is None
            continue
        finite = torch.isfinite(reference)
        assert torch.equal(finite, torch.isfinite(mine))
        torch.testing.assert_close(mine[finite], reference[finite], rtol=1e-4, atol=1e-4)
    assert torch.equal(ours, theirs)
    with torch.inference_mode():
        alone = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, pad_token_id=0,
                                **gen)  # fmt: skip
    assert torch.equal(ours, alone)
    if draft_is_target:
        assert len(ours_rounds) < MAX_NEW // 2 and all(len(ids) == 4 for _, ids, _ in ours_rounds[:-1])
    if "min_new_tokens" in gen:
        # the draft's favourite token is masked while fewer than 6 tokens are new, then drafted, and drafting stops
        assert tok.eos_token_id not in ours_rounds[0][1] and len(ours_rounds[0][1]) == 4
        assert any(ids and ids[-1] == tok.eos_token_id and len(ids) < 4 for _, ids, _ in ours_rounds[1:])


def test_draft_loop_stays_out_where_it_would_change_the_draft(pair):
    """Sampling and transformers' adaptive confidence stop keep transformers' own generator."""
    target_dir, draft_dir = pair
    target, draft, tok = spec.load_pair(target_dir, draft_dir)
    input_ids = tok("def f(x):", return_tensors="pt").input_ids
    draft.generation_config.num_assistant_tokens, draft.generation_config.assistant_confidence_threshold = 3, 0.4
    _, rounds = _recorded_rounds(target, draft, input_ids, True, max_new_tokens=4)
    assert {name for name, _, _ in rounds} == {"AssistedCandidateGenerator"}
    spec.set_draft_length(draft, 3)
    _, rounds = _recorded_rounds(target, draft, input_ids, True, max_new_tokens=4, do_sample=True)
    assert {name for name, _, _ in rounds} == {"AssistedCandidateGenerator"}


def test_only_prompts_that_fit_the_context_are_used(pair, tmp_path, monkeypatch):
    """The demo's tiny target has a 256-token context; HumanEval prompts through its TinyWorld BPE are longer. A
    prompt plus its new tokens must fit: longer ones are passed over (counted), the first `limit` that fit are used."""
    target_dir, draft_dir = pair
    _target, _draft, tok = spec.load_pair(target_dir, draft_dir)
    prompts = spec.load_prompts(spec.HUMANEVAL, limit=12)
    lengths = [len(tok(p["prompt"]).input_ids) for p in prompts]
    context = sorted(lengths)[len(lengths) // 2] + MAX_NEW  # about half of them fit
    kept, skipped = spec.prompts_that_fit(prompts, tok, context, MAX_NEW, limit=3)
    fitting = [p for p, n in zip(prompts, lengths) if n + MAX_NEW <= context]
    assert kept == fitting[:3] and skipped == prompts.index(fitting[2]) - 2
    with pytest.raises(RecipeError, match="no prompt fits"):
        spec.prompts_that_fit(prompts, tok, min(lengths), MAX_NEW)

    # the script applies it with the models' own context (here made as short as a tiny target's)
    monkeypatch.setattr(spec, "context_length", lambda *models: context)
    out = tmp_path / "spec.json"
    argv = ["--target", str(target_dir), "--draft", str(draft_dir), "--limit", "1", "--max_new_tokens", str(MAX_NEW)]
    assert spec.main([*argv, "--modes", "greedy", "--repeats", "1", "--no-execute", "--output", str(out)]) == 0
    (summary,) = json.loads(out.read_text())
    assert summary["prompts_skipped_too_long"] == prompts.index(fitting[0]) and summary["context_tokens"] == context
