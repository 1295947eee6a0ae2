"""The stages of the replication pipeline, one function each, so every Snakemake script is a single call.

    prepare_tokens       corpus split(s) -> token ids of one model's tokenizer (one safetensors file per domain)
    train_focus          frozen model + centroids trained on the domain -> Focus adapter, metrics, summary
    train_full_finetune  every weight trained on the same tokens -> the full-attention baseline model
    train_lora           PEFT LoRA adapters trained on the same tokens -> one LoRA baseline of the grid
    evaluate_perplexity  (model, method, domain) -> sliding-window perplexity record
    evaluate_benchmarks  (model, method) -> lm-eval scores and per-document logs
    evaluate_needle      (model, method) -> pass-key retrieval from long passages
    evaluate_ruler       (model, method) -> RULER scores (lm-eval) at each prompt length, per-document logs

Functions take plain values (paths, dicts of config fields) and write their artifacts atomically. Training runs
in a `run/` folder beside the outputs that the pipeline does not declare, so a killed job keeps its checkpoint
and the re-run resumes from it; the folder is removed once the outputs are written.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from focus.adapter import load_focus, read_adapter_config, save_focus
from focus.config import FocusConfig, to_dict
from focus.data import chunk_tokens, corpus_location, load_corpus, tokenize_corpus
from focus.distributed import (
    barrier,
    frozen_checksum,
    is_main_process,
    run_on_processes,
    shard_model,
    torchrun_process_group,
)
from focus.eval.diagnostics import distant_pairs_kept
from focus.eval.harness import run_tasks, write_mirror_tasks, write_samples
from focus.eval.needle import needle_trials
from focus.eval.perplexity import perplexity
from focus.eval.ruler import run_ruler
from focus.files import atomic_write, write_folder_atomically, write_json
from focus.hub import write_model_card
from focus.models import inference_device, load_model, load_tokenizer
from focus.pipeline.jobs import (
    _DTYPES,
    TrainingJob,
    _load_for_training,
    default_device,
    read_tokens,
)
from focus.pipeline.methods import FULL_FINETUNE, PEER, method_kind, method_variant, parse_lora_name, parse_peer_name
from focus.provenance import provenance
from focus.retrofit import apply_focus, calibrate_centroids, focus_parameter_count, set_focus_mode
from focus.train.loop import evaluate_loss
from focus.train.lora import apply_lora, load_lora


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


def train_focus(
    source: str,
    dtype: str,
    focus: dict[str, Any],
    job: TrainingJob,
    adapter_dir: str | Path,
    processes: int = 1,
) -> dict:
    """Retrofit Focus onto `source`, train only the centroids on the job's rows, save the adapter.

    The job's calibration rows k-means-initialise the centroids. Writes `adapter_dir` and the job's metrics (JSON
    lines) and summary (resolved configs, parameter counts, final metrics, wall time, provenance).

    `processes` > 1 runs the job on that many local processes, one per GPU (`focus.distributed.run_on_processes`,
    as `torchrun --standalone --nproc_per_node` would) and returns process 0's summary; a function launched by
    torchrun itself joins torchrun's processes. Either way the model is sharded over the processes (FSDP2) and
    the artifacts are those of a single-process run, up to float rounding.
    """
    if processes > 1:
        return run_on_processes(train_focus, processes, **{**locals(), "processes": 1})  # locals(): the arguments
    with torchrun_process_group() as world:
        model, tokenizer = _load_for_training(source, dtype, world)
        calibration, rows, eval_data = job.rows()
        config = FocusConfig.from_dict(focus)
        rows, weights, term_weights = job.training_rows(rows, tokenizer, config.window, teacher=config.distill > 0)
        apply_focus(model, config, init_centroids=False)
        if world > 1:
            shard_model(model)
        # After sharding, so that k-means runs on the GPUs through the sharded model (it may fit on none alone).
        calibrate_centroids(model, calibration if job.calibration_rows else None)
        reference = reference_evaluation(model, eval_data, config) if eval_data is not None else {}
        frozen_before = frozen_checksum(model)
        # The validation curve in the mode the objective trains for: the others than the soft gate's train the hard one.
        eval_mode = config.mode if config.objective == "language_model" else "hard"
        set_focus_mode(model, eval_mode, window=config.window)
        record = job.run(model, rows, eval_data, token_weights=weights, term_weights=term_weights)
        set_focus_mode(model, config.mode, window=config.window)
        save_focus(model, adapter_dir, base_model=source)
        record.update(focus_config=to_dict(config), trainable_parameters=focus_parameter_count(model),
                      reference_eval=reference, eval_mode=eval_mode,
                      frozen_checksum={"before": frozen_before, "after": frozen_checksum(model)})
        if is_main_process():
            write_model_card(adapter_dir, training={**record, "train": record["train_config"]})
        return job.finish(source, record, weights=adapter_dir)


def build_peer(source: str, dtype: str, focus: dict[str, Any], tokens: str | Path, seq_len: int,
               calibration_rows: int | None, adapter_dir: str | Path) -> Path:
    """A training-free peer (`focus` names its `selector` and `budget`) saved as an adapter, so that every evaluation
    stage loads it as it loads a trained one. Its centroids are the k-means of the same calibration rows a training
    job of `tokens` starts from (`TrainingJob.rows`): the 'clusters' selector ranks those key clusters; the others
    never read them. Nothing is trained. `calibration_rows` None: a training job's default."""
    calibration_rows = TrainingJob.calibration_rows if calibration_rows is None else calibration_rows
    model, _ = load_model(source, _DTYPES[dtype], inference_device())
    calibration = chunk_tokens(read_tokens(tokens, "train"), seq_len)[:calibration_rows]
    apply_focus(model, FocusConfig.from_dict(focus), calibration_ids=calibration if calibration_rows else None)
    write_folder_atomically(Path(adapter_dir), lambda folder: save_focus(model, folder, base_model=source))
    return Path(adapter_dir)


