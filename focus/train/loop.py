"""Train the trainable parameters of a frozen causal LM (the Focus centroids) with a resumable loop.

The loop is generic: it optimizes exactly the parameters with `requires_grad=True` (after
`focus.apply_focus` those are the centroids) with AdamW on the objective its caller gives
(`focus.train.objective`: next-token cross-entropy unless told otherwise), and nothing else.

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

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from focus.config import to_dict
from focus.distributed import average_across_processes, barrier, full_state, is_sharded, rank_and_world
from focus.files import naming_a_full_disk
from focus.models import check_context_length, input_device
from focus.retrofit import focus_config, has_focus
from focus.train.batches import Batches
from focus.train.checkpoint import (
    CHECKPOINT_NAME,
    LogWindow,
    data_fingerprint,
    load_checkpoint,
    restore_checkpoint,
    save_checkpoint,
    truncate_metrics,
)
from focus.train.config import TrainConfig
from focus.train.objective import Objective

_log = logging.getLogger(__name__)
METRICS_NAME = "metrics.jsonl"


def next_token_loss(
    logits: torch.Tensor, input_ids: torch.Tensor, reduction: str = "mean", weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Next-token cross-entropy in float32.

    Args:
        logits: (B, L, V) model outputs for `input_ids`.
        input_ids: (B, L) tokens; position t predicts token t + 1, so B * (L - 1) tokens are scored.
        reduction: "mean" (per scored token, or weighted mean) or "sum".
        weights: optional (B, L) weight of predicting each token (column 0 is never predicted).
    Returns:
        A scalar tensor.
    """
    vocab = logits.shape[-1]
    # float32 so a bf16 model's loss (a log-sum-exp over the vocabulary) is not rounded to 3 digits.
    shifted = logits[:, :-1].float().reshape(-1, vocab)  # (B * (L - 1), V)
    targets = input_ids[:, 1:].reshape(-1).long()  # (B * (L - 1),); cross_entropy wants int64
    if weights is None:
        return F.cross_entropy(shifted, targets, reduction=reduction)
    weights = weights[:, 1:].reshape(-1).to(shifted.device, torch.float32)
    total = (F.cross_entropy(shifted, targets, reduction="none") * weights).sum()
    # A batch whose every weight is 0 (rows that learn from a teacher alone) adds nothing, rather than 0 / 0.
    return total / weights.sum().clamp_min(1e-12) if reduction == "mean" else total


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


