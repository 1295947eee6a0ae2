"""`focus.train.train_parameters` itself on a tiny Llama, as one process or under torchrun (FSDP2, gloo).

tests/test_distributed.py runs `run()` in its own process as the reference and this file under torchrun:

    python -m torch.distributed.run --standalone --nproc_per_node 2 train_parameters_run.py FRESH RESUMED

FRESH: a run from step 0, plus its adapter in FRESH/adapter. RESUMED: holds a single-process run's checkpoint,
resumed here to the last step.
"""

import dataclasses
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from focus import FocusConfig, apply_focus, save_focus
from focus.distributed import shard_model
from focus.models import tiny_model
from focus.train.config import TrainConfig
from focus.train.loop import train_parameters

# Batches of 4 rows over 2 processes; 10 rows: epoch 2 starts at step 3 (and 2 rows are left over each epoch).
# Clipping at 0.005 clips every step (norms are about 0.01), so the global gradient norm matters. Evaluation on
# 5 rows: one process scores 3, the other 2 and then runs a forward pass without rows, to stay in step.
CONFIG = TrainConfig(
    steps=6, batch_size=4, lr=2e-2, warmup_steps=1, grad_clip=0.005, seed=3, log_every=2, checkpoint_every=3,
    eval_every=3, eval_batch_size=2,
)
FOCUS = FocusConfig(num_groups=4, window=4, top_k=1)


def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(calibration, training, evaluation) token ids."""
    ids = torch.randint(3, 512, (17, 24), generator=torch.Generator().manual_seed(1))
    return ids[:2], ids[2:12], ids[12:]


def model() -> torch.nn.Module:
    calibration, _, _ = data()
    return apply_focus(tiny_model("llama", seed=0), FOCUS, calibration_ids=calibration)


def run(output: Path, sharded: bool, on_log=None) -> torch.nn.Module:
    """Train (or resume) into `output`; returns the model."""
    _, rows, held_out = data()
    trained = model()
    if sharded:
        shard_model(trained)
    train_parameters(trained, rows, CONFIG, output, eval_data=held_out, progress=False, on_log=on_log)
    return trained


def main(fresh: str, resumed: str) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(1234 + dist.get_rank())  # different global RNGs: the run must not depend on them
    save_focus(run(Path(fresh), sharded=True), Path(fresh) / "adapter", base_model="tiny:llama")
    run(Path(resumed), sharded=True)
    _, rows, _ = data()
    try:  # a batch the 2 processes cannot share equally
        train_parameters(model(), rows, dataclasses.replace(CONFIG, batch_size=3), Path(fresh) / "odd", progress=False)
    except ValueError as err:
        if dist.get_rank() == 0:
            (Path(fresh) / "odd_batch_error.txt").write_text(str(err))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
