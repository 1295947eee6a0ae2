"""The resume state of a training run: one `checkpoint.pt`, written atomically, refused when it does not fit.

A checkpoint holds the trainable parameters, every persistent buffer, the optimizer and schedule, the RNGs, the
running log sums and a digest of the training tokens. `load_checkpoint` refuses (one `CheckpointError` line) a file
written for other parameters, data or settings; `restore_checkpoint` puts an accepted one back into the run.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from focus.config import to_dict
from focus.distributed import (
    barrier,
    copy_full_,
    gathered,
    gathered_optimizer_state,
    load_gathered_optimizer_state,
    rank_and_world,
)
from focus.files import atomic_write
from focus.train.config import TrainConfig

CHECKPOINT_NAME = "checkpoint.pt"
_CHECKPOINT_FORMAT = "focus.training/1"  # the module's name when the format was set; kept so old checkpoints resume
# Fields that do not change the trajectory of the trainable parameters, so a resume may change them.
_RESUMABLE_CHANGES = frozenset({"log_every", "checkpoint_every", "eval_every", "eval_batch_size"})


class CheckpointError(ValueError):
    """`checkpoint.pt` cannot be resumed into this model, data or config. The message says why."""


@dataclass
class LogWindow:
    """Running sums since the last logged step; checkpointed so a resume logs the same averages."""

    loss_sum: float = 0.0
    term_sums: dict[str, float] = field(default_factory=dict)  # per objective term (`focus.train.objective`)
    steps: int = 0
    # The steps each loss applied to (a batch of rows that learn from a teacher alone has no next-token loss), as
    # shares of the processes where it did.
    loss_steps: float = 0.0
    term_steps: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "LogWindow":
        """The window a checkpoint saved; one written before the per-loss counts applied every loss to every step."""
        steps = state["steps"]
        return cls(**{"loss_steps": steps, "term_steps": {name: steps for name in state["term_sums"]}, **state})

    def add(self, loss: float, terms: dict[str, float], applied: dict[str, float] | None = None) -> None:
        """Add a step's losses; `applied` ({"loss" or a term: share of the step it applied to}, default 1) says
        which were measured: a loss that applied to none of the step is not averaged in."""
        applied = applied or {}
        self.loss_sum += loss
        self.loss_steps += applied.get("loss", 1.0)
        for name, value in terms.items():
            self.term_sums[name] = self.term_sums.get(name, 0.0) + value
            self.term_steps[name] = self.term_steps.get(name, 0.0) + applied.get(name, 1.0)
        self.steps += 1

    def means(self) -> dict[str, float]:
        """{"loss": mean next-token loss, name: mean of each term} over the steps each applied to (none: left out)."""
        found = {"loss": self.loss_sum / self.loss_steps} if self.loss_steps else {}
        found.update({name: total / self.term_steps[name] for name, total in self.term_sums.items()
                      if self.term_steps.get(name)})
        return found


def data_fingerprint(data: torch.Tensor) -> str:
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


def save_checkpoint(
    path: Path,
    *,
    step: int,
    trainable: list[tuple[str, nn.Parameter]],
    buffers: list[tuple[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    window: LogWindow,
    config: TrainConfig,
    fingerprint: str,
    final_metrics: dict[str, Any] | None,
    focus: dict[str, Any] | None = None,
    seconds: float = 0.0,
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
            "window": {"loss_sum": window.loss_sum, "term_sums": dict(window.term_sums), "steps": window.steps,
                       "loss_steps": window.loss_steps, "term_steps": window.term_steps},
            "config": to_dict(config),
            "data_sha256": fingerprint,
            "focus_config": focus,
            "final_metrics": final_metrics,
            "seconds": seconds,  # training wall time up to this step, resumes included
        }
        atomic_write(path, lambda tmp: _save(state, tmp))
    barrier()


def _save(state: dict[str, Any], path: Path) -> None:
    # Through a Python file, not the path: then a full disk surfaces as the OSError behind torch's error (given a
    # path, torch's C++ writer says only "iostream error").
    with open(path, "wb") as f:
        torch.save(state, f)


def load_checkpoint(
    path: Path,
    trainable: list[tuple[str, nn.Parameter]],
    buffers: list[tuple[str, torch.Tensor]],
    config: TrainConfig,
    fingerprint: str,
    focus: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Read `path` and check it fits this run (`focus`: the model's FocusConfig, as `save_checkpoint` got it); every
    misfit is one CheckpointError line naming it."""
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
    saved_focus = state.get("focus_config") or {}
    for key in sorted(set(saved_focus) | set(focus or {})):
        if saved_focus.get(key) != (focus or {}).get(key):
            raise CheckpointError(
                f"{path} was written with FocusConfig.{key}={saved_focus.get(key)!r}, this run has "
                f"{(focus or {}).get(key)!r}; use a new output_dir to change it"
            )
    if state["data_sha256"] != fingerprint:
        raise CheckpointError(f"{path} was written for different training data; use a new output_dir")
    return state


def restore_checkpoint(
    state: dict[str, Any],
    trainable: list[tuple[str, nn.Parameter]],
    buffers: list[tuple[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[int, LogWindow]:
    """Put a `load_checkpoint` state back into the run (sharded tensors take their shard); returns (step, window)."""
    for name, tensor in trainable:
        copy_full_(tensor, state["params"][name])
    for name, tensor in buffers:
        copy_full_(tensor, state["buffers"][name])
    load_gathered_optimizer_state(optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"], rank_and_world()[1])
    return state["step"], LogWindow.from_state(state["window"])


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


def truncate_metrics(path: Path, last_step: int) -> None:
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
