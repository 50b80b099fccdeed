"""Ulysses sequence parallelism (a training feature, `features/__init__.py`), as Instella-Long trains phase 2 and its
SFT (the authors' `seq_parallel_size`).

The ranks of one sequence-parallel (SP) group read the same packed row (batch size 1); rank r keeps the contiguous
chunk r of its tokens. Every layer runs on the chunk except attention, where an all-to-all scatters the heads and
gathers the tokens (q, k, v: `(1, H, T/sp, D)` -> `(1, H/sp, T, D)`), transformers' own attention function runs on
the whole row for its heads with the per-document mask, and the inverse all-to-all brings the output back to
`(1, T/sp, H, D)` (DeepSpeed-Ulysses; the authors' `instella/distributed_attention.py`). RoPE needs nothing: each chunk
carries its slice of the row's `position_ids`.

Two named modes (`sequence_parallel_mode`):
- `"authors"` (the recipes' default): what the authors' `get_sequence_parallel_inputs` does
  (`instella/train.py` L803-867 on their `instella-long` branch). When no document is longer than a chunk and SP is
  not forced, attention stays on the chunk with the documents cut at the chunk borders (the two halves of a document
  that straddles a border do not see each other); otherwise the Ulysses path. Either way the targets are the chunk's
  own tokens shifted by one, so the last token of each chunk has no target (sp - 1 targets dropped per row).
- `"exact"`: always the Ulysses path, and the targets are the row's shifted before it is cut (as DeepSpeed's ALST
  does), so logits, loss and gradients equal one process's.

The loss normaliser is the Trainer's `num_items_in_batch` divided by the SP size (the ranks of a group count the same
row), which with SFT's `loss_reduction: input_tokens` is the authors' `batch['input_ids'].numel() / seq_parallel_size`.

Why it is ours: accelerate's `ParallelismConfig(sp_size=...)` has one backend, DeepSpeed's ALST (`sp_backend` accepts
"deepspeed" only: `UlyssesSPAttentionHF` + `UlyssesSPDataLoaderAdapter`, accelerate 1.15 `accelerator.py` L2395-2445),
which needs DeepSpeed's engine (not a dependency here, no CPU/gloo path), always takes the exact path and keeps the
chunk-border targets, so it cannot express the authors' fallback; its `cp_size` is ring attention (torch's
`context_parallel`, FSDP2, plain causal SDPA: no document mask). What is ours is the data layout and the all-to-all
around transformers' attention functions; the collective with autograd is torch's
(`torch.distributed.nn.functional.all_to_all`) and the attention is transformers' (`ALL_ATTENTION_FUNCTIONS`: sdpa on
CPU, flash_attention_2 varlen on GPU, or flex_attention with a block-sparse document mask where flash-attn is absent).
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate.data_loader import prepare_data_loader
from torch.distributed.nn.functional import all_to_all
from torch.nn.attention.flex_attention import create_block_mask
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import (
    and_masks,
    causal_mask_function,
    find_packed_sequence_indices,
    flex_attention_mask,
    packed_sequence_mask_function,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from instella_recipes.core.checks import check_choice, check_range
from instella_recipes.core.errors import RecipeError

from .feature import Feature

SP_MODES = ("authors", "exact")
ATTENTION_PREFIX = "ulysses_"
# transformers' attention functions the Ulysses wrapper can run (eager is model-specific and not in the registry).
INNER_ATTENTION = ("sdpa", "flash_attention_2", "flex_attention", "flash_attention_3")
_ACTIVE: "SequenceParallel | None" = None
DROPPED_KEYS = ("attention_mask", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def check_sequence_parallel(
    size: int, seq_len: int | None, world_size: int, config=None, micro_batch: int = 1, length_field: str = "seq_len"
):
    """The one rule of an SP launch: the bad inputs as one message each (ValueError); nothing is started. `seq_len`
    is what every row's length is a multiple of (named `length_field` in the message), `config` the model's."""
    if size == 1:
        return
    if seq_len is not None and seq_len % size:
        raise ValueError(
            f"{length_field} {seq_len} is not divisible by sequence_parallel_size {size}: each rank keeps an equal "
            f"chunk of a row (the authors assert the same); choose a multiple of {size}"
        )
    if world_size % size:
        raise ValueError(
            f"sequence_parallel_size {size} does not divide the world size ({world_size} processes): launch a "
            f"multiple of {size} processes or choose a divisor of {world_size}"
        )
    if micro_batch != 1:
        raise ValueError(
            f"per_device_train_batch_size {micro_batch} with sequence_parallel_size {size}: SP takes one packed row "
            f"per micro-step (the authors: 'Multi-sequence sequence parallel is not supported'); set it to 1 and "
            f"use gradient_accumulation_steps"
        )
    if config is not None:
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
        if heads % size or kv_heads % size:
            raise ValueError(
                f"sequence_parallel_size {size} does not divide the model's attention heads ({heads} query, "
                f"{kv_heads} key/value): Ulysses gives each rank heads/sp whole heads; choose a divisor"
            )


@dataclass
class SequenceParallelArguments:
    """The recipe fields of a stage that can train with sequence parallelism (pretraining, SFT); a mixin of its
    settings class. Each defines the run (`role: run`): the authors' mode changes what is trained on."""

    sequence_parallel_size: int = field(
        default=1,
        metadata={"role": "run", "help": "Ulysses SP group size (the authors' seq_parallel_size); 1: off."},
    )
    sequence_parallel_mode: str = field(
        default="authors",
        metadata={
            "role": "run",
            "help": "authors: their chunk-local fallback and chunk-local targets; exact: always all-to-all.",
        },
    )
    force_sequence_parallel: bool = field(
        default=False,
        metadata={"role": "run", "help": "authors mode: all-to-all even when no document exceeds a chunk (SFT)."},
    )

    def __post_init__(self):
        check_range("sequence_parallel_size", self.sequence_parallel_size, 1, integer=True)
        check_choice("sequence_parallel_mode", self.sequence_parallel_mode, SP_MODES)
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()


