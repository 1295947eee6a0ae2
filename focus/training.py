"""Train the trainable parameters of a frozen causal LM (the Focus centroids) with a resumable loop.

The loop is generic: it optimizes exactly the parameters with `requires_grad=True` (after
`focus.apply_focus` those are the centroids) with AdamW on next-token cross-entropy, and nothing else.

Guarantees, in order of how much they cost to get right:
- Resume is exact. A run killed at any point and restarted with the same arguments ends with
  bit-identical trainable parameters and buffers to an uninterrupted run (same device and thread count). The batch
  order is never stored: batch b is a slice of epoch e's permutation, drawn from a generator seeded
  from (seed, e), so it is recomputed after a resume.
- `output_dir` holds two files: `metrics.jsonl` (the record, one JSON object per logged step, no
  duplicates across resumes) and `checkpoint.pt` (always complete: written to a temp file, then
  renamed). A finished run re-run is a no-op that reloads the final parameters and returns its metrics.
- The frozen network runs in eval mode throughout, so dropout never perturbs it.
- Checkpoints hold the trainable parameters and every persistent buffer: modules may keep training
  state in buffers (Focus keeps the running group bias its inference routing uses there), and a resume
  that lost it would end with the same centroids but a different model.
- Data parallel when torch.distributed is initialised with several processes (the model sharded with
  `focus.distributed.shard_model`, or replicated): each process scores an equal share of every global batch,
  so the averaged gradient, the logged losses and the evaluation equal a single-process run's up to float
  rounding. Process 0 alone writes `output_dir`, whole (gathered) tensors in the single-process format, so a
  checkpoint resumes on any number of processes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from focus.config import ConfigError, check_types, from_dict, to_dict
from focus.distributed import (
    average_across_processes,
    barrier,
    copy_full_,
    full_state,
    gathered,
    gathered_optimizer_state,
    is_sharded,
    load_gathered_optimizer_state,
    rank_and_world,
)
from focus.files import atomic_write
from focus.models import check_context_length, input_device
from focus.recall import collect_recall_loss

_log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
METRICS_NAME = "metrics.jsonl"
_CHECKPOINT_FORMAT = "focus.training/1"
# Fields that do not change the trajectory of the trainable parameters, so a resume may change them.
_RESUMABLE_CHANGES = frozenset({"log_every", "checkpoint_every", "eval_every", "eval_batch_size"})


class CheckpointError(ValueError):
    """`checkpoint.pt` cannot be resumed into this model, data or config. The message says why."""


@dataclass(frozen=True)
class TrainConfig:
    """How the trainable parameters are optimized, logged, evaluated and checkpointed."""

    steps: int = field(default=1000, metadata={"help": "Total optimizer steps of the run."})
    batch_size: int = field(default=8, metadata={"help": "Sequences per optimizer step."})
    lr: float = field(
        default=1e-3, metadata={"help": "Peak AdamW learning rate (centroids tolerate a high one)."}
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW decoupled weight decay."})
    warmup_steps: int = field(
        default=0, metadata={"help": "Linear warmup from lr/warmup_steps to lr over this many steps."}
    )
    schedule: Literal["constant", "cosine"] = field(
        default="cosine", metadata={"help": "LR after warmup: constant, or cosine decay to lr * min_lr_ratio."}
    )
    min_lr_ratio: float = field(
        default=0.1, metadata={"help": "Cosine schedule: final LR as a fraction of lr."}
    )
    grad_clip: float = field(
        default=1.0, metadata={"help": "Clip the global gradient norm to this value (0 disables)."}
    )
    seed: int = field(
        default=0, metadata={"help": "Seeds the batch order and the global RNGs at the start of a run."}
    )
    log_every: int = field(
        default=10, metadata={"help": "Append a train line to metrics.jsonl every this many steps (and at the end)."}
    )
    checkpoint_every: int = field(
        default=100, metadata={"help": "Write checkpoint.pt every this many steps (0 = only at the end)."}
    )
    eval_every: int = field(
        default=0,
        metadata={"help": "Evaluate eval_data every this many steps (0 = only at the end; never without eval_data)."},
    )
    eval_batch_size: int = field(default=8, metadata={"help": "Sequences per forward pass during evaluation."})
    balance_weight: float = field(
        default=0.0,
        metadata={"help": "Weight of the optional aux_loss(model) term added to the loss (needs aux_loss)."},
    )

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("steps", "batch_size", "log_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "checkpoint_every", "eval_every", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        # `not x >= 0` also rejects NaN, which every plain comparison lets through.
        for name in ("weight_decay", "grad_clip", "balance_weight"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"TrainConfig.lr must be a finite number > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"TrainConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps > self.steps:
            raise ConfigError(
                f"TrainConfig.warmup_steps ({self.warmup_steps}) must be <= steps ({self.steps})"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        return from_dict(cls, values)

    def lr_factor(self, step: int) -> float:
        """LR multiplier for the optimizer step that follows `step` completed steps (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy in float32.

    Args:
        logits: (B, L, V) model outputs for `input_ids`.
        input_ids: (B, L) tokens; position t predicts token t + 1, so B * (L - 1) tokens are scored.
        reduction: "mean" (per scored token) or "sum".
    Returns:
        A scalar tensor.
    """
    vocab = logits.shape[-1]
    # float32 so a bf16 model's loss (a log-sum-exp over the vocabulary) is not rounded to 3 digits.
    shifted = logits[:, :-1].float().reshape(-1, vocab)  # (B * (L - 1), V)
    targets = input_ids[:, 1:].reshape(-1).long()  # (B * (L - 1),); cross_entropy wants int64
    return F.cross_entropy(shifted, targets, reduction=reduction)


@torch.no_grad()
def evaluate_loss(model: nn.Module, data: torch.Tensor, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats per scored token) of `model` over `data`.

    Run distributed (every process calls it with the same `data`), each process scores rows rank, rank + world, ...
    and the sums are added up across processes.

    Args:
        model: a Hugging Face causal LM; put in eval mode and left there.
        data: (N, L) integer token ids, L >= 2, evaluated `batch_size` sequences at a time.
    """
    if batch_size < 1:
        raise ValueError(f"evaluate_loss batch_size must be >= 1, got {batch_size}")
    _check_tokens("eval_data", data, model, min_rows=1)
    model.eval()
    device = input_device(model)
    rank, world = rank_and_world()
    rows = data[rank::world]
    total = 0.0  # a Python float: float64 sums on every device (MPS has no float64 tensors)
    # The same number of forward passes on every process: a sharded model gathers each layer with all of them.
    for start in range(0, -(-data.shape[0] // world), batch_size):
        chunk = rows[start : start + batch_size].to(device)  # (b, L)
        scored = chunk.shape[0] > 0
        if not scored:  # this process ran out of rows (N % world of them have one fewer): a pass to keep in step
            chunk = data[:1].to(device)
        logits = model(input_ids=chunk, use_cache=False).logits  # (b, L, V)
        if scored:
            total += next_token_loss(logits, chunk, reduction="sum").item()
    if world > 1:
        summed = torch.tensor(total, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(summed)
        total = summed.item()
    return total / (data.shape[0] * (data.shape[1] - 1))


def train_centroids(
    model: nn.Module,
    data: torch.Tensor,
    config: TrainConfig,
    output_dir: str | Path,
    eval_data: torch.Tensor | None = None,
    aux_loss: Callable[[nn.Module], torch.Tensor] | None = None,
    progress: bool = True,
    on_log: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Train the parameters of `model` that require grad; resume from `output_dir` if it holds a checkpoint.

    Each step scores one batch of `config.batch_size` sequences. Epoch e visits a permutation of the N
    sequences drawn from a generator seeded from (seed, e), in N // batch_size full batches; the
    N % batch_size sequences left over differ from epoch to epoch.

    Args:
        model: a Hugging Face causal LM whose only parameters with requires_grad=True are the ones to
            train (for example after `focus.apply_focus`). It is put in eval mode and left there, and
            on return holds the trained values.
        data: (N, L) integer token ids, N >= batch_size, L >= 2, on any device (batches are moved to
            the model's device).
        config: the TrainConfig of the run. Resuming demands the same values, except for the fields
            that only control logging, checkpoints and evaluation.
        output_dir: created if missing; receives `metrics.jsonl` and `checkpoint.pt` (from process 0 only when
            running distributed; every process must call this function with the same arguments).
        eval_data: optional (M, L') token ids, scored every `eval_every` steps and after the last step
            (keys `eval/loss`, `eval/ppl`).
        aux_loss: optional `aux_loss(model) -> scalar tensor`, called right after each training forward
            pass (so it can read what the forward left on the modules, such as routing assignments).
            It is logged as `train/aux_loss` and `balance_weight * aux_loss` is added to the loss.
        progress: show a tqdm bar with the loss.
        on_log: optional callback given each record right after it is appended to `metrics.jsonl`
            (to mirror the record elsewhere, such as W&B).
    Returns:
        The record of the final step: `step`, `train/loss` (mean over the steps since the previous
        train line), `train/lr` (used by this step), `train/grad_norm` (before clipping of this step),
        `train/tokens` (step * batch_size * L), `time/step_seconds` (wall time per step since the
        previous train line), plus `train/aux_loss` and `eval/loss`, `eval/ppl` where they apply.
    Raises:
        ValueError: no trainable parameters, malformed data, or a batch_size that the processes cannot share
            equally; nothing is written.
        CheckpointError: `output_dir/checkpoint.pt` was written for other parameters, data or config.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    persistent = model.state_dict(keep_vars=True).keys()  # no copies: keep_vars returns the tensors
    buffers = [(name, b) for name, b in model.named_buffers() if name in persistent]
    if not trainable:
        raise ValueError(
            "model has no parameters with requires_grad=True to train; call focus.apply_focus(model, ...) first"
        )
    _check_tokens("data", data, model, min_rows=config.batch_size)
    if eval_data is not None:
        _check_tokens("eval_data", eval_data, model, min_rows=1)
    if config.balance_weight > 0 and aux_loss is None:
        raise ValueError(f"TrainConfig.balance_weight={config.balance_weight} needs an aux_loss callable")
    rank, world = rank_and_world()
    if config.batch_size % world:
        raise ValueError(
            f"TrainConfig.batch_size={config.batch_size} is not a multiple of the {world} processes: each scores an "
            "equal share of every batch, so that their averaged gradient is the whole batch's"
        )
    main = rank == 0

    output_dir = Path(output_dir)
    ckpt_path = output_dir / CHECKPOINT_NAME
    fingerprint = _fingerprint(data)
    params = [p for _, p in trainable]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    # A plain lambda: LambdaLR then keeps only its step count in state_dict, which is all we need.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: config.lr_factor(done))

    # Read (and check) any checkpoint before touching output_dir, so a refused resume changes nothing.
    state = _load_checkpoint(ckpt_path, trainable, buffers, config, fingerprint) if ckpt_path.exists() else None
    barrier()  # every process has read the checkpoint before process 0 changes output_dir
    model.eval()
    if state is None:
        start_step, window = 0, _Window()
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        np.random.seed(config.seed)
    else:
        for name, tensor in trainable:
            copy_full_(tensor, state["params"][name])
        for name, tensor in buffers:
            copy_full_(tensor, state["buffers"][name])
        load_gathered_optimizer_state(optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"], world)
        start_step, window = state["step"], _Window(**state["window"])
        _log.info("resuming from %s at step %d of %d", ckpt_path, start_step, config.steps)
        if start_step == config.steps:
            return dict(state["final_metrics"])

    if main:
        output_dir.mkdir(parents=True, exist_ok=True)
        for name in (CHECKPOINT_NAME, METRICS_NAME):  # temp files of a run killed while writing them
            (output_dir / f"{name}.tmp").unlink(missing_ok=True)
        _truncate_metrics(output_dir / METRICS_NAME, start_step)
    device = input_device(model)
    n_rows, seq_len = data.shape
    batches_per_epoch = n_rows // config.batch_size
    epoch, perm = -1, None
    record: dict[str, Any] = {}
    bar = tqdm(total=config.steps, initial=start_step, desc="train", disable=not (progress and main), dynamic_ncols=True)
    metrics_file = open(output_dir / METRICS_NAME, "a", encoding="utf-8") if main else None
    try:
        tic = time.perf_counter()
        for step in range(start_step + 1, config.steps + 1):
            batch_epoch, slot = divmod(step - 1, batches_per_epoch)
            if batch_epoch != epoch:
                epoch, perm = batch_epoch, _epoch_permutation(config.seed, batch_epoch, n_rows)
            rows = perm[slot * config.batch_size : (slot + 1) * config.batch_size]
            batch = data[rows[rank::world]].to(device)  # (B / world, L): this process's share of the batch

            lr = optimizer.param_groups[0]["lr"]
            ce, aux, recall, grad_norm = _optimizer_step(model, batch, params, optimizer, config, aux_loss)
            scheduler.step()
            window.loss_sum += ce
            window.aux_sum += aux
            window.recall_sum += recall
            window.steps += 1
            bar.update(1)

            record = {"step": step}
            if step % config.log_every == 0 or step == config.steps:
                train_loss = window.loss_sum / window.steps
                if not math.isfinite(train_loss):
                    raise FloatingPointError(f"train/loss is {train_loss} at step {step}; lower TrainConfig.lr")
                record["train/loss"] = train_loss
                if aux_loss is not None:
                    record["train/aux_loss"] = window.aux_sum / window.steps
                if math.isfinite(window.recall_sum):
                    record["train/recall_loss"] = window.recall_sum / window.steps
                record["train/lr"] = lr
                record["train/grad_norm"] = float(grad_norm)
                record["train/tokens"] = step * config.batch_size * seq_len
                record["time/step_seconds"] = (time.perf_counter() - tic) / window.steps
                bar.set_postfix(loss=f"{train_loss:.4f}")
                window = _Window()
            is_eval_step = config.eval_every > 0 and step % config.eval_every == 0
            if eval_data is not None and (is_eval_step or step == config.steps):
                eval_loss = evaluate_loss(model, eval_data, config.eval_batch_size)
                record["eval/loss"] = eval_loss
                record["eval/ppl"] = math.exp(min(eval_loss, 700.0))  # exp overflows float64 past ~709
            if len(record) > 1 and main:
                metrics_file.write(json.dumps(record) + "\n")
                metrics_file.flush()
                if on_log is not None:
                    on_log(record)
            # The line of a step is written before its checkpoint: lines past a checkpoint's step are
            # exactly the ones a resume from it must drop.
            is_ckpt_step = config.checkpoint_every > 0 and step % config.checkpoint_every == 0
            if is_ckpt_step or step == config.steps:
                _save_checkpoint(
                    ckpt_path,
                    step=step,
                    trainable=trainable,
                    buffers=buffers,
                    optimizer=optimizer,
                    scheduler=scheduler,
                    window=window,
                    config=config,
                    fingerprint=fingerprint,
                    final_metrics=record if step == config.steps else None,
                )
            if "train/loss" in record:
                tic = time.perf_counter()
    finally:
        if metrics_file is not None:
            metrics_file.close()
        bar.close()
    return record


def _optimizer_step(
    model: nn.Module,
    batch: torch.Tensor,
    params: list[nn.Parameter],
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    aux_loss: Callable[[nn.Module], torch.Tensor] | None,
) -> tuple[float, float, float, torch.Tensor]:
    """One AdamW step on `batch` (B, L); returns (cross-entropy, aux loss or 0, recall loss or NaN, pre-clip grad
    norm). Under Focus's attention-recall objective (`focus.recall`) the recall loss replaces the cross-entropy,
    which is then the unmodified model's.

    Distributed, `batch` is this process's equal share of the global batch and the losses returned are means over
    the processes; so is the gradient (FSDP averages sharded ones as it reduce-scatters them, plain ones are
    averaged here), which makes it the global batch's, and its norm (for clipping) the global norm.
    """
    logits = model(input_ids=batch, use_cache=False).logits  # (B, L, V)
    ce = next_token_loss(logits, batch)
    recall = collect_recall_loss(model)  # Focus's attention-recall objective: it replaces the next-token loss
    loss, aux = ce if recall is None else recall, 0.0
    if aux_loss is not None:
        aux_value = aux_loss(model)
        aux = aux_value.detach().float().item()
        if config.balance_weight > 0:
            loss = loss + config.balance_weight * aux_value
    loss.backward()
    for p in params:
        if p.grad is not None and not is_sharded(p.grad):
            average_across_processes(p.grad)  # nothing when not distributed
    if config.grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    ce_value = ce.detach().item()
    recall_value = math.nan if recall is None else recall.detach().item()
    if rank_and_world()[1] > 1:
        values = torch.tensor([ce_value, aux, recall_value], dtype=torch.float64, device=ce.device)
        ce_value, aux, recall_value = average_across_processes(values).tolist()
    return ce_value, aux, recall_value, full_state(grad_norm)


@dataclass
class _Window:
    """Running sums since the last logged step; checkpointed so a resume logs the same averages."""

    loss_sum: float = 0.0
    aux_sum: float = 0.0
    recall_sum: float = 0.0  # NaN when the run trains on the next-token loss
    steps: int = 0


def _epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """(n,) permutation for `epoch`, a pure function of (seed, epoch, n): resuming needs no stored order."""
    # Hash rather than e.g. seed * K + epoch, so (seed, epoch) pairs never collide.
    digest = hashlib.sha256(f"focus.training/{seed}/{epoch}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return torch.randperm(n, generator=generator)


def _check_tokens(name: str, data: Any, model: nn.Module, min_rows: int) -> None:
    integer = isinstance(data, torch.Tensor) and not (data.is_floating_point() or data.is_complex())
    if not integer or data.ndim != 2 or data.dtype == torch.bool:
        desc = f"{type(data).__name__} {getattr(data, 'dtype', '')} of shape {tuple(getattr(data, 'shape', ()))}"
        raise ValueError(f"{name} must be an integer tensor of shape (N, L), got {desc}")
    rows, length = data.shape
    if length < 2:
        raise ValueError(f"{name} needs sequences of length L >= 2 to predict a next token, got L={length}")
    if rows < min_rows:
        raise ValueError(f"{name} has {rows} sequences, fewer than one batch of {min_rows}")
    check_context_length(model, length)  # beyond it GPT-2 fails deep in an index, rotary models train out of range
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    vocab = getattr(embeddings, "num_embeddings", None)
    if vocab is not None and (int(data.min()) < 0 or int(data.max()) >= vocab):
        raise ValueError(
            f"{name} holds token ids in [{int(data.min())}, {int(data.max())}], outside the model's vocabulary [0, {vocab})"
        )


def _fingerprint(data: torch.Tensor) -> str:
    """Digest of the training tokens, so a resume onto different data is refused, not silently mixed."""
    array = data.detach().cpu().contiguous().numpy()
    return hashlib.sha256(f"{array.dtype}{array.shape}".encode() + memoryview(array).cast("B")).hexdigest()


def _rng_state(world: int) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    # Only GPUs this process uses: querying one would create a context on it (the others' GPUs, when distributed).
    if not torch.cuda.is_initialized():
        cuda = []
    else:
        cuda = [torch.cuda.get_rng_state()] if world > 1 else torch.cuda.get_rng_state_all()
    return {
        "torch": torch.get_rng_state(),
        "cuda": cuda,
        "python": random.getstate(),
        # As plain Python values, so the checkpoint loads with weights_only=True.
        "numpy": (name, keys.tolist(), int(pos), int(has_gauss), float(cached)),
    }


def _set_rng_state(state: dict[str, Any], world: int) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        if world > 1:
            torch.cuda.set_rng_state(state["cuda"][0])
        elif len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def _save_checkpoint(
    path: Path,
    *,
    step: int,
    trainable: list[tuple[str, nn.Parameter]],
    buffers: list[tuple[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    window: _Window,
    config: TrainConfig,
    fingerprint: str,
    final_metrics: dict[str, Any] | None,
) -> None:
    """Write the full resume state to `path` atomically: a reader sees the old file or the new one.

    Every process calls this (sharded tensors are gathered whole, a collective); process 0 writes, the others wait.
    """
    params = {name: gathered(p) for name, p in trainable}
    optimizer_state = gathered_optimizer_state(optimizer)
    rank, world = rank_and_world()
    if rank == 0:
        state = {
            "format": _CHECKPOINT_FORMAT,
            "step": step,
            "params": params,
            "buffers": {name: b.detach().cpu().clone() for name, b in buffers},
            "optimizer": optimizer_state,
            "scheduler": scheduler.state_dict(),
            "rng": _rng_state(world),
            "window": {"loss_sum": window.loss_sum, "aux_sum": window.aux_sum, "steps": window.steps},
            "config": to_dict(config),
            "data_sha256": fingerprint,
            "final_metrics": final_metrics,
        }
        atomic_write(path, lambda tmp: torch.save(state, tmp))
    barrier()


def _load_checkpoint(
    path: Path,
    trainable: list[tuple[str, nn.Parameter]],
    buffers: list[tuple[str, torch.Tensor]],
    config: TrainConfig,
    fingerprint: str,
) -> dict[str, Any]:
    """Read `path` and check it fits this run; every misfit is one CheckpointError line naming it."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unreadable file is the same problem to the user
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot read {path}: {first_line}") from exc
    if not isinstance(state, dict) or state.get("format") != _CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a {_CHECKPOINT_FORMAT} checkpoint")
    _check_tensors(path, "trainable parameters", state["params"], trainable)
    _check_tensors(path, "buffers", state["buffers"], buffers)

    ours_config = to_dict(config)
    for key, value in state["config"].items():
        if key not in _RESUMABLE_CHANGES and ours_config.get(key) != value:
            raise CheckpointError(
                f"{path} was written with TrainConfig.{key}={value!r}, this run has {ours_config.get(key)!r}; "
                "use a new output_dir to change it"
            )
    if state["data_sha256"] != fingerprint:
        raise CheckpointError(f"{path} was written for different training data; use a new output_dir")
    return state


def _check_tensors(path: Path, kind: str, saved: dict[str, torch.Tensor], ours: list[tuple[str, torch.Tensor]]) -> None:
    missing = sorted(set(dict(ours)) - set(saved))
    unexpected = sorted(set(saved) - set(dict(ours)))
    if missing or unexpected:
        parts = [f"{len(missing)} missing (first {missing[0]!r})"] if missing else []
        parts += [f"{len(unexpected)} unexpected (first {unexpected[0]!r})"] if unexpected else []
        raise CheckpointError(
            f"{path} does not match the model's {kind}: {', '.join(parts)}; "
            "use a new output_dir for a different model or Focus config"
        )
    for name, tensor in ours:
        if saved[name].shape != tensor.shape or saved[name].dtype != tensor.dtype:
            raise CheckpointError(
                f"{path}: {name!r} is {saved[name].dtype} {tuple(saved[name].shape)} in the "
                f"checkpoint but {tensor.dtype} {tuple(tensor.shape)} in the model"
            )


def _truncate_metrics(path: Path, last_step: int) -> None:
    """Keep only the lines of steps <= `last_step`: later ones are replayed by the resumed run."""
    if not path.exists():
        return
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # the line a kill cut short
                continue
            if isinstance(record, dict) and record.get("step", math.inf) <= last_step:
                kept.append(line if line.endswith("\n") else line + "\n")
    atomic_write(path, lambda tmp: tmp.write_text("".join(kept), encoding="utf-8"))
