"""The stages of the replication pipeline, one function each, so every Snakemake script is a single call.

    prepare_tokens       corpus split(s) -> token ids of one model's tokenizer (one safetensors file per domain)
    train_focus          frozen model + centroids trained on the domain -> Focus adapter, metrics, summary
    train_full_finetune  every weight trained on the same tokens -> the full-attention baseline model
    evaluate_perplexity  (model, method, domain) -> sliding-window perplexity record

Functions take plain values (paths, dicts of config fields) and write their artifacts atomically. Training runs
in a `run/` folder beside the outputs that the pipeline does not declare, so a killed job keeps its checkpoint
and the re-run resumes from it; the folder is removed once the outputs are written.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .adapter import load_focus, read_adapter_config, save_focus
from .config import FocusConfig, to_dict
from .data import chunk_tokens, corpus_location, load_corpus, tokenize_corpus
from .files import atomic_write, write_folder_atomically, write_json
from .models import load_model, load_tokenizer
from .perplexity import perplexity
from .profile import FULL_FINETUNE, method_variant
from .provenance import provenance
from .retrofit import apply_focus, focus_parameter_count, set_focus_mode
from .training import CHECKPOINT_NAME, METRICS_NAME, CheckpointError, TrainConfig, train_centroids

_log = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def start_job(log: str | Path, threads: int) -> None:
    """Send this job's stdout, stderr (progress bars) and logging to `log`, and use `threads` torch threads."""
    stream = open(log, "w", buffering=1)  # line-buffered: `tail -f` shows progress as it happens
    sys.stdout = sys.stderr = stream
    logging.basicConfig(level=logging.INFO, stream=stream, format="%(asctime)s %(name)s: %(message)s", force=True)
    torch.set_num_threads(threads)