def check_launch(args, row_length: int | None, length_field: str = "seq_len", config=None) -> None:
    """`check_sequence_parallel` on a stage's settings, as a RecipeError naming the field."""
    try:
        check_sequence_parallel(
            args.sequence_parallel_size, row_length, args.world_size, config, args.per_device_train_batch_size,
            length_field,
        )  # fmt: skip
    except ValueError as err:
        raise RecipeError(str(err)) from None


def sequence_parallel_for(args: SequenceParallelArguments, config, seq_len: int | None):
    """Check an SP launch against the model (RecipeError naming the field) and make this process's group; None when
    SP is off. Every process must call it (the groups are made collectively)."""
    check_launch(args, seq_len, config=config)
    if args.sequence_parallel_size == 1:
        return None
    return SequenceParallel.create(args.sequence_parallel_size, args.sequence_parallel_mode,
                                   args.force_sequence_parallel)  # fmt: skip


class SequenceParallel:
    """One process's place in its SP group and the plan of the row it is training on (set by `shard`)."""

    def __init__(self, size: int, mode: str = "authors", force: bool = False, group=None):
        if mode not in SP_MODES:
            raise ValueError(f"sequence_parallel_mode {mode!r}: choose one of {', '.join(SP_MODES)}")
        self.size, self.mode, self.force, self.group = size, mode, force, group
        self.rank = dist.get_rank(group) if group is not None else 0
        self.local = False  # this row: attention on the chunk only (the authors' fallback)
        self.doc_ids: torch.Tensor | None = None  # (1, T): document index of every token of the whole row
        self._masks: dict = {}

    @classmethod
    def create(cls, size: int, mode: str = "authors", force: bool = False) -> "SequenceParallel":
        """Groups of `size` consecutive ranks ([0..sp-1], [sp..2sp-1], ...), as the authors' `dist.new_subgroups`;
        a group of its own even when it spans the world, so its collectives never queue behind DDP's."""
        group, _ = dist.new_subgroups(group_size=size)
        return cls(size, mode, force, group)

    def chunk_bounds(self, seq_len: int) -> tuple[int, int]:
        chunk = seq_len // self.size
        return self.rank * chunk, (self.rank + 1) * chunk

    def shard(self, inputs: dict) -> dict:
        """The whole batch (the same row on every rank of the group) -> this rank's chunk of it, with the targets of
        the mode (`shift_labels` of the whole row on the exact path; the chunk's own labels for the authors')."""
        ids = inputs["input_ids"]
        batch, seq_len = ids.shape
        check_sequence_parallel(self.size, seq_len, self.size, micro_batch=batch, length_field="a row of")
        mask = inputs.get("attention_mask")
        if mask is not None and not bool(mask.all()):
            raise ValueError("sequence parallelism takes padding-free rows (documents told apart by position_ids)")
        positions = inputs.get("position_ids")
        if positions is None and inputs.get("cu_seq_lens_q") is not None:  # documents given as varlen boundaries
            positions = _segment_positions(inputs["cu_seq_lens_q"].diff().to(ids.device))
        if positions is None:
            positions = torch.arange(seq_len, device=ids.device)[None]
        self._plan(positions)
        lo, hi = self.chunk_bounds(seq_len)
        # the row's mask and varlen boundaries do not describe a chunk: attention takes its own from `_plan`
        out = {k: v for k, v in inputs.items() if k not in DROPPED_KEYS}
        for key, value in out.items():
            if torch.is_tensor(value) and value.dim() == 2 and value.shape[-1] == seq_len:
                out[key] = value[:, lo:hi]
        out["position_ids"] = positions[:, lo:hi]
        if self.mode == "exact" and "labels" in inputs and "shift_labels" not in inputs:
            shifted = F.pad(inputs["labels"][:, 1:], (0, 1), value=-100)
            out["shift_labels"] = shifted[:, lo:hi].contiguous()
        return out

    def _plan(self, positions: torch.Tensor) -> None:
        """Documents of the whole row (a new one wherever position_ids do not go up by one: transformers' rule for
        packed rows) and whether this row takes the authors' chunk-local fallback."""
        doc_ids = find_packed_sequence_indices(positions)
        self.doc_ids = torch.zeros_like(positions) if doc_ids is None else doc_ids
        longest = int(torch.bincount(self.doc_ids[0]).max())
        self.local = self.mode == "authors" and not self.force and longest <= positions.shape[-1] // self.size
        self._masks = {}

    def mask(self, local: bool) -> torch.Tensor:
        """Causal and same-document, `(1, 1, q, k)` bool: of the whole row, or of this rank's chunk (whose first
        token starts a document: the authors' `doc_lens` re-cut at the chunk borders)."""
        if local not in self._masks:
            doc = self.doc_ids
            if local:
                lo, hi = self.chunk_bounds(doc.shape[-1])
                doc = doc[:, lo:hi]
            same = doc[:, :, None] == doc[:, None, :]
            self._masks[local] = (same & torch.ones_like(same).tril())[:, None]
        return self._masks[local]

    def block_mask(self, local: bool, device):
        """The same mask as `mask(local)` as flex_attention's block-sparse `BlockMask`, built by transformers'
        `flex_attention_mask` with its packed-sequence mask function (only the blocks of each document's diagonal
        are computed)."""
        if ("flex", local) not in self._masks:
            doc = self.doc_ids
            if local:
                lo, hi = self.chunk_bounds(doc.shape[-1])
                doc = doc[:, lo:hi]
            doc = doc.to(device)
            same_document = and_masks(causal_mask_function, packed_sequence_mask_function(doc))
            if torch.compiler.is_compiling():  # transformers' `_compile=True` warns in torch 2.13: a graph break
                mask = create_block_mask(same_document, 1, None, doc.shape[-1], doc.shape[-1], device=device)
            else:
                mask = flex_attention_mask(1, doc.shape[-1], doc.shape[-1], mask_function=same_document, device=device)
            self._masks[("flex", local)] = mask
        return self._masks[("flex", local)]

    def segment_lengths(self, local: bool) -> torch.Tensor:
        """Document lengths (the varlen `cu_seqlens` differences) of the whole row or of this rank's chunk."""
        doc = self.doc_ids[0]
        if local:
            lo, hi = self.chunk_bounds(doc.shape[-1])
            doc = doc[lo:hi]
        return torch.unique_consecutive(doc, return_counts=True)[1]