def reference_evaluation(model: torch.nn.Module, eval_data: torch.Tensor, config: FocusConfig) -> dict[str, float]:
    """Validation perplexity on the training job's own evaluation rows before any step: of the pretrained model (Focus
    off, which a window covering the rows gives exactly) and of the k-means centroids, soft and hard; the lines and
    starting points that the training curves are read against. Leaves the model in `config`'s mode."""
    found = {}
    references = (("pretrained", {"window": eval_data.shape[1]}), ("init_soft", {}), ("init_hard", {}))
    for name, changes in tqdm(references, desc="reference perplexity", unit="model"):
        set_focus_mode(model, "hard" if name == "init_hard" else "soft", **{"window": config.window, **changes})
        found[name] = math.exp(evaluate_loss(model, eval_data, batch_size=2))
    set_focus_mode(model, config.mode, window=config.window)
    return found


def train_full_finetune(
    source: str,
    dtype: str,
    job: TrainingJob,
    model_dir: str | Path,
    processes: int = 1,
    retrieval_window: int | None = None,
) -> dict:
    """The full-attention baseline: train every weight of `source` on the job's rows, save the model.

    Same loop, data order and token budget as `train_focus`: the calibration rows are skipped here too, and the
    job's retrieval rows are built for `retrieval_window` (the Focus run's window), so with the same job settings
    both methods train on identical batches. `processes`: as in `train_focus` (weights, gradients and AdamW state
    sharded over them).
    """
    if processes > 1:
        return run_on_processes(train_full_finetune, processes, **{**locals(), "processes": 1})
    with torchrun_process_group() as world:
        model, tokenizer = _load_for_training(source, dtype, world)
        _, rows, eval_data = job.rows()
        rows, weights, _ = job.training_rows(rows, tokenizer, retrieval_window)
        for parameter in model.parameters():
            parameter.requires_grad_(True)
        if world > 1:
            shard_model(model)
        record = job.run(model, rows, eval_data, token_weights=weights)
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        state = None
        if world > 1:  # the whole weights, gathered one tensor at a time to the CPU of process 0
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

        def write(folder: Path) -> None:
            model.save_pretrained(folder, state_dict=state)
            tokenizer.save_pretrained(folder)

        if is_main_process():
            write_folder_atomically(Path(model_dir), write)
        barrier()
        record["trainable_parameters"] = sum(p.numel() for p in model.parameters())
        return job.finish(source, record, weights=model_dir, kind="model")


