"""Centroid training sharded over 2 CPU processes (FSDP2, gloo) equals one process on the same global batch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "distributed"))
from train_sharded import ROWS, LENGTH, centroid_run  # noqa: E402

from focus.models import tiny_model  # noqa: E402


@pytest.mark.slow
def test_two_process_fsdp_matches_one_process(tmp_path, one_thread):
    output = tmp_path / "sharded.pt"
    environ = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(HERE / "distributed" / "train_sharded.py"), str(output)],
        env=environ, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sharded = torch.load(output)
    assert sharded["world"] == 2

    torch.manual_seed(0)
    ids = torch.randint(3, 512, (ROWS, LENGTH), generator=torch.Generator().manual_seed(1))
    centroids, buffers = centroid_run(tiny_model("llama", seed=0), ids, rank=0, world=1)
    assert len(centroids) == len(sharded["centroids"]) == 2  # one centroid set per layer
    for ours, theirs in zip(centroids, sharded["centroids"]):
        assert not torch.equal(ours, torch.zeros_like(ours))
        torch.testing.assert_close(theirs, ours, atol=1e-6, rtol=1e-5)
    for ours, theirs in zip(buffers, sharded["buffers"]):
        torch.testing.assert_close(theirs, ours, atol=1e-6, rtol=1e-5)