def _seq_all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, sp: SequenceParallel) -> torch.Tensor:
    """The authors' `SeqAllToAll`: split `x` into sp parts along `scatter_dim`, send part j to rank j, and join
    what arrives along `gather_dim` in rank order. Its backward is the same exchange with the dims swapped."""
    parts = [p.contiguous() for p in x.chunk(sp.size, dim=scatter_dim)]
    received = all_to_all([torch.empty_like(p) for p in parts], parts, group=sp.group)
    return torch.cat(received, dim=gather_dim)


def _segment_positions(lengths: torch.Tensor) -> torch.Tensor:
    """position_ids restarting at 0 per document: how transformers' flash path finds the varlen boundaries."""
    starts = torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
    return (torch.arange(int(lengths.sum()), device=lengths.device) - starts)[None]


def _inner(module, query, key, value, sp: SequenceParallel, local: bool, kwargs: dict):
    """transformers' attention function (the model's `ulysses_<name>`) with the document mask of `local`."""
    # private: the config's attention name, how transformers' own models pick their function [test_private_apis]
    name = module.config._attn_implementation.removeprefix(ATTENTION_PREFIX)
    if name == "sdpa":
        return sdpa_attention_forward(module, query, key, value, sp.mask(local), **kwargs)
    if name == "flex_attention":
        return ALL_ATTENTION_FUNCTIONS[name](module, query, key, value, sp.block_mask(local, query.device), **kwargs)
    kwargs["position_ids"] = _segment_positions(sp.segment_lengths(local).to(query.device))
    return ALL_ATTENTION_FUNCTIONS[name](module, query, key, value, None, **kwargs)


