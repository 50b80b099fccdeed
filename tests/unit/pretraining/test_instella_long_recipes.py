"""recipes/instella-3b-long/ parse (unknown keys are errors) and carry the published numbers
(../shared/INSTELLA_LONG_MATH.md 1.1 and 1.6, from the authors' configs on the instella-long branch, 560ebe7);
the SFT recipe's are checked in tests/unit/post_training/test_sft_long_inputs.py."""

from pathlib import Path

import yaml
from trl import ModelConfig

from instella_recipes.core import parse_recipe
from instella_recipes.data import mds
from instella_recipes.pipeline.graph import load_pipeline
from instella_recipes.post_training import dpo
from instella_recipes.pretraining.pretrain import PretrainArguments

ROOT = Path(__file__).resolve().parents[3]
LONG = ROOT / "recipes" / "instella-3b-long"
GPUS = 64  # 8 nodes x 8 MI300X ([BLOG-L] Key Takeaways)


def _pretrain(name: str) -> PretrainArguments:
    (args,) = parse_recipe([PretrainArguments], ["--config", str(LONG / name), "--use_cpu", "true", "--bf16", "false"])
    return args


def _common_optimizer(args) -> None:
    """AdamW (0.9, 0.95), eps 1e-8, wd 0.1 on every parameter (InstellaOptimMixin), clip 1.0, the linear schedule
    from 0.1 x peak to 0.001 x peak, seed 6198, micro-batch 1, document masking, the authors' loss normaliser."""
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon, args.weight_decay) == (0.9, 0.95, 1e-8, 0.1)
    assert args.max_grad_norm == 1.0 and args.seed == 6198 and args.per_device_train_batch_size == 1
    assert args.lr_scheduler_kwargs == {"alpha_f": 0.001} and str(args.lr_scheduler_type.value) == "linear"
    assert args.document_masking and args.loss_reduction == "input_tokens" and args.gradient_checkpointing


def test_phase1_is_64k_at_rope_514640_for_5000_steps_of_64_rows_with_a_fresh_adamw():
    args = _pretrain("pretrain_phase1.yaml")
    _common_optimizer(args)
    assert (args.seq_len, args.rope_theta, args.max_steps, args.global_batch_size) == (65_536, 514_640, 5000, 64)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * GPUS == 64
    assert (args.learning_rate, args.warmup_steps, args.sequence_parallel_size) == (2e-5, 500, 1)
    assert not args.load_optimizer_state and args.optimizer_state_from is None and args.save_optimizer_state
    assert args.model_name_or_path == "runs/instella-3b-long/start"


def test_phase2_is_256k_at_rope_3691950_sp4_for_2500_steps_of_32_rows_with_phase1_moments():
    args = _pretrain("pretrain_phase2.yaml")
    _common_optimizer(args)
    assert (args.seq_len, args.rope_theta, args.max_steps, args.global_batch_size) == (262_144, 3_691_950, 2500, 32)
    size = args.sequence_parallel_size
    assert (size, args.sequence_parallel_mode, args.force_sequence_parallel) == (4, "authors", False)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * GPUS // size == 32
    assert (args.learning_rate, args.warmup_steps) == (2e-5, 250)
    assert args.optimizer_state_from == "runs/instella-3b-long/phase1"  # moments kept; step and schedule reset
    assert args.seq_len % size == 0


# The authors' data.paths (configs/instella-3b-long-pretrain-phase{1,2}.yaml L109-119, 560ebe7)
AUTHORS_STREAMS = {
    "pretrain_phase1.yaml": {
        "code": 0.3, "books": 0.3, "textbooks": 0.03, "fineweb-edu": 0.1, "fineweb": 0.1, "wikipedia": 0.05,
        "openwebmath": 0.05, "stackexchange": 0.04, "arxiv": 0.03,
    },
    "pretrain_phase2.yaml": {
        "code-262144": 0.2, "code-65536": 0.1, "books-262144": 0.15, "books-65536": 0.15, "textbooks": 0.02,
        "fineweb-edu": 0.1, "fineweb": 0.1, "wikipedia": 0.05, "openwebmath": 0.05, "stackexchange": 0.04,
        "arxiv": 0.04,
    },
}  # fmt: skip


def test_the_phases_read_the_authors_mds_folders_with_their_proportions():
    for name, expected in AUTHORS_STREAMS.items():
        args = _pretrain(name)
        phase = "pretrain-phase-1" if "phase1" in name else "pretrain-phase-2"
        streams = mds.parse_streams(args.mds_streams, args.data_root)
        assert {folder.name: p for folder, p in streams} == expected
        assert {folder.parent for folder, _ in streams} == {Path("data/raw/Instella-Long") / phase}
        assert args.data_dir is None and abs(sum(expected.values()) - 1.0) < 1e-9
        # unset by the authors: streaming's default, their 8 nodes over the replication (SP 1 / SP 4)
        assert args.num_canonical_nodes == (8 if "phase1" in name else 2)


def test_dpo_is_the_authors_open_instruct_run():
    argv = ["--config", str(LONG / "dpo.yaml"), "--use_cpu", "true", "--bf16", "false"]
    args, model = parse_recipe([dpo.CheckedDPOConfig, ModelConfig], argv)
    assert (args.learning_rate, args.beta, args.max_length, args.weight_decay) == (5e-7, 5.0, 2048, 0.0)
    assert args.warmup_steps == 0.1 and str(args.lr_scheduler_type.value) == "linear" and args.num_train_epochs == 1
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * 8 == args.global_batch_size == 128
    sources = yaml.safe_load((LONG / "dpo.yaml").read_text())["sources"]
    assert [s["path"] for s in sources] == ["allenai/olmo-2-1124-7b-preference-mix"]
    assert model.model_name_or_path == "runs/instella-3b-long/sft"
    assert list(args.loss_type) in (["dpo_norm"], ["sigmoid_norm"])  # open-instruct dpo_norm = TRL sigmoid_norm


def test_pipeline_chains_the_phases_with_the_rope_changes():
    pipeline = load_pipeline(LONG / "pipeline.yaml")
    assert [s.name for s in pipeline.stages] == ["start", "phase1", "phase2_start", "phase2", "sft", "dpo"]
    start, phase2_start = pipeline.stage("start"), pipeline.stage("phase2_start")
    assert "514640" in start.args and "65536" in start.args and "reconfigure" in start.args
    assert "3691950" in phase2_start.args and "262144" in phase2_start.args
    assert pipeline.stage("phase2").inputs == ["phase2_start", "phase1"]
