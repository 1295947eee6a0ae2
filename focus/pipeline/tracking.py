"""Weights & Biases mirroring of pipeline artifacts. The JSON/CSV files are the record; W&B shows them.

Runs are offline unless the user configured otherwise (WANDB_MODE, which the pipeline defaults to the profile's
mode, "offline"); offline runs land in `<directory>/wandb/offline-run-*` and upload later with `wandb sync`.
The tests read such a run file back (`tests/helpers/wandb_file.py`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from focus.files import write_json


def open_run(
    directory: str | Path,
    name: str,
    group: str,
    job_type: str,
    config: dict[str, Any],
    project: str = "focus",
    entity: str | None = None,
):
    """Start a W&B run whose files go under `directory/wandb/`. Mode and credentials come from wandb's own
    settings (WANDB_MODE, `wandb login`). Returns the run; call `run.finish()` when done."""
    import wandb  # deferred: a second of import time that only logging jobs pay

    Path(directory).mkdir(parents=True, exist_ok=True)
    return wandb.init(
        dir=str(directory),
        project=project,
        entity=entity,
        name=name,
        group=group,
        job_type=job_type,
        config=config,
        settings=wandb.Settings(console="off", x_disable_stats=True),
    )


@dataclass(frozen=True)
class WandbTarget:
    """Where one job's W&B run goes: `record` (`<results>/wandb/<...>.json`) receives where the run went, the run
    files go under `<results>/wandb/`; `settings` holds the profile's project and entity, `labels` name the run."""

    record: str | Path
    settings: dict[str, Any]
    group: str
    labels: dict[str, str]


class LiveTrainingRun:
    """One training job's W&B run, open while it trains: each `metrics.jsonl` record is logged as it is written (a
    live curve on a cluster), and `finish` adds the summary and the trained weights as an Artifact.

    A job resumed after a kill opens a new run whose first record first replays the lines its killed predecessor
    logged (the checkpoint's metrics, `metrics.jsonl` truncated to it), so each finished run holds one complete
    history; the killed run stays behind as W&B shows any crashed run.
    """

    def __init__(self, target: WandbTarget, metrics: str | Path, config: dict[str, Any], inputs: list[str | Path] = ()):
        self.target, self.metrics = target, Path(metrics)
        self.inputs = [str(Path(path).absolute()) for path in inputs]
        self.run = open_run(_results_of(target.record), "/".join(target.labels.values()), group=target.group,
                            job_type="train", config={**config, "inputs": self.inputs, **target.labels},
                            project=target.settings["project"], entity=target.settings.get("entity"))
        if self.run.settings.mode == "online":  # W&B refuses use_artifact offline: there the config names the inputs
            _use_files(self.run, self.inputs)
        self.logged_step: int | None = None  # the last step logged; None before the first

    def __call__(self, record: dict[str, Any]) -> None:
        """The training loop's `on_log`: called with each record right after `metrics` received it."""
        if self.logged_step is None:
            self._replay(before=record["step"])
        self._log(record)

    def finish(self, summary: dict, metrics: str | Path, weights: str | Path | None = None,
               kind: str = "focus-adapter") -> dict:
        """Log what `metrics` (the job's copy of the file it trained with) holds beyond the live records (all of it
        when none came: a job resumed at its end), the summary, and `weights` (a folder) as an Artifact of `kind`
        named after the profile and the job (`<group>-<model>-<variant>`); finish the run and write its JSON record."""
        self.metrics = Path(metrics)
        self._replay(before=None)
        self.run.config.update(summary, allow_val_change=True)
        self.run.summary.update({f"final/{key}": value for key, value in summary["final"].items()})
        fields: dict[str, Any] = {"labels": self.target.labels}
        if weights is not None:
            metadata = {**_artifact_metadata(summary), "inputs": self.inputs}
            name = artifact_name("-".join([self.target.group, *self.target.labels.values()]))
            fields["artifact"] = log_folder_artifact(self.run, name, kind, weights, metadata=metadata)
        return _finish(self.run, self.target.record, fields)

    def _replay(self, before: int | None) -> None:
        for line in self.metrics.read_text().splitlines() if self.metrics.exists() else []:
            record = json.loads(line)
            after_logged = self.logged_step is None or record["step"] > self.logged_step
            if after_logged and (before is None or record["step"] < before):
                self._log(record)

    def _log(self, record: dict[str, Any]) -> None:
        record = dict(record)
        self.logged_step = record.pop("step")
        self.run.log(record, step=self.logged_step, commit=True)  # shown now, not when the next step comes


