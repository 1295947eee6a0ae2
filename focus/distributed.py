"""Sharding a Focus model across processes with PyTorch FSDP2, for frozen models larger than one device.

Every decoder layer (the model's `_no_split_modules` blocks) and then the root are wrapped with `fully_shard`:
each process holds 1/world of every weight, frozen and trainable alike, gathered layer by layer in the forward
pass. Only the centroids require grad, so the backward pass reduce-scatters just their gradients (averaged
over processes); optimizer state exists for the centroid shards only. FSDP2 shards per parameter, so frozen
weights and trainable centroids can live in the same layer.

Data parallelism: each process scores its own rows of every global batch. The running group-balance bias that
inference routing uses is averaged across processes in `focus.attention.route`, so every process (and a
single-process run on the same global batch) ends with the same buffers.
"""

from __future__ import annotations

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: modules whose class is named in transformers' `_no_split_modules`."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no _no_split_modules blocks to shard")
    return layers


def shard_model(model: nn.Module) -> nn.Module:
    """Shard `model` in place with FSDP2 (`torch.distributed` must be initialised); returns it."""
    from torch.distributed.fsdp import fully_shard

    if not torch.distributed.is_initialized():
        raise RuntimeError("shard_model needs torch.distributed.init_process_group first (e.g. under torchrun)")
    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    return model


def full_state(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a shard (a DTensor from FSDP), or the tensor itself; on every process."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def average_across_processes(tensor: torch.Tensor) -> torch.Tensor:
    """Mean of `tensor` over all processes (in place); unchanged when not running distributed."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        if world > 1:
            torch.distributed.all_reduce(tensor)
            tensor.div_(world)
    return tensor
