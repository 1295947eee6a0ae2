"""Files the library writes (issue 57): modes follow the umask through the real writers, and a full disk is one line
that leaves the previous file whole."""

import errno
import os
import shutil
import subprocess
import uuid

import pytest
import torch
from safetensors.torch import save_file
from test_training import tiny_llama

from focus import FocusConfig, apply_focus, save_focus
from focus.files import DiskFullError, atomic_write, write_folder_atomically, write_json


@pytest.fixture(params=[0o022, 0o002], ids=["umask022", "umask002"])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def mode(path):
    return path.stat().st_mode & 0o777


def test_atomic_writes_give_the_umasks_mode_to_safetensors_json_and_torch_files(tmp_path, umask):
    atomic_write(tmp_path / "a.safetensors", lambda tmp: save_file({"x": torch.ones(3)}, str(tmp)))
    atomic_write(tmp_path / "state.pt", lambda tmp: torch.save({"x": 1}, tmp))
    write_json(tmp_path / "a.json", {"a": 1})
    for name in ("a.safetensors", "state.pt", "a.json"):
        assert mode(tmp_path / name) == 0o666 & ~umask, name


def test_a_folder_written_atomically_and_an_adapter_follow_the_umask(tmp_path, umask):
    def write(folder):
        save_file({"x": torch.ones(3)}, str(folder / "w.safetensors"))
        (folder / "sub").mkdir()
        (folder / "sub" / "t.txt").write_text("t")

    write_folder_atomically(tmp_path / "model", write)
    assert mode(tmp_path / "model" / "w.safetensors") == 0o666 & ~umask
    assert mode(tmp_path / "model" / "sub") == 0o777 & ~umask
    model = tiny_llama()
    apply_focus(model, FocusConfig(window=8), calibration_ids=torch.randint(0, 128, (2, 32)))
    save_focus(model, tmp_path / "adapter")
    for path in (tmp_path / "adapter").iterdir():
        assert mode(path) == 0o666 & ~umask, path.name


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"),
                                     RuntimeError("Error while serializing: IoError(Os { code: 28, kind: "
                                                  "StorageFull, message: \"No space left on device\" })")],
                         ids=["oserror", "safetensors"])
