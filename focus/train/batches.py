"""Which rows each training step scores: a pure function of (seed, epoch, step), so a resumed run needs no stored
order (`focus.train.loop.train_parameters`)."""

from __future__ import annotations

import hashlib

import torch

from focus.train.config import TrainConfig


class Batches:
    """Which rows each step trains on: step s is a slice of its epoch's permutation, recomputed, never stored."""

    def __init__(self, data: torch.Tensor, config: TrainConfig):
        self.rows_count, self.batch_size, self.seed = data.shape[0], config.batch_size, config.seed
        self.per_epoch = self.rows_count // self.batch_size
        self.epoch, self.permutation = -1, None

    def rows(self, step: int) -> torch.Tensor:
        """The (B,) row indices of 1-based `step`."""
        epoch, slot = divmod(step - 1, self.per_epoch)
        if epoch != self.epoch:
            self.epoch, self.permutation = epoch, _epoch_permutation(self.seed, epoch, self.rows_count)
        return self.permutation[slot * self.batch_size : (slot + 1) * self.batch_size]


def _epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """(n,) permutation for `epoch`, a pure function of (seed, epoch, n): resuming needs no stored order."""
    # Hash rather than e.g. seed * K + epoch, so (seed, epoch) pairs never collide. The prefix is the module's name
    # when the order was set: kept, so that runs (and their resumes) see the same batches as before.
    digest = hashlib.sha256(f"focus.training/{seed}/{epoch}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return torch.randperm(n, generator=generator)
