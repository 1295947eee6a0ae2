"""Centroid training sharded over 2 CPU processes (FSDP2, gloo) equals one process on the same global batch:
a hand-written loop, `train_parameters` itself (checkpoints and adapters in the single-process format, resumable
across process counts), and the pipeline's `train_focus` stage on 2 processes."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "distributed"))
import train_parameters_run  # noqa: E402
from train_sharded import LENGTH, ROWS, centroid_run  # noqa: E402

from focus import load_focus  # noqa: E402
from focus.adapter import CONFIG_NAME, WEIGHTS_NAME  # noqa: E402
from focus.models import tiny_model  # noqa: E402
from focus.pipeline.jobs import TrainingJob  # noqa: E402
from focus.train.checkpoint import CHECKPOINT_NAME  # noqa: E402
from focus.train.config import TrainConfig  # noqa: E402
from focus.train.loop import METRICS_NAME, train_parameters  # noqa: E402


def torchrun(script: str, *args: str) -> None:
    """`script` in tests/distributed on 2 local CPU processes (one thread each), as the tests' torchrun."""
    environ = {**os.environ, "OMP_NUM_THREADS": "1"}
    # --standalone picks a free port itself (--master_port 0 hangs).
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(HERE / "distributed" / script), *args],
        env=environ, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_two_process_fsdp_matches_one_process(tmp_path, one_thread):
    output = tmp_path / "sharded.pt"
    torchrun("train_sharded.py", str(output))
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


def _checkpoint(folder: Path) -> dict:
    return torch.load(folder / CHECKPOINT_NAME, weights_only=True)