def test_a_full_disk_is_one_line_naming_the_file_and_keeps_the_previous_one(tmp_path, failure):
    target = tmp_path / "adapter.safetensors"
    atomic_write(target, lambda tmp: tmp.write_bytes(b"old"))

    def fill_then_fail(tmp):
        tmp.write_bytes(b"x" * 1000)
        raise failure

    with pytest.raises(DiskFullError) as info:
        atomic_write(target, fill_then_fail)
    message = str(info.value)
    assert "\n" not in message and str(target) in message and "1,000 bytes of it written" in message
    assert target.read_bytes() == b"old" and not (tmp_path / "adapter.safetensors.tmp").exists()
    with pytest.raises(DiskFullError, match="no space left to write .*model"):
        write_folder_atomically(tmp_path / "model", lambda folder: fill_then_fail(folder / "w"))
    assert not (tmp_path / "model").exists() and not list(tmp_path.glob(".tmp-model-*"))


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (root only: skipped where mounting is not allowed)."""
    where = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    mounted = shutil.which("mount") and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                                                       capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)  # lazily: a file still open must not leave it mounted


def test_a_real_full_disk_is_one_line_and_the_earlier_file_survives(small_disk):
    target = small_disk / "weights.safetensors"
    atomic_write(target, lambda tmp: save_file({"x": torch.ones(1000)}, str(tmp)))
    before = target.read_bytes()
    with pytest.raises(DiskFullError, match=f"no space left to write {target}"):
        atomic_write(target, lambda tmp: save_file({"x": torch.ones(200_000)}, str(tmp)))
    assert target.read_bytes() == before and [p.name for p in small_disk.iterdir()] == ["weights.safetensors"]


def test_short_rows_train_without_the_default_retrieval_rows_but_refuse_an_asked_share(tmp_path, tiny_tokenizer):
    from safetensors.torch import save_file as save

    from focus.pipeline.jobs import TrainingJob
    from focus.train.config import TrainConfig

    tokens = tmp_path / "tokens.safetensors"
    save({"train": torch.randint(3, 500, (40 * 64,), dtype=torch.int32)}, str(tokens))
    settings = dict(tokens=tokens, seq_len=64, train=TrainConfig(steps=1), metrics=tmp_path / "m",
                    summary=tmp_path / "s")
    rows = torch.randint(3, 500, (6, 64))
    with pytest.warns(UserWarning, match="training without retrieval rows: rows of 64 tokens have no room"):
        ids, weights, _ = TrainingJob(**settings).training_rows(rows, tiny_tokenizer, window=32)
    assert ids.shape == (6, 64) and weights is None
    with pytest.raises(ValueError, match="no room for a fact 32 tokens before its question"):
        TrainingJob(**settings, retrieval_share=0.25).training_rows(rows, tiny_tokenizer, window=32)
    long_rows = torch.randint(3, 500, (6, 512))
    ids, weights, _ = TrainingJob(**{**settings, "seq_len": 512}).training_rows(long_rows, tiny_tokenizer, window=32)
    assert ids.shape == (8, 512) and weights is not None  # a quarter of the rows, where a row holds them


def test_focus_train_on_a_full_disk_is_one_line_keeps_its_checkpoint_and_resumes_bit_identical(small_disk, tmp_path,
                                                                                                monkeypatch, capsys):
    """The disk fills between the step-2 and the step-4 checkpoint (a filler file written just before the second):
    one line, exit non-zero, the step-2 checkpoint loads; with the filler gone, a rerun finishes with the adapter an
    uninterrupted run makes, byte for byte."""
    from focus.cli import main
    from focus.train import loop

    def train(out):
        return main(["train", "--model", "tiny:llama", "--output", str(out), "--seq_len", "64", "--calibration_rows",
                     "2", "--eval_rows", "2", "--steps", "6", "--batch_size", "2", "--num_groups", "4", "--window",
                     "8", "--checkpoint_every", "2", "--retrieval_share", "0"])

    assert train(tmp_path / "whole") == 0
    capsys.readouterr()
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    save_checkpoint, saves = loop.save_checkpoint, []

    def fill_the_disk_before_the_second(path, **state):
        saves.append(state["step"])
        if len(saves) == 2:
            filler = small_disk / "filler"
            with open(filler, "wb", buffering=0) as f, pytest.raises(OSError):
                while True:
                    f.write(b"\0" * 4096)
        save_checkpoint(path, **state)

    monkeypatch.setattr(loop, "save_checkpoint", fill_the_disk_before_the_second)
    out = small_disk / "run"
    assert train(out) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    assert error.splitlines()[-1] == (f"focus train: error: no space left to write {out}/run/checkpoint.pt (0 bytes of "
                                      f"it written, 0 bytes free in {out}/run)")
    monkeypatch.undo()
    assert saves == [2, 4] and torch.load(out / "run" / "checkpoint.pt", weights_only=True)["step"] == 2
    assert not list((out / "run").glob("*.tmp"))
    (small_disk / "filler").unlink()
    assert train(out) == 0
    for name in ("focus_centroids.safetensors", "focus_config.json"):
        assert (out / "adapter" / name).read_bytes() == (tmp_path / "whole" / "adapter" / name).read_bytes(), name


@pytest.mark.parametrize("failure", ["DiskFullError(28, 'no space left to write a/b.json (0 bytes of it written, 0 "
                                     "bytes free in a)')", "ValueError('a bug')"], ids=["full_disk", "other"])
def test_a_pipeline_job_that_ran_out_of_space_ends_its_log_with_one_line(tmp_path, failure):
    import sys

    log = tmp_path / "job.log"
    script = ("from focus.files import DiskFullError\nfrom focus.pipeline.start import start_job\n"
              f"start_job({str(log)!r}, 1)\nprint('working')\nraise {failure}\n")
    assert subprocess.run([sys.executable, "-c", script]).returncode == 1
    lines = log.read_text().splitlines()
    if failure.startswith("DiskFullError"):
        assert lines == ["working", "error: no space left to write a/b.json (0 bytes of it written, 0 bytes free in a)"]
    else:
        assert lines[1] == "Traceback (most recent call last):" and lines[-1] == "ValueError: a bug"


@pytest.mark.parametrize("fails", [False, True], ids=["done", "failed"])
def test_a_pipeline_job_stamps_its_tables_when_it_ends_and_only_then(tmp_path, fails):
    """`start_job(..., stamp=outputs)`: a job that ends well gets its Markdown table's provenance line and sidecar
    (`focus.pipeline.stamp`); a failed one leaves its outputs as they are, for Snakemake to remove."""
    import sys

    table = tmp_path / "table.md"
    script = ("from pathlib import Path\nfrom focus.pipeline.start import start_job\n"
              f"start_job({str(tmp_path / 'job.log')!r}, 1, stamp=[{str(table)!r}])\n"
              f"Path({str(table)!r}).write_text('| a |\\n')\n" + ("raise ValueError('a bug')\n" if fails else ""))
    environment = {**os.environ, "FOCUS_PROFILE": "t@0"}
    assert subprocess.run([sys.executable, "-c", script], env=environment).returncode == fails
    text = table.read_text()
    assert text.startswith("*Made at commit ") != fails and text.endswith("| a |\n")
    assert (tmp_path / "table.provenance.json").exists() != fails
