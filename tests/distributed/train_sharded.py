"""Run under torchrun by tests/test_distributed.py: centroid training of a tiny model, sharded with FSDP2 (gloo).

Each process trains on its rows of every global batch; rank 0 saves the full centroids and balance buffers.
"""

import sys

import torch
import torch.distributed as dist

from focus import FocusConfig, apply_focus
from focus.distributed import full_state, shard_model
from focus.models import tiny_model
from focus.train.loop import next_token_loss

STEPS, ROWS, LENGTH = 4, 4, 32


def centroid_run(model, ids, rank, world):
    """STEPS AdamW steps on the centroids; this process scores rows rank, rank + world, ... of `ids`."""
    apply_focus(model, FocusConfig(num_groups=4, window=4, top_k=1), calibration_ids=ids)
    if world > 1:
        shard_model(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    rows = ids[rank::world]
    for _ in range(STEPS):
        next_token_loss(model(input_ids=rows).logits, rows).backward()
        optimizer.step()
        optimizer.zero_grad()
    centroids = [full_state(p.detach()) for p in params]
    buffers = [full_state(b) for name, b in model.named_buffers() if name.endswith("focus_group_bias")]
    return centroids, buffers


def main(output: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ids = torch.randint(3, 512, (ROWS, LENGTH), generator=torch.Generator().manual_seed(1))
    centroids, buffers = centroid_run(tiny_model("llama", seed=0), ids, rank, world)
    if rank == 0:
        torch.save({"centroids": centroids, "buffers": buffers, "world": world}, output)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