def _layout(value):
    """The structure of a checkpoint value with every tensor replaced by its (dtype, shape): its format."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype), tuple(value.shape)
    if isinstance(value, dict):
        return {key: _layout(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_layout(item) for item in value]
    return type(value).__name__


def _max_difference(ours: dict, theirs: dict) -> float:
    assert ours.keys() == theirs.keys()
    return max((ours[name] - theirs[name]).abs().max().item() for name in ours)


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / METRICS_NAME).read_text().splitlines()]


@pytest.mark.slow
def test_train_parameters_on_two_processes_equals_one_and_checkpoints_cross_process_counts(tmp_path, one_thread):
    run = train_parameters_run
    single, fresh, resumed = tmp_path / "single", tmp_path / "fresh", tmp_path / "resumed"
    trained = run.run(single, sharded=False)
    run.save_focus(trained, single / "adapter", base_model="tiny:llama")

    def crash_at_step_4(record):  # after the checkpoint of step 3
        if record["step"] == 4:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run.run(resumed, sharded=False, on_log=crash_at_step_4)
    assert _checkpoint(resumed)["step"] == 3

    torchrun("train_parameters_run.py", str(fresh), str(resumed))

    one = _checkpoint(single)
    for two in (_checkpoint(fresh), _checkpoint(resumed)):  # from step 0 on 2 processes; resumed there from 1
        assert _layout(two) == _layout(one)  # the same format: keys, dtypes, shapes, the optimizer state whole
        assert two["step"] == 6 and two["optimizer"]["param_groups"] == one["optimizer"]["param_groups"]
        assert two["scheduler"] == one["scheduler"] and two["data_sha256"] == one["data_sha256"]
        print(f"max |2-process - 1-process|: centroids {_max_difference(one['params'], two['params']):.1e}, "
              f"group bias {_max_difference(one['buffers'], two['buffers']):.1e}")
        assert min(p.abs().max().item() for p in one["params"].values()) > 0.1
        torch.testing.assert_close(two["params"], one["params"], atol=1e-6, rtol=1e-5)  # as the hand-written loop
        torch.testing.assert_close(two["buffers"], one["buffers"], atol=1e-6, rtol=1e-5)
        for state_one, state_two in zip(one["optimizer"]["state"].values(), two["optimizer"]["state"].values()):
            torch.testing.assert_close(state_two, state_one, atol=1e-6, rtol=1e-4)
        for ours, theirs in zip(one["final_metrics"].items(), two["final_metrics"].items()):
            assert ours[0] == theirs[0] and (ours[0].startswith("time/") or math.isclose(ours[1], theirs[1], rel_tol=1e-5))
    # The record: written once (by process 0), the same lines; losses, clipped norms and evaluation agree.
    assert [r["step"] for r in _records(fresh)] == [r["step"] for r in _records(single)] == [2, 3, 4, 6]
    for ours, theirs in zip(_records(single), _records(fresh)):
        for key in ("train/loss", "train/grad_norm", "eval/loss"):
            assert (key in ours) == (key in theirs) and math.isclose(ours.get(key, 0), theirs.get(key, 0), rel_tol=1e-5)
    assert "batch_size=3 is not a multiple of the 2 processes" in (fresh / "odd_batch_error.txt").read_text()
    assert not (fresh / "odd").exists()

    # A 2-process adapter: the same files as a single-process one, and it loads into a single-process model.
    ours, theirs = load_file(single / "adapter" / WEIGHTS_NAME), load_file(fresh / "adapter" / WEIGHTS_NAME)
    assert _layout(theirs) == _layout(ours)
    torch.testing.assert_close(theirs, ours, atol=1e-6, rtol=1e-5)
    config_one = json.loads((single / "adapter" / CONFIG_NAME).read_text())
    assert json.loads((fresh / "adapter" / CONFIG_NAME).read_text()) == config_one
    loaded = load_focus(tiny_model("llama", seed=0), fresh / "adapter")
    assert _max_difference(theirs, _adapter_tensors(loaded)) == 0
    # A 2-process checkpoint resumes in one process: a finished run, so it only loads the trained state.
    _, rows, held_out = run.data()
    model = run.model()
    final = train_parameters(model, rows, run.CONFIG, fresh, eval_data=held_out, progress=False)
    two = _checkpoint(fresh)
    assert final == two["final_metrics"]
    for name, tensor in model.named_parameters():
        if tensor.requires_grad:
            assert torch.equal(tensor.detach(), two["params"][name])


def _adapter_tensors(model) -> dict[str, torch.Tensor]:
    from focus.retrofit import attention_modules

    tensors = {}
    for i, module in enumerate(attention_modules(model)):
        tensors[f"layers.{i}.centroids"] = module.focus_centroids.detach()
        tensors[f"layers.{i}.group_bias"] = module.focus_group_bias.detach()
    return tensors


def _stage_settings(tmp_path: Path, lr: float, out: Path) -> dict:
    """Arguments of a pipeline training stage on tiny:llama: 14 training rows of 32 tokens after 2 for calibration,
    records in `out`."""
    ids = torch.randint(3, 4000, (20 * 32,), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    tokens = tmp_path / "tokens.safetensors"
    save_file({"train": ids[:16 * 32], "validation": ids[16 * 32:]}, str(tokens))
    train = TrainConfig(steps=3, batch_size=4, lr=lr, log_every=1, checkpoint_every=2)
    job = TrainingJob(tokens, 32, train, out / "metrics.jsonl", out / "summary.json", calibration_rows=2, eval_rows=3,
                      retrieval_share=0, progress=False)  # rows of 32 tokens hold no retrieval fact
    return dict(source="tiny:llama", dtype="float32", job=job)


@pytest.mark.slow
def test_train_focus_stage_on_two_processes_writes_the_single_process_artifacts(tmp_path, one_thread):
    from focus.pipeline.stages import train_focus

    focus = {"num_groups": 4, "window": 8, "top_k": 1}
    summaries = {}
    for processes in (1, 2):
        out = tmp_path / str(processes)
        summaries[processes] = train_focus(**_stage_settings(tmp_path, 1e-2, out), focus=focus,
                                           adapter_dir=out / "adapter", processes=processes)
        assert json.loads((out / "summary.json").read_text())["processes"] == processes
        assert not (out / "run").exists()  # the checkpoint folder is gone once the outputs are written
        assert "| steps | 3 |" in (out / "adapter" / "README.md").read_text()  # the model card, by process 0
    one, two = summaries[1], summaries[2]
    assert one.keys() == two.keys() and one["trainable_parameters"] == two["trainable_parameters"] == 2 * 2 * 4 * 16
    assert math.isclose(one["final"]["eval/loss"], two["final"]["eval/loss"], rel_tol=1e-5)
    # The frozen weights' checksum, summed over the shards, is the single-process one, and training left it alone.
    for summary in (one, two):
        assert summary["frozen_checksum"]["before"] == summary["frozen_checksum"]["after"]
    torch.testing.assert_close(torch.tensor(two["frozen_checksum"]["before"], dtype=torch.float64),
                               torch.tensor(one["frozen_checksum"]["before"], dtype=torch.float64), rtol=1e-9, atol=0)
    adapters = [load_file(tmp_path / str(n) / "adapter" / WEIGHTS_NAME) for n in (1, 2)]
    assert _layout(adapters[0]) == _layout(adapters[1])
    torch.testing.assert_close(adapters[1], adapters[0], atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_full_finetune_stage_on_two_processes_saves_the_whole_model(tmp_path, one_thread):
    from focus.models import load_model
    from focus.pipeline.stages import train_full_finetune

    weights = {}
    for processes in (1, 2):
        out = tmp_path / str(processes)
        train_full_finetune(**_stage_settings(tmp_path, 1e-3, out), model_dir=out / "model", processes=processes)
        weights[processes] = load_model(out / "model")[0].state_dict()
        assert json.loads((out / "model" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert weights[1].keys() == weights[2].keys()
    torch.testing.assert_close(weights[2], weights[1], atol=1e-5, rtol=1e-5)
    assert not torch.equal(weights[1]["model.norm.weight"], torch.ones_like(weights[1]["model.norm.weight"]))