def ulysses_attention(module, query, key, value, attention_mask, **kwargs):
    """An attention function for transformers' `AttentionInterface` (registered as `ulysses_<inner>`): q/k/v
    `(1, heads, T/sp, D)` of this rank's chunk in, `(1, T/sp, heads, D)` out, as every attention function."""
    sp = _ACTIVE
    if sp is None or sp.doc_ids is None:
        raise RuntimeError("ulysses attention runs only inside a sequence-parallel step (SequenceParallel.shard)")
    kwargs.pop("position_ids", None)  # the chunk's; the masks come from the whole row's documents
    if sp.local:
        return _inner(module, query, key, value, sp, True, kwargs)
    q, k, v = (_seq_all_to_all(t, 1, 2, sp) for t in (query, key, value))  # heads scattered, tokens gathered
    out, _ = _inner(module, q, k, v, sp, False, kwargs)  # (1, T, heads/sp, D)
    return _seq_all_to_all(out, 1, 2, sp), None  # tokens scattered, heads gathered


# modeling_instella's HANDLES_DOCUMENTS: the model passes packed rows to this wrapper (it masks them by `_plan`)
ulysses_attention.handles_documents = True


def enable(model, sp: SequenceParallel) -> str:
    """Route `model`'s attention through Ulysses around its current implementation; returns that one (`disable`)."""
    global _ACTIVE
    current = model.config._attn_implementation  # private: as above [test_private_apis]
    if current not in INNER_ATTENTION:
        raise ValueError(
            f"sequence parallelism wraps attn_implementation sdpa, flash_attention_2 or flex_attention, not "
            f"{current!r}: set attn_implementation to one of {', '.join(INNER_ATTENTION[:3])}"
        )
    AttentionInterface.register(ATTENTION_PREFIX + current, ulysses_attention)
    model.set_attn_implementation(ATTENTION_PREFIX + current)
    _ACTIVE = sp
    return current


def disable(model, previous: str) -> None:
    """Give `model` back its own attention (before it is saved or evaluated)."""
    global _ACTIVE
    model.set_attn_implementation(previous)
    _ACTIVE = None


