"""Sharding a Focus model across processes with PyTorch FSDP2, for frozen models larger than one device.

Every decoder layer (the model's `_no_split_modules` blocks) and then the root are wrapped with `fully_shard`:
each process holds 1/world of every weight, frozen and trainable alike, gathered layer by layer in the forward
pass. Only the centroids require grad, so the backward pass reduce-scatters just their gradients (averaged
over processes); optimizer state exists for the centroid shards only. FSDP2 shards per parameter, so frozen
weights and trainable centroids can live in the same layer.

Data parallelism: each process scores its own rows of every global batch. The running group-balance bias that
inference routing uses is averaged across processes in `focus.attention.routers.routing.route_keys`, so every process
(and a single-process run on the same global batch) ends with the same buffers. `focus.train.train_parameters` splits
every batch over the processes and writes whole (gathered) tensors in the single-process checkpoint format.

Launching: under `torchrun`, `torchrun_process_group` joins the processes torchrun started; `run_on_processes`
runs a function under `torchrun --standalone --nproc_per_node N` from Python, which is how the pipeline's training
jobs use several GPUs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

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


@torch.no_grad()
def frozen_checksum(model: nn.Module) -> list[float]:
    """[sum, sum of squares] in float64 of every frozen parameter of `model`: a fingerprint of the weights a
    centroid-only training must leave as they were (a change to any weight moves it, unless changes cancel exactly
    in both sums). A sharded model is gathered one parameter at a time (every process calls this; all get the same)."""
    totals = [0.0, 0.0]
    for parameter in model.parameters():
        if not parameter.requires_grad:
            values = full_state(parameter.detach()).double()
            totals[0] += values.sum().item()
            totals[1] += values.square().sum().item()
    return totals


def rank_and_world() -> tuple[int, int]:
    """(this process's rank, number of processes); (0, 1) when torch.distributed is not initialised."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def is_main_process() -> bool:
    """Whether this process writes the shared artifacts (rank 0, or the only process)."""
    return rank_and_world()[0] == 0


def barrier() -> None:
    """Wait until every process gets here; nothing when not running distributed."""
    if rank_and_world()[1] > 1:
        torch.distributed.barrier()


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a shard of a bigger one (a DTensor, as FSDP makes of parameters and their states)."""
    return hasattr(tensor, "full_tensor")


def copy_full_(tensor: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the whole tensor `full` into `tensor`, a plain tensor or a shard (every process then calls this with the
    same `full`; process 0's copy is the one kept)."""
    with torch.no_grad():
        if is_sharded(tensor):
            from torch.distributed.tensor import distribute_tensor

            full = distribute_tensor(full.to(tensor.device, tensor.dtype), tensor.device_mesh, tensor.placements)
        tensor.copy_(full)


def gathered(tensor: torch.Tensor) -> torch.Tensor | None:
    """The whole of `tensor` (a shard or a plain tensor), on the CPU, in process 0; None in the other processes.

    A collective for a shard (every process must call it). Shards are gathered one tensor at a time, so a device
    never holds more than one whole tensor beyond its shards.
    """
    whole = full_state(tensor.detach())
    return whole.cpu() if is_main_process() else None


def gathered_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """`optimizer.state_dict()` with every state tensor `gathered` whole: the format of a single-process run, on the
    CPU, in process 0 (None in the others). A collective when the parameters are sharded."""
    state = optimizer.state_dict()
    per_param = {
        index: {key: gathered(value) if isinstance(value, torch.Tensor) else value for key, value in values.items()}
        for index, values in state["state"].items()
    }
    return {**state, "state": per_param} if is_main_process() else None


def load_gathered_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a `gathered_optimizer_state` (from any number of processes) into `optimizer`, sharding it like its
    parameters. A collective when they are sharded: every process must call it, with the same `state`."""
    from torch.distributed.tensor import distribute_tensor

    params = [p for group in optimizer.param_groups for p in group["params"]]  # state_dict's integer ids, in order
    per_param = {}
    for index, values in state["state"].items():
        param = params[index]
        per_param[index] = {
            key: distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
            if is_sharded(param) and isinstance(value, torch.Tensor) and value.shape == param.shape
            else value  # plain parameters, and per-parameter scalars such as AdamW's step count
            for key, value in values.items()
        }
    optimizer.load_state_dict({**state, "state": per_param})


@contextlib.contextmanager
def torchrun_process_group() -> Iterator[int]:
    """Join the processes torchrun started (WORLD_SIZE > 1 in the environment) for the duration of the block.

    NCCL on this process's GPU (LOCAL_RANK) when CUDA is available, gloo on CPU otherwise; the group is destroyed on
    exit. Yields the number of processes: 1 when not launched that way (then nothing is initialised), or the size
    of a group initialised earlier by the caller (then it is left as it is).
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        yield torch.distributed.get_world_size()
        return
    world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's contract is its environment variables
    if world <= 1:
        yield 1
        return
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)  # before anything touches CUDA, so "cuda" means this process's GPU
        torch.distributed.init_process_group("nccl", device_id=device)
    else:
        torch.distributed.init_process_group("gloo")
    try:
        yield world
    finally:
        torch.distributed.destroy_process_group()


def run_on_processes(fn: Callable[..., Any], processes: int, /, **kwargs: Any) -> Any:
    """`fn(**kwargs)` on `processes` local processes started by `torchrun --standalone --nproc_per_node`; returns
    what process 0 returned.

    `fn` must be importable (a module-level function) and join the processes itself (`torchrun_process_group`);
    `fn`, `kwargs` and the result travel pickled. The processes inherit this one's stdout and stderr (the file
    descriptors: `focus.pipeline.start.start_job` points them at the job's log) and share its torch threads. A
    separate torchrun, not multiprocessing: spawned workers re-run the parent's main script, a Snakemake script.

    Raises:
        RuntimeError: a process failed (its traceback is in the stderr they share).
    """
    threads = max(1, torch.get_num_threads() // processes)
    with tempfile.TemporaryDirectory(prefix="focus-processes-") as folder:
        call = Path(folder) / "call.pkl"
        call.write_bytes(pickle.dumps((fn, kwargs, threads, logging.getLogger().level)))
        entry = "import sys; from focus.distributed import _process_main; _process_main(sys.argv[1])"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            "--no-python", sys.executable, "-u", "-c", entry, str(call),
        ]  # --standalone: a free port of its own (--master_port 0 hangs)
        sys.stdout.flush()
        sys.stderr.flush()
        environ = {**os.environ, "OMP_NUM_THREADS": str(threads)}  # torchrun would set 1 and say so
        returncode = subprocess.run(command, env=environ).returncode
        if returncode != 0:
            raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed on {processes} processes (torchrun exit {returncode})")
        return pickle.loads((Path(folder) / "result.pkl").read_bytes())


def _process_main(call: str) -> None:
    """Entry point of a `run_on_processes` process: its threads and logging (other ranks: warnings only), then the
    call; process 0 leaves the result beside the call."""
    fn, kwargs, threads, log_level = pickle.loads(Path(call).read_bytes())
    torch.set_num_threads(threads)
    level = log_level if os.environ.get("RANK", "0") == "0" else max(log_level, logging.WARNING)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s", force=True)
    result = fn(**kwargs)
    if os.environ.get("RANK", "0") == "0":
        Path(call).with_name("result.pkl").write_bytes(pickle.dumps(result))