def log_folder_artifact(run, name: str, kind: str, folder: str | Path, metadata: dict | None = None,
                        upload_below: int = 64 * 2**20) -> dict:
    """Log `folder` as a W&B Artifact: its files when they total under `upload_below` bytes (an adapter), a
    reference to the folder otherwise (a fully fine-tuned model: W&B records its checksums, copies nothing).
    Returns {"name", "type", "digest"} of the logged artifact."""
    import wandb

    folder = Path(folder).absolute()
    artifact = wandb.Artifact(name, type=kind, metadata=metadata or {})
    if sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) < upload_below:
        artifact.add_dir(str(folder))
    else:
        artifact.add_reference(folder.as_uri())
    run.log_artifact(artifact)
    return {"name": name, "type": kind, "digest": artifact.digest}


def _use_files(run, paths: list[str]) -> None:
    """Declare files the run read as its input Artifacts (type "dataset", references: W&B copies nothing)."""
    import wandb

    for path in paths:
        artifact = wandb.Artifact(artifact_name(f"data-{Path(path).name}"), type="dataset")
        artifact.add_reference(Path(path).as_uri())
        run.use_artifact(artifact)


def artifact_name(text: str) -> str:
    """`text` as a W&B Artifact name (letters, digits, "-", "_" and "." only)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def _artifact_metadata(summary: dict) -> dict:
    """What a reader of a trained artifact wants without its run: the source model, what trained, on what."""
    keys = ("source", "focus_config", "train_config", "train_rows", "seq_len", "broad", "retrieval")
    return {key: summary[key] for key in keys if summary.get(key) is not None}


def log_report_run(
    record: str | Path,
    settings: dict[str, Any],
    group: str,
    tables: list[str],
    figures: list[str],
    pages: list[str] = (),
    trained: list[str] = (),
) -> dict:
    """Log every table (CSV -> `tables/<name>`), figure (PNG -> `figures/<name>`) and page (HTML -> `pages/<name>`)
    in one run, and the tables as one Artifact (`tables-<group>`, type "results") downstream of the trained weights,
    each with its provenance (`<table>.provenance.json` beside it, `focus.pipeline.stamp`) as a file and metadata.

    `trained` are the training jobs' W&B records (`LiveTrainingRun.finish`): where W&B is online the run uses their
    artifacts, so W&B draws the lineage data -> weights -> tables; offline (W&B refuses `use_artifact` there) the
    tables artifact lists them in its metadata. `record` (`<results>/wandb/report.json`) receives the run's id, mode,
    folder, run file, logged keys (each with its file) and the artifact.
    """
    results = _results_of(record)
    run = open_run(results, "report", group=group, job_type="report", config={"profile": group},
                   project=settings["project"], entity=settings.get("entity"))
    keyed = {kind: _keyed(kind, paths, results) for kind, paths in
             (("tables", tables), ("figures", figures), ("pages", pages))}
    log_tables(run, keyed["tables"])
    log_images(run, keyed["figures"])
    log_pages(run, keyed["pages"])
    upstream = [json.loads(Path(path).read_text()).get("artifact") for path in trained]
    upstream = [artifact for artifact in upstream if artifact]
    if run.settings.mode == "online":
        for artifact in upstream:
            run.use_artifact(f"{artifact['name']}:latest", type=artifact["type"])
    # Each table's provenance (focus.pipeline.stamp) travels with it: a file of the artifact and its metadata.
    sidecars = {f"{key}.provenance": Path(path).with_suffix(".provenance.json")
                for key, path in keyed["tables"].items()}
    sidecars = {key: path for key, path in sidecars.items() if path.is_file()}
    provenance = {key.removesuffix(".provenance"): json.loads(path.read_text()) for key, path in sidecars.items()}
    artifact = _log_files_artifact(run, artifact_name(f"tables-{group}"), "results", {**keyed["tables"], **sidecars},
                                   metadata={"profile": group, "trained": upstream, "provenance": provenance})
    fields = {kind: {key: _relative(path, results) for key, path in sorted(paths.items())}
              for kind, paths in keyed.items()}
    return _finish(run, record, {**fields, "artifact": artifact})


def _log_files_artifact(run, name: str, kind: str, files: dict[str, str | Path], metadata: dict) -> dict:
    import wandb

    artifact = wandb.Artifact(name, type=kind, metadata=metadata)
    for key, path in files.items():
        artifact.add_file(str(path), name=f"{key}{Path(path).suffix}")
    run.log_artifact(artifact)
    return {"name": name, "type": kind, "digest": artifact.digest}


def _relative(path: str | Path, results: Path) -> str:
    return Path(path).absolute().relative_to(results).as_posix()


def _keyed(prefix: str, paths: list[str], results: Path) -> dict[str, str]:
    """{"<prefix>/<file stem>": path}; a stem that several files share (one per model, as in
    interpret/<model>/<variant>/) is keyed by its path under `results` instead, so no file overwrites another."""
    stems = [Path(path).stem for path in paths]
    keyed = {}
    for path, stem in zip(paths, stems):
        if stems.count(stem) > 1:
            stem = Path(path).absolute().relative_to(results).with_suffix("").as_posix()
        keyed[f"{prefix}/{stem}"] = path
    return keyed


def log_tables(run, tables: dict[str, str | Path]) -> None:
    """Log CSV files as W&B tables: {key: csv path}."""
    import pandas as pd
    import wandb

    run.log({key: wandb.Table(dataframe=pd.read_csv(path)) for key, path in tables.items()})


def log_images(run, images: dict[str, str | Path]) -> None:
    """Log image files (PNG) as W&B images: {key: path}."""
    import wandb

    run.log({key: wandb.Image(str(path)) for key, path in images.items()})


def log_pages(run, pages: dict[str, str | Path]) -> None:
    """Log HTML files as W&B HTML panels: {key: path}."""
    import wandb

    if pages:
        run.log({key: wandb.Html(Path(path).read_text(encoding="utf-8")) for key, path in pages.items()})


def _results_of(record: str | Path) -> Path:
    """`<results>` of a record path `<results>/wandb/...`: wandb.init(dir=<results>) writes to <results>/wandb/."""
    record = Path(record).absolute()
    for parent in record.parents:
        if parent.name == "wandb":
            return parent.parent
    raise ValueError(f"W&B record {record} is not inside a 'wandb' folder")


def _finish(run, record: str | Path, fields: dict) -> dict:
    """Finish `run` and write the JSON `record` of it (id, mode, folder, offline run file) plus `fields`."""
    folder = Path(run.dir).parent  # run.dir is <run folder>/files
    mode = run.settings.mode
    run.finish()
    found = run_file_in(folder)
    entry = {"id": run.id, "mode": mode, "folder": str(folder), "run_file": str(found) if found else None, **fields}
    write_json(record, entry)
    return entry


def run_file_in(folder: Path) -> Path | None:
    """The `run-<id>.wandb` file in a run folder (None where wandb wrote none: disabled mode)."""
    found = sorted(folder.glob("run-*.wandb"))
    return found[0] if found else None