def _prepare_data_parallel(accelerator, sp_size: int):
    """`Accelerator.prepare_data_loader` sharding over the data-parallel ranks only: process p reads what process
    p // sp of world / sp would (the authors' `replication = seq_parallel_size`), so an SP group shares its rows.
    accelerate shards over every process unless a device mesh says otherwise, and its mesh for SP exists only with
    the DeepSpeed backend; the call below is accelerate's own, with the data-parallel rank and size."""

    def prepare(data_loader, device_placement=None, slice_fn_for_dispatch=None):
        if getattr(data_loader, "_is_accelerate_prepared", False):
            return data_loader
        prepared = prepare_data_loader(
            data_loader,
            accelerator.device,
            num_processes=accelerator.num_processes // sp_size,
            process_index=accelerator.process_index // sp_size,
            split_batches=accelerator.split_batches,
            put_on_device=accelerator.device_placement if device_placement is None else device_placement,
            rng_types=accelerator.rng_types.copy(),
            dispatch_batches=accelerator.dispatch_batches,
            even_batches=accelerator.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=accelerator.use_seedable_sampler,
            data_seed=accelerator.dataloader_config.data_seed,
            non_blocking=accelerator.non_blocking,
            use_stateful_dataloader=accelerator.use_stateful_dataloader,
        )
        # private: the accelerator's list of its dataloaders (for checkpointing their state) [test_private_apis]
        accelerator._dataloaders.append(prepared)
        return prepared

    return prepare


class SequenceParallelMixin:
    """Trainer mixin: `sequence_parallel=SequenceParallel.create(...)` (None or size 1: off). Shards each batch in
    `compute_loss`, routes attention through `ulysses_attention`, reads one row per SP group, and counts the loss
    normaliser once per group (whatever the stage counts: pretraining's input tokens, SFT's `loss_reduction`)."""

    def __init__(self, *args, sequence_parallel: SequenceParallel | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.sequence_parallel = sequence_parallel if sequence_parallel and sequence_parallel.size > 1 else None
        self.inner_attention = None
        if self.sequence_parallel is not None:
            self.inner_attention = enable(self.model, self.sequence_parallel)
            self.accelerator.prepare_data_loader = _prepare_data_parallel(self.accelerator, sequence_parallel.size)

    def restore_attention(self) -> None:
        """Before saving or evaluating: the model's own attention implementation again."""
        if self.inner_attention is not None:
            disable(self.model, self.inner_attention)
            self.inner_attention = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.sequence_parallel is not None:
            inputs = self.sequence_parallel.shard(inputs)
        return super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )

    # private: the Trainer's one count of the loss normaliser over all processes [test_private_apis]
    def _get_num_items_in_batch(self, batch_samples, device):
        """The count of the classes below (transformers' label tokens, SFT's `loss_reduction`) / the SP size: every
        rank of an SP group counted the same whole row, and the Trainer sums a count over processes."""
        count = super()._get_num_items_in_batch(batch_samples, device)
        if self.sequence_parallel is None or count is None:
            return count
        return count / self.sequence_parallel.size

    def get_total_train_batch_size(self, args) -> int:
        size = self.sequence_parallel.size if self.sequence_parallel is not None else 1
        return super().get_total_train_batch_size(args) // size


def _check_stage(stage) -> None:
    """Before any work: the launch shape, the rows' length (`stage.row_length()`) and, where the stage read the input
    model's config already (`stage.input_config`), its heads."""
    check_launch(stage.args, *stage.row_length(), config=getattr(stage, "input_config", None))


def _check_data(stage, data) -> None:
    """The rows as loaded (a data folder fixes their length): each splits into equal chunks."""
    check_launch(stage.args, *stage.row_length(data))


FEATURE = Feature(
    name="sequence_parallel",
    settings=SequenceParallelArguments,
    trainer_mixin=SequenceParallelMixin,
    check=_check_stage,
    check_data=_check_data,
    trainer_kwargs=lambda stage, data, model: {
        "sequence_parallel": sequence_parallel_for(stage.args, model.config, stage.row_length(data)[0])
    },
)