def train_lora(
    source: str,
    dtype: str,
    rank: int,
    alpha: float,
    target_modules: list[str],
    dropout: float,
    job: TrainingJob,
    adapter_dir: str | Path,
    retrieval_window: int | None = None,
) -> dict:
    """A LoRA baseline: PEFT adapters of `rank` on `target_modules`, trained on the same rows as the centroids.

    Same loop, data order, steps and batch as `train_focus` (the job's `train` carries the grid cell's learning
    rate; its retrieval rows are built for `retrieval_window`, the Focus run's window); writes PEFT's adapter
    folder to `adapter_dir`, and the job's metrics and summary.
    """
    model, tokenizer = load_model(source, _DTYPES[dtype], default_device())
    _, rows, eval_data = job.rows()
    rows, weights, _ = job.training_rows(rows, tokenizer, retrieval_window)
    model = apply_lora(model, rank, alpha, target_modules, dropout, seed=job.config().seed)
    record = job.run(model, rows, eval_data, token_weights=weights)
    write_folder_atomically(Path(adapter_dir), lambda folder: model.save_pretrained(folder))
    record.update(
        lora_config={"r": rank, "lora_alpha": alpha, "target_modules": list(target_modules), "lora_dropout": dropout},
        trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
    )
    return job.finish(source, record, weights=adapter_dir, kind="lora-adapter")


KEPT_ROWS = 2
"""Rows a hard method's share of distant pairs kept (`distant_kept`) is measured on: the first of the scored split."""


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
    split: str = "test",
    focus_changes: dict[str, Any] | None = None,
) -> dict:
    """Perplexity of one (model, method) on one split (default test) of a `prepare_tokens` file, written to `output`.

    Args:
        method: "pretrained"; "full_finetune" (`trained` is the fine-tuned model folder); or "<variant>-soft" /
            "<variant>-hard" (`trained` is that variant's Focus adapter; hard is top-k routing).
        labels: extra fields for the record (the pipeline's short model name and the domain).
        split: "test" (reported) or "validation" (what choices are made on).
        focus_changes: FocusConfig settings that need no training (e.g. `dense_below`) over the adapter's.
    """
    model, _ = load_method(source, dtype, method, trained, focus_changes)
    ids = read_tokens(tokens, split)
    ids = ids[:max_tokens] if max_tokens else ids
    tic = time.perf_counter()
    result = perplexity(model, ids, context_length, stride or context_length, batch_size, progress=progress)
    kept = None
    if method_kind(method) in ("focus-hard", PEER):  # the budget a hard pattern spends, on its first rows
        kept = distant_pairs_kept(model, chunk_tokens(ids, context_length)[:KEPT_ROWS], batch_size=1)
    record = {
        **(labels or {}),
        "method": method,
        "source": source,
        "split": split,
        "perplexity": result["ppl"],
        "nll": result["nll"],
        "tokens": result["tokens"],
        "window_nll": result["window_nll"],
        "window_tokens": result["window_tokens"],
        "distant_kept": kept,
        "context_length": context_length,
        "stride": stride or context_length,
        "seconds": round(time.perf_counter() - tic, 2),
        "provenance": provenance(),
    }
    record.update(_method_record(method, trained, focus_changes))
    write_json(output, record)
    return record


def evaluate_benchmarks(
    source: str,
    dtype: str,
    method: str,
    tasks: list[str],
    chat_tasks: list[str],
    output: str | Path,
    samples: str | Path,
    limit: int | None = None,
    batch_size: int = 8,
    trained: str | Path | None = None,
    mirror: str | None = None,
    labels: dict[str, str] | None = None,
    focus_changes: dict[str, Any] | None = None,
) -> dict:
    """lm-eval scores of one (model, method): `tasks` as plain completions, `chat_tasks` with the chat template
    (as plain completions for a base model whose tokenizer has none; each task's record says which).

    Writes the record (per-task metrics, the settings, the method's Focus/LoRA config) to `output` and
    lm-eval's per-document logs to `samples`/<task>.jsonl. See `focus.eval.harness` for the task and prompt choices.
    `focus_changes` as for `evaluate_perplexity`.
    """
    model, tokenizer = load_method(source, dtype, method, trained, focus_changes)
    tic = time.perf_counter()
    results: dict[str, dict] = {}
    logs: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as task_folder:
        write_mirror_tasks(task_folder, mirror)
        has_template = getattr(tokenizer, "chat_template", None) is not None
        for names, chat in ((tasks, False), (chat_tasks, has_template)):
            if names:
                metrics, documents = run_tasks(model, tokenizer, names, task_folder, limit, batch_size, chat_template=chat)
                results.update({task: {**values, "chat_template": chat} for task, values in metrics.items()})
                logs.update(documents)
    write_folder_atomically(Path(samples), lambda folder: write_samples(folder, logs))
    record = {
        **(labels or {}),
        "method": method,
        "source": source,
        "tasks": results,
        "limit": limit,
        "num_fewshot": 0,
        "seconds": round(time.perf_counter() - tic, 1),
        "provenance": provenance(),
        **_method_record(method, trained, focus_changes),
    }
    write_json(output, record)
    return record


