"""What every training job shares: the token files, the training rows and the resumable training run."""

from __future__ import annotations

import logging
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from focus.config import to_dict
from focus.data import chunk_tokens
from focus.distributed import barrier, is_main_process, rank_and_world
from focus.files import write_json
from focus.models import load_model
from focus.pipeline.tracking import LiveTrainingRun, WandbTarget
from focus.provenance import provenance
from focus.train.checkpoint import CHECKPOINT_NAME, CheckpointError
from focus.train.config import TrainConfig
from focus.train.loop import METRICS_NAME, train_parameters
from focus.train.objective import focus_objective
from focus.train.retrieval import retrieval_rows

_log = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_tokens(path: str | Path, split: str) -> torch.Tensor:
    """The ids of `split` in a `prepare_tokens` file: LongTensor (T,)."""
    with safe_open(str(path), framework="pt") as f:
        if split not in f.keys():
            raise KeyError(f"{path} has no split {split!r} (it has {sorted(f.keys())}); list it in data.domains")
        return f.get_tensor(split).long()


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _load_for_training(source: str, dtype: str, world: int) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer), the model on this process's device; for `world` > 1 processes in host memory, where each
    process reads the whole weights once: sharding then moves only its shard to its GPU, so no GPU holds them all."""
    return load_model(source, _DTYPES[dtype], "cpu" if world > 1 else default_device())


DEFAULT_RETRIEVAL_SHARE = 0.25
"""A training job's share of synthetic retrieval rows when none is asked for and its rows hold them."""