def train_parameters(
    model: nn.Module,
    data: torch.Tensor,
    config: TrainConfig,
    output_dir: str | Path,
    eval_data: torch.Tensor | None = None,
    objective: Objective | None = None,
    progress: bool = True,
    on_log: Callable[[dict[str, Any]], None] | None = None,
    token_weights: torch.Tensor | None = None,
    term_weights: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Train the parameters of `model` that require grad (the Focus centroids, LoRA adapters, or every weight); resume from `output_dir` if it holds a checkpoint.

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
        objective: what each step minimises (default: the next-token loss alone). A Focus model's own is
            `focus.train.objective.focus_objective(model)`.
        progress: show a tqdm bar with the loss.
        on_log: optional callback given each record right after it is appended to `metrics.jsonl`
            (to mirror the record elsewhere, such as W&B).
        token_weights: optional (N, L) weight of predicting each token of `data` (`next_token_loss`): a batch's
            next-token loss is then its weighted mean (for example answers weighed up in retrieval rows).
        term_weights: optional {term name: (N, L) weights}: the objective term of that name is given its batch's
            weights (for example the teacher's KL on the rows of broad text alone, `focus.train.objective`).
    Returns:
        The record of the final step: `step`, `train/loss` (mean over the steps since the previous
        train line), `train/lr` (used by this step), `train/grad_norm` (before clipping of this step),
        `train/tokens` (step * batch_size * L), `time/step_seconds` (wall time per step since the
        previous train line), plus `train/<term>_loss` per objective term and `eval/loss`, `eval/ppl` where they
        apply, and `time/train_seconds` (the run's wall time, the part before each resume up to its checkpoint
        included). With `config.steps` 0, `step` 0 and the eval keys where there is eval data: nothing is optimized.
    Raises:
        ValueError: no trainable parameters, malformed data, or a batch_size that the processes cannot share
            equally; nothing is written.
        CheckpointError: `output_dir/checkpoint.pt` was written for other parameters, data, TrainConfig or
            FocusConfig.
    """
    run = _set_up(model, data, config, eval_data, token_weights, term_weights)
    objective = objective or Objective()
    output_dir = Path(output_dir)
    checkpoint = output_dir / CHECKPOINT_NAME
    # Read (and check) any checkpoint before touching output_dir, so a refused resume changes nothing.
    state = (load_checkpoint(checkpoint, run.trainable, run.buffers, config, run.fingerprint, focus=run.focus)
             if checkpoint.exists() else None)
    barrier()  # every process has read the checkpoint before process 0 changes output_dir
    model.eval()
    # Training time across resumes: a killed run's seconds up to its checkpoint count, the steps it redoes once.
    seconds_before = 0.0 if state is None else state.get("seconds", 0.0)
    if state is None:
        start_step, window = 0, LogWindow()
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        np.random.seed(config.seed)
    else:
        start_step, window = restore_checkpoint(state, run.trainable, run.buffers, run.optimizer, run.scheduler)
        _log.info("resuming from %s at step %d of %d", checkpoint, start_step, config.steps)
        if start_step == config.steps:
            return dict(state["final_metrics"])

    rank, world = rank_and_world()
    if rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        for name in (CHECKPOINT_NAME, METRICS_NAME):  # temp files of a run killed while writing them
            (output_dir / f"{name}.tmp").unlink(missing_ok=True)
        truncate_metrics(output_dir / METRICS_NAME, start_step)
    device = input_device(model)
    batches = Batches(data, config)
    record: dict[str, Any] = {}
    bar = tqdm(total=config.steps, initial=start_step, desc="train", disable=not (progress and rank == 0), dynamic_ncols=True)
    metrics_file = open(output_dir / METRICS_NAME, "a", encoding="utf-8") if rank == 0 else None

    started = time.perf_counter()

    def seconds() -> float:
        return round(seconds_before + time.perf_counter() - started, 1)

    def save(step: int, final_metrics: dict[str, Any] | None) -> None:
        save_checkpoint(checkpoint, step=step, trainable=run.trainable, buffers=run.buffers, optimizer=run.optimizer,
                        scheduler=run.scheduler, window=window, config=config, fingerprint=run.fingerprint,
                        focus=run.focus, final_metrics=final_metrics, seconds=seconds())

    try:
        tic = time.perf_counter()
        for step in range(start_step + 1, config.steps + 1):
            batch = batches.rows(step)[rank::world]  # (B / world, L): this process's share of the batch
            lr = run.optimizer.param_groups[0]["lr"]
            weights = None if token_weights is None else token_weights[batch]
            batch_terms = {name: term[batch] for name, term in (term_weights or {}).items()}
            ce, terms, applied, grad_norm = _optimizer_step(model, data[batch].to(device), run, config, objective,
                                                            weights, batch_terms)
            window.add(ce, terms, applied)
            bar.update(1)

            record = {"step": step}
            if step % config.log_every == 0 or step == config.steps:
                record.update(_train_record(window, step, lr, grad_norm, config, data.shape[1], tic))
                if "train/loss" in record:
                    bar.set_postfix(loss=f"{record['train/loss']:.4f}")
                window = LogWindow()
            is_eval_step = config.eval_every > 0 and step % config.eval_every == 0
            if eval_data is not None and (is_eval_step or step == config.steps):
                record.update(_eval_record(model, eval_data, config))
            if step == config.steps:
                record["time/train_seconds"] = seconds()
            _log_line(metrics_file, record, on_log)
            # The line of a step is written before its checkpoint: lines past a checkpoint's step are
            # exactly the ones a resume from it must drop.
            is_ckpt_step = config.checkpoint_every > 0 and step % config.checkpoint_every == 0
            if is_ckpt_step or step == config.steps:
                save(step, record if step == config.steps else None)
            if "train/loss" in record:
                tic = time.perf_counter()
        if config.steps == 0:  # no step: the parameters as they came (k-means centroids), scored once
            record = {"step": 0, **(_eval_record(model, eval_data, config) if eval_data is not None else {})}
            _log_line(metrics_file, record, on_log)
            save(0, record)  # finished: run again, it returns this record and logs nothing twice
    finally:
        if metrics_file is not None:
            with naming_a_full_disk(metrics_file.name):  # a line the full disk refused may still be buffered
                metrics_file.close()
        bar.close()
    return record


def _eval_record(model: nn.Module, eval_data: torch.Tensor, config: TrainConfig) -> dict[str, float]:
    eval_loss = evaluate_loss(model, eval_data, config.eval_batch_size)
    return {"eval/loss": eval_loss, "eval/ppl": math.exp(min(eval_loss, 700.0))}  # exp overflows float64 past ~709


def _log_line(metrics_file, record: dict[str, Any], on_log: Callable[[dict[str, Any]], None] | None) -> None:
    """Append a step's record to metrics.jsonl (process 0: `metrics_file`) and pass it to `on_log`, where it holds more
    than the step."""
    if len(record) > 1 and metrics_file is not None:
        with naming_a_full_disk(metrics_file.name):
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()
        if on_log is not None:
            on_log(record)


@dataclass
class _Run:
    """What a run optimizes and how, set up (and every input checked) before anything is read or written."""

    trainable: list[tuple[str, nn.Parameter]]
    buffers: list[tuple[str, torch.Tensor]]  # the persistent ones: what the model's state_dict holds
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    fingerprint: str
    focus: dict[str, Any] | None  # the model's FocusConfig, but its mode (which the objective may switch)

    @property
    def params(self) -> list[nn.Parameter]:
        return [p for _, p in self.trainable]


def _set_up(
    model: nn.Module,
    data: torch.Tensor,
    config: TrainConfig,
    eval_data: torch.Tensor | None,
    token_weights: torch.Tensor | None = None,
    term_weights: dict[str, torch.Tensor] | None = None,
) -> _Run:
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
    fingerprint = data_fingerprint(data)
    weighed = {"token_weights": token_weights} if token_weights is not None else {}
    weighed.update({f"term_weights[{name!r}]": weights for name, weights in sorted((term_weights or {}).items())})
    for name, weights in weighed.items():
        if weights.shape != data.shape or not weights.is_floating_point() or not bool((weights >= 0).all()):
            raise ValueError(f"{name} must be floats >= 0 of the data's shape {tuple(data.shape)}, got "
                             f"{weights.dtype} of shape {tuple(weights.shape)}")
    if weighed:  # a resume must see the same weights as the data they weigh
        fingerprint = data_fingerprint(torch.cat([data.double(), *(w.double() for w in weighed.values())]))
    if eval_data is not None:
        _check_tokens("eval_data", eval_data, model, min_rows=1)
    world = rank_and_world()[1]
    if config.batch_size % world:
        raise ValueError(
            f"TrainConfig.batch_size={config.batch_size} is not a multiple of the {world} processes: each scores an "
            "equal share of every batch, so that their averaged gradient is the whole batch's"
        )
    optimizer = torch.optim.AdamW([p for _, p in trainable], lr=config.lr, weight_decay=config.weight_decay)
    # A plain lambda: LambdaLR then keeps only its step count in state_dict, which is all we need.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: config.lr_factor(done))
    focus = None
    if has_focus(model):  # the mode is not a setting of the run: the objective switches it
        focus = {key: value for key, value in to_dict(focus_config(model)).items() if key != "mode"}
    return _Run(trainable, buffers, optimizer, scheduler, fingerprint, focus)


def _train_record(
    window: LogWindow, step: int, lr: float, grad_norm: torch.Tensor, config: TrainConfig, seq_len: int,
    tic: float,
) -> dict[str, float]:
    """The train line of a logged step: means over the steps since the previous one (each loss over the steps it
    applied to: a batch whose rows learn from the teacher alone has no next-token loss)."""
    means = window.means()
    record = {}
    if "loss" in means:
        if not math.isfinite(means["loss"]):
            raise FloatingPointError(f"train/loss is {means['loss']} at step {step}; lower TrainConfig.lr")
        record["train/loss"] = means.pop("loss")
    for name, mean in means.items():
        record[f"train/{name}_loss"] = mean
    record["train/lr"] = lr
    record["train/grad_norm"] = float(grad_norm)
    record["train/tokens"] = step * config.batch_size * seq_len
    record["time/step_seconds"] = (time.perf_counter() - tic) / window.steps
    return record


def _optimizer_step(
    model: nn.Module,
    batch: torch.Tensor,
    run: _Run,
    config: TrainConfig,
    objective: Objective,
    weights: torch.Tensor | None = None,
    term_weights: dict[str, torch.Tensor] | None = None,
) -> tuple[float, dict[str, float], dict[str, float], torch.Tensor]:
    """One AdamW step (and schedule step) on `batch` (B, L) minimising `objective`; returns (cross-entropy, each
    term's unweighted value, {"loss" or a term: 1 if it applied to the batch (any of its weights > 0), else 0},
    pre-clip grad norm).

    Distributed, `batch` is this process's equal share of the global batch and the losses returned are means over
    the processes; so is the gradient (FSDP averages sharded ones as it reduce-scatters them, plain ones are
    averaged here), which makes it the global batch's, and its norm (for clipping) the global norm.
    """
    logits = model(input_ids=batch, use_cache=False).logits  # (B, L, V)
    ce = next_token_loss(logits, batch, weights=weights)
    loss = objective.next_token_weight * ce if objective.next_token_weight else 0.0
    terms = {}
    applied = {"loss": _applies(weights)}
    for name, (weight, term) in objective.terms.items():
        given = (term_weights or {}).get(name)
        value = term(model, batch, logits) if given is None else term(model, batch, logits, given)
        applied[name] = _applies(given)
        terms[name] = value.detach().float().item()
        loss = loss + weight * value
    if not loss.requires_grad:
        raise RuntimeError("the objective does not depend on the trained parameters (a Focus model's own objective is "
                           "focus.train.objective.focus_objective(model))")
    loss.backward()
    params = run.params
    for p in params:
        if p.grad is not None and not is_sharded(p.grad):
            average_across_processes(p.grad)  # nothing when not distributed
    if config.grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    ce_value = ce.detach().item()
    if rank_and_world()[1] > 1:
        values = torch.tensor([ce_value, *terms.values(), *applied.values()], dtype=torch.float64, device=ce.device)
        ce_value, *averaged = average_across_processes(values).tolist()
        terms, applied = dict(zip(terms, averaged)), dict(zip(applied, averaged[len(terms) :]))
    return ce_value, terms, applied, full_state(grad_norm)


def _applies(weights: torch.Tensor | None) -> float:
    """1.0 when a loss weighed by `weights` (B, L) scores any token of its batch (None: every token), else 0.0."""
    return 1.0 if weights is None or bool(weights[:, 1:].gt(0).any()) else 0.0


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