def prepare_tokens(source: str, domain: str, splits: list[str], output: str | Path, mirror: str | None = None) -> dict:
    """Tokenise `splits` of corpus `domain` with `source`'s tokenizer into one safetensors file.

    The file maps each split to its ids (int32 (T,)); its metadata "splits" holds, per split, the token count and
    where the text came from (mirror file or hub dataset). Returns that metadata.
    """
    tokenizer = load_tokenizer(source)
    tensors, meta = {}, {}
    for split in splits:
        ids = tokenize_corpus(load_corpus(domain, split, mirror), tokenizer)
        tensors[split] = ids.to(torch.int32)  # vocabularies fit in int32; halves the file
        meta[split] = {"tokens": ids.numel(), "source": corpus_location(domain, split, mirror)}
    metadata = {"splits": json.dumps(meta, sort_keys=True), "tokenizer": type(tokenizer).__name__, "model": source}
    atomic_write(Path(output), lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    return meta


def read_tokens(path: str | Path, split: str) -> torch.Tensor:
    """The ids of `split` in a `prepare_tokens` file: LongTensor (T,)."""
    with safe_open(str(path), framework="pt") as f:
        if split not in f.keys():
            raise KeyError(f"{path} has no split {split!r} (it has {sorted(f.keys())}); list it in data.domains")
        return f.get_tensor(split).long()


def train_focus(
    source: str,
    dtype: str,
    focus: dict[str, Any],
    train: dict[str, Any],
    tokens: str | Path,
    seq_len: int,
    calibration_rows: int,
    eval_rows: int,
    adapter_dir: str | Path,
    metrics: str | Path,
    summary: str | Path,
    progress: bool = True,
) -> dict:
    """Retrofit Focus onto `source`, train only the centroids on the train split, save the adapter.

    The first `calibration_rows` rows of seq_len tokens k-means-initialise the centroids and are not trained on;
    the first `eval_rows` validation rows are scored during training. Writes `adapter_dir`, `metrics` (JSON
    lines) and `summary` (resolved configs, parameter counts, final metrics, wall time, provenance).
    """
    model, _ = load_model(source, _DTYPES[dtype], _device())
    calibration, rows, eval_data = _training_rows(tokens, seq_len, calibration_rows, eval_rows)
    config = FocusConfig.from_dict(focus)
    apply_focus(model, config, calibration_ids=calibration.to(model.device) if calibration_rows else None)
    record = _train(model, rows, TrainConfig.from_dict(train), Path(metrics), eval_data, progress)
    save_focus(model, adapter_dir, base_model=source)
    record.update(focus_config=to_dict(config), trainable_parameters=focus_parameter_count(model))
    return _write_summary(summary, source, record, Path(metrics))


def train_full_finetune(
    source: str,
    dtype: str,
    train: dict[str, Any],
    tokens: str | Path,
    seq_len: int,
    calibration_rows: int,
    eval_rows: int,
    model_dir: str | Path,
    metrics: str | Path,
    summary: str | Path,
    progress: bool = True,
) -> dict:
    """The full-attention baseline: train every weight of `source` on the same train split, save the model.

    Same loop, data order and token budget as `train_focus`: the first `calibration_rows` rows are skipped here
    too, so with the same count and TrainConfig both methods train on identical batches.
    """
    model, tokenizer = load_model(source, _DTYPES[dtype], _device())
    _, rows, eval_data = _training_rows(tokens, seq_len, calibration_rows, eval_rows)
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    record = _train(model, rows, TrainConfig.from_dict(train), Path(metrics), eval_data, progress)
    for parameter in model.parameters():
        parameter.requires_grad_(False)

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    write_folder_atomically(Path(model_dir), write)
    record["trainable_parameters"] = sum(p.numel() for p in model.parameters())
    return _write_summary(summary, source, record, Path(metrics))


def evaluate_perplexity(
    source: str,
    dtype: str,
    method: str,
    tokens: str | Path,
    output: str | Path,
    context_length: int,
    stride: int | None = None,
    max_tokens: int | None = None,
    batch_size: int = 4,
    trained: str | Path | None = None,
    labels: dict[str, str] | None = None,
    progress: bool = True,
) -> dict:
    """Perplexity of one (model, method) on the test split of a `prepare_tokens` file, written to `output`.

    Args:
        method: "pretrained"; "full_finetune" (`trained` is the fine-tuned model folder); or "<variant>-soft" /
            "<variant>-hard" (`trained` is that variant's Focus adapter; hard is top-k routing).
        labels: extra fields for the record (the pipeline's short model name and the domain).
    """
    variant = method_variant(method)
    loaded_from = str(trained) if method == FULL_FINETUNE else source
    model, _ = load_model(loaded_from, _DTYPES[dtype], _device())
    if variant is not None:
        load_focus(model, trained)
        set_focus_mode(model, variant[1])
    ids = read_tokens(tokens, "test")
    ids = ids[:max_tokens] if max_tokens else ids
    tic = time.perf_counter()
    result = perplexity(model, ids, context_length, stride or context_length, batch_size, progress=progress)
    record = {
        **(labels or {}),
        "method": method,
        "source": source,
        "perplexity": result["ppl"],
        "nll": result["nll"],
        "tokens": result["tokens"],
        "context_length": context_length,
        "stride": stride or context_length,
        "seconds": round(time.perf_counter() - tic, 2),
        "provenance": provenance(),
    }
    if variant is not None:
        record["focus_config"] = read_adapter_config(trained)["focus_config"]
    write_json(output, record)
    return record


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _training_rows(
    tokens: str | Path, seq_len: int, calibration_rows: int, eval_rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(calibration rows, training rows, evaluation rows or None), each (N, seq_len) ids."""
    rows = chunk_tokens(read_tokens(tokens, "train"), seq_len)
    if rows.shape[0] <= calibration_rows:
        raise ValueError(f"{tokens}: {rows.shape[0]} train rows of {seq_len} tokens leave none after {calibration_rows} calibration rows")
    eval_data = chunk_tokens(read_tokens(tokens, "validation"), seq_len)[:eval_rows] if eval_rows else None
    return rows[:calibration_rows], rows[calibration_rows:], eval_data


def _train(
    model: torch.nn.Module,
    rows: torch.Tensor,
    config: TrainConfig,
    metrics: Path,
    eval_data: torch.Tensor | None,
    progress: bool,
) -> dict:
    """`train_centroids` in `<metrics folder>/run/`, then move its metrics to `metrics` and drop the folder.

    A checkpoint left there by a killed job is resumed; one written for other settings or data (the pipeline
    re-runs a job when its parameters change) is discarded with a warning, and training starts over.
    """
    run_dir = _run_dir(metrics)
    resumed = (run_dir / CHECKPOINT_NAME).exists()
    tic = time.perf_counter()
    try:
        final = train_centroids(model, rows, config, run_dir, eval_data=eval_data, progress=progress)
    except CheckpointError as err:
        _log.warning("discarding the checkpoint in %s (%s); training from step 0", run_dir, err)
        shutil.rmtree(run_dir)
        resumed = False
        final = train_centroids(model, rows, config, run_dir, eval_data=eval_data, progress=progress)
    seconds = time.perf_counter() - tic
    metrics.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / METRICS_NAME, metrics)
    return {
        "final": final,
        "train_config": to_dict(config),
        "train_rows": rows.shape[0],
        "seq_len": rows.shape[1],
        "seconds": round(seconds, 1),
        "resumed": resumed,
    }


def _run_dir(metrics: Path) -> Path:
    """Where a training job checkpoints: beside its outputs, undeclared, so a killed job's state survives."""
    return metrics.parent / "run"


def _write_summary(path: str | Path, source: str, record: dict, metrics: Path) -> dict:
    """Write the training summary, then remove the run folder: its checkpoint has served its purpose."""
    record.update(source=source, provenance=provenance())
    write_json(path, record)
    shutil.rmtree(_run_dir(metrics), ignore_errors=True)
    return record