@dataclass(frozen=True)
class TrainingJob:
    """What every training stage shares: the rows it trains on, how it trains, and where its records go.

    The train split of `tokens` (a `prepare_tokens` file) is cut into rows of `seq_len` tokens. The first
    `calibration_rows` initialise the Focus centroids by k-means and no method trains on them, so that every method
    trains on identical batches; then at most `train_rows` rows (None: all) are trained on. The first `eval_rows`
    rows of the validation split are scored during training. A `retrieval_share` of the trained rows (default a
    quarter; 0: none) are synthetic retrieval rows (`training_rows`), their answers weighed `retrieval_weight`
    in the loss: without them the hard model forgets how to retrieve (docs/study.md part 5). A `broad_share` of them
    are rows of a broad corpus (the train split of `broad_tokens`, another `prepare_tokens` file), spread evenly over
    it: text the model must not forget, which learns from the dense teacher where the objective has one
    (`training_rows`). `train` is how it trains; `metrics` (JSON lines) and `summary` (JSON) are the job's records,
    which `finish` mirrors to W&B where `wandb` says.
    """

    tokens: str | Path
    seq_len: int
    train: TrainConfig
    metrics: str | Path
    summary: str | Path
    calibration_rows: int = 8
    train_rows: int | None = None
    eval_rows: int = 0
    retrieval_share: float | None = None  # None: DEFAULT_RETRIEVAL_SHARE where the rows hold a retrieval row
    retrieval_weight: float = 5.0
    broad_tokens: str | Path | None = None
    broad_share: float = 0.0
    progress: bool = True
    wandb: WandbTarget | None = None
    # The share of retrieval rows `training_rows` made (the one asked for, or the default where the rows hold them).
    _retrieval_used: float | None = field(default=None, init=False, repr=False, compare=False)
    # The W&B run `run` opens and `finish` closes ({"run": LiveTrainingRun} on the main process while it trains).
    _tracking: dict[str, LiveTrainingRun] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_rule(cls, snakemake: Any, labels: dict[str, str] | None = None, **changes: Any) -> "TrainingJob":
        """The job of a training rule: `params.rows` (seq_len, the row counts and shares) and `params.train`, the
        tokens inputs (`tokens`, and `broad` where the profile mixes in a broad corpus), the metrics and summary
        outputs, and its W&B run (`output.wandb`, `params.wandb`, `params.group`) named by `labels` (default: the
        rule's wildcards).

        `params.train` is the TrainConfig the profile resolved, as a dict: Snakemake re-runs a job whose params
        changed only for params of builtin types (a dataclass would be "unrepresentable" and never compared).
        """
        wandb = WandbTarget(snakemake.output.wandb, snakemake.params.wandb, snakemake.params.group,
                            dict(snakemake.wildcards) if labels is None else labels)
        train = TrainConfig.from_dict(snakemake.params.train)
        return cls(**snakemake.params.rows, train=train, tokens=snakemake.input.tokens,
                   broad_tokens=getattr(snakemake.input, "broad", None), metrics=snakemake.output.metrics,
                   summary=snakemake.output.summary, wandb=wandb, **changes)

    def __post_init__(self) -> None:
        if not isinstance(self.train, TrainConfig):
            raise TypeError(f"TrainingJob.train must be a TrainConfig, got {type(self.train).__name__}")
        for name in ("retrieval_share", "broad_share"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        asked = DEFAULT_RETRIEVAL_SHARE if self.retrieval_share is None else self.retrieval_share
        if asked + self.broad_share >= 1:
            raise ValueError(f"retrieval_share {asked} + broad_share {self.broad_share} leave no room "
                             "for the domain's rows: their sum must be below 1")
        if self.broad_share and self.broad_tokens is None:
            raise ValueError(f"broad_share {self.broad_share} needs the broad corpus's tokens (broad_tokens)")

    def config(self, **changes: Any) -> TrainConfig:
        """The job's TrainConfig, with `changes` (e.g. a from-scratch run's seed)."""
        return self.train.replace(**changes) if changes else self.train

    def rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(calibration rows, training rows, evaluation rows or None), each (N, seq_len) ids."""
        rows = chunk_tokens(read_tokens(self.tokens, "train"), self.seq_len)
        if rows.shape[0] <= self.calibration_rows:
            raise ValueError(f"{self.tokens}: {rows.shape[0]} train rows of {self.seq_len} tokens leave none after "
                             f"{self.calibration_rows} calibration rows")
        eval_data = None
        if self.eval_rows:
            eval_data = chunk_tokens(read_tokens(self.tokens, "validation"), self.seq_len)[: self.eval_rows]
        trained = rows[self.calibration_rows :]
        return rows[: self.calibration_rows], trained[: self.train_rows] if self.train_rows else trained, eval_data

    def training_rows(
        self, rows: torch.Tensor, tokenizer, window: int | None, teacher: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor] | None]:
        """(the trained rows, their next-token weights or None, {"distill": the teacher's weights} or None).

        The rows are `rows` (the domain's), then `broad_share` of the result from the broad corpus, then
        `retrieval_share` synthetic retrieval rows (`focus.train.retrieval`) cut from the domain's train split with
        answers beyond the Focus `window` (a baseline passes the window of the Focus run it is compared with, so
        that both train on the same rows). With `teacher` (the objective has the dense teacher's term, `distill`)
        the broad rows learn from the teacher alone: its KL weighs them, the next-token loss does not; without,
        every row learns from the next-token loss.
        """
        share = self._retrieval_share(tokenizer, window)
        object.__setattr__(self, "_retrieval_used", share)  # what the summary records
        total = rows.shape[0] / (1 - share - self.broad_share)
        parts, weights = [rows], [torch.ones(rows.shape)]
        broad = torch.zeros(0, rows.shape[1], dtype=rows.dtype)
        if self.broad_share:
            broad = self._broad_rows(round(total * self.broad_share)).to(rows.dtype)
            parts.append(broad)
            weights.append(torch.zeros(broad.shape) if teacher else torch.ones(broad.shape))
        if share:
            count = max(1, round(total * share))
            extra, answer_weights = retrieval_rows(tokenizer, read_tokens(self.tokens, "train").long(), count,
                                                   self.seq_len, window, answer_weight=self.retrieval_weight)
            parts.append(extra.to(rows.dtype))
            weights.append(answer_weights)
        ids, token_weights = torch.cat(parts), torch.cat(weights)
        term_weights = None
        if teacher and broad.shape[0]:
            start = rows.shape[0]
            term_weights = {"distill": torch.zeros(ids.shape)}
            term_weights["distill"][start : start + broad.shape[0]] = 1.0
        return ids, None if bool((token_weights == 1).all()) else token_weights, term_weights

    def _retrieval_share(self, tokenizer, window: int | None) -> float:
        """The share of retrieval rows to train on: the one asked for, or by default DEFAULT_RETRIEVAL_SHARE where a
        row of `seq_len` holds a fact beyond the `window` (else none, with a warning: short rows are no mistake)."""
        if self.retrieval_share == 0:
            return 0.0
        if window is None:  # a baseline must be told the Focus run's window, so that both train on the same rows
            raise ValueError("retrieval rows need the Focus window their answers lie beyond (or retrieval_share 0)")
        if self.retrieval_share is not None:
            return self.retrieval_share
        try:
            retrieval_rows(tokenizer, read_tokens(self.tokens, "train").long()[: 4 * self.seq_len], 1, self.seq_len,
                           window)
        except ValueError as err:
            if "no room for a fact" not in str(err):
                raise
            warnings.warn(f"training without retrieval rows: rows of {self.seq_len} tokens have no room for a fact "
                          f"{window} tokens before its question (set retrieval_share to ask for them)", stacklevel=2)
            return 0.0
        return DEFAULT_RETRIEVAL_SHARE

    def _broad_rows(self, count: int) -> torch.Tensor:
        """`count` rows of `seq_len` tokens of the broad corpus's train split, spread evenly over it (every book)."""
        rows = chunk_tokens(read_tokens(self.broad_tokens, "train"), self.seq_len)
        if count > rows.shape[0]:
            raise ValueError(f"{self.broad_tokens}: broad_share {self.broad_share} asks for {count} rows of "
                             f"{self.seq_len} tokens, its train split has {rows.shape[0]}")
        return rows[torch.linspace(0, rows.shape[0] - 1, count).round().long()]

    @property
    def run_dir(self) -> Path:
        """Where the job checkpoints: beside its outputs, undeclared, so a killed job's state survives."""
        return Path(self.metrics).parent / "run"

    def run(self, model: torch.nn.Module, rows: torch.Tensor, eval_data: torch.Tensor | None,
            config: TrainConfig | None = None, token_weights: torch.Tensor | None = None,
            term_weights: dict[str, torch.Tensor] | None = None) -> dict:
        """`train_parameters` (with the job's TrainConfig unless `config` is given) in `run_dir`, then copy its
        metrics to the job's `metrics`.

        A checkpoint left there by a killed job is resumed; one written for other settings or data (the pipeline
        re-runs a job when its parameters change) is discarded with a warning, and training starts over.
        """
        config = config or self.config()
        objective = focus_objective(model)  # the next-token loss for LoRA and scratch models
        resumed = (self.run_dir / CHECKPOINT_NAME).exists()
        if self.wandb is not None and is_main_process():
            self._tracking["run"] = LiveTrainingRun(
                self.wandb, self.run_dir / METRICS_NAME,
                {"train_config": to_dict(config), "seq_len": self.seq_len, "train_rows": rows.shape[0]},
                inputs=[path for path in (self.tokens, self.broad_tokens) if path is not None])
        on_log = self._tracking.get("run")
        tic = time.perf_counter()
        try:
            final = train_parameters(model, rows, config, self.run_dir, eval_data=eval_data, objective=objective,
                                     progress=self.progress, on_log=on_log, token_weights=token_weights,
                                     term_weights=term_weights)
        except CheckpointError as err:
            _log.warning("discarding the checkpoint in %s (%s); training from step 0", self.run_dir, err)
            barrier()  # every process has read (and refused) the checkpoint before it goes
            if is_main_process():
                shutil.rmtree(self.run_dir)
            barrier()
            resumed = False
            final = train_parameters(model, rows, config, self.run_dir, eval_data=eval_data, objective=objective,
                                     progress=self.progress, on_log=on_log, token_weights=token_weights,
                                     term_weights=term_weights)
        seconds = time.perf_counter() - tic
        used = self.retrieval_share if self._retrieval_used is None else self._retrieval_used
        if is_main_process():
            Path(self.metrics).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.run_dir / METRICS_NAME, self.metrics)
        return {
            "final": final,
            "train_config": to_dict(config),
            "train_rows": rows.shape[0],  # retrieval rows included
            "retrieval": {"share": used, "weight": self.retrieval_weight} if used else None,
            "broad": {"tokens": str(self.broad_tokens), "share": self.broad_share,
                      "teacher": term_weights is not None} if self.broad_share else None,
            "seq_len": rows.shape[1],
            # (the loop's time counts a killed run's steps up to its checkpoint; a final record older than that: ours)
            "seconds": final.get("time/train_seconds", round(seconds, 1)),
            "resumed": resumed,
            "processes": rank_and_world()[1],
        }

    def finish(self, source: str, record: dict, weights: str | Path | None = None,
               kind: str = "focus-adapter") -> dict:
        """Write the training summary, remove the run folder (its checkpoint has served its purpose), and finish the
        job's W&B run with the summary and `weights` (the folder it trained: an adapter, or a model of `kind`)."""
        record.update(source=source, provenance=provenance())
        if is_main_process():
            write_json(self.summary, record)
            shutil.rmtree(self.run_dir, ignore_errors=True)
            if "run" in self._tracking:
                self._tracking.pop("run").finish(record, self.metrics, weights, kind)
        barrier()
        return record