def evaluate_needle(
    source: str,
    dtype: str,
    method: str,
    tokens: str | Path,
    output: str | Path,
    lengths: list[int],
    depths: list[float],
    trials: int,
    trained: str | Path | None = None,
    labels: dict[str, str] | None = None,
    progress: bool = True,
    focus_changes: dict[str, Any] | None = None,
) -> dict:
    """Pass-key retrieval (`focus.eval.needle`) of one (model, method), filler from the test split of `tokens`;
    `focus_changes` as for `evaluate_perplexity`."""
    model, tokenizer = load_method(source, dtype, method, trained, focus_changes)
    tic = time.perf_counter()
    trials_run = needle_trials(model, tokenizer, read_tokens(tokens, "test"), lengths, depths, trials, progress=progress)
    record = {
        **(labels or {}),
        "method": method,
        "source": source,
        "accuracy": sum(trial["correct"] for trial in trials_run) / len(trials_run),
        "trials": trials_run,
        "seconds": round(time.perf_counter() - tic, 1),
        "provenance": provenance(),
        **_method_record(method, trained, focus_changes),
    }
    write_json(output, record)
    return record


def evaluate_ruler(
    source: str,
    dtype: str,
    method: str,
    output: str | Path,
    samples: str | Path,
    tasks: list[str],
    lengths: list[int],
    limit: int | None,
    trained: str | Path | None = None,
    labels: dict[str, str] | None = None,
    focus_changes: dict[str, Any] | None = None,
) -> dict:
    """RULER (`focus.eval.ruler`) of one (model, method): `limit` documents per task and prompt length;
    `focus_changes` as for `evaluate_perplexity`."""
    model, tokenizer = load_method(source, dtype, method, trained, focus_changes)
    tic = time.perf_counter()
    scores, logs = run_ruler(model, tokenizer, tasks, lengths, limit)
    write_folder_atomically(Path(samples), lambda folder: write_samples(folder, logs))
    record = {
        **(labels or {}),
        "method": method,
        "source": source,
        "tasks": scores,
        "lengths": lengths,
        "limit": limit,
        "seconds": round(time.perf_counter() - tic, 1),
        "provenance": provenance(),
        **_method_record(method, trained, focus_changes),
    }
    write_json(output, record)
    return record


def load_method(
    source: str, dtype: str, method: str, trained: str | Path | None = None, focus_changes: dict[str, Any] | None = None
) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) as evaluated under `method`.

    "pretrained": `source` as is; "full_finetune": the fine-tuned model folder `trained`; "<variant>-soft|hard":
    `source` with the Focus adapter `trained` in that routing mode and `focus_changes` (settings that need no
    training, `set_focus_mode`'s); a `lora_name`: `source` with the LoRA adapter `trained` merged into its weights;
    a `peer_name`: `source` with the peer's adapter `trained` (`build_peer`), hard.
    """
    variant = ("peer", "hard") if parse_peer_name(method) else method_variant(method)
    loaded_from = str(trained) if method == FULL_FINETUNE else source
    model, tokenizer = load_model(loaded_from, _DTYPES[dtype], inference_device())
    if variant is not None:
        load_focus(model, trained)
        set_focus_mode(model, variant[1], **(focus_changes or {}))
    elif parse_lora_name(method) is not None:
        model = load_lora(model, trained)
    return model, tokenizer


def _method_record(method: str, trained: str | Path | None, focus_changes: dict[str, Any] | None = None) -> dict:
    """What a result record says about the method's trained part: the Focus or LoRA config it ran with."""
    if method_variant(method) is not None or parse_peer_name(method) is not None:
        return {"focus_config": {**read_adapter_config(trained)["focus_config"], **(focus_changes or {})}}
    if parse_lora_name(method) is not None:
        config = json.loads((Path(trained) / "adapter_config.json").read_text())
        return {"lora_config": {key: config[key] for key in ("r", "lora_alpha", "target_modules", "lora_dropout")}}
    return {}
