"""Weights & Biases mirroring of pipeline artifacts. The JSON/CSV files are the record; W&B shows them.

Runs are offline unless the user configured otherwise (WANDB_MODE, which the pipeline defaults to the profile's
mode, "offline"); offline runs land in `<directory>/wandb/offline-run-*` and upload later with `wandb sync`.
The tests read such a run file back (`tests/helpers/wandb_file.py`).
"""

from __future__ import annotations

import json
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


def log_training_run(target: WandbTarget, summary: dict, metrics: str | Path) -> dict:
    """One W&B run per training job: the metrics history, the summary as config, the final values as summary.

    Logged after training from `metrics.jsonl`, so a job resumed after a kill still gives one complete history.
    """
    run = open_run(_results_of(target.record), "/".join(target.labels.values()), group=target.group,
                   job_type="train", config={**summary, **target.labels}, project=target.settings["project"],
                   entity=target.settings.get("entity"))
    log_metrics_file(run, metrics)
    run.summary.update({f"final/{key}": value for key, value in summary["final"].items()})
    return _finish(run, target.record, {"labels": target.labels})


def log_report_run(
    record: str | Path, settings: dict[str, Any], group: str, tables: list[str], figures: list[str]
) -> dict:
    """Log every table (CSV -> `tables/<name>`) and figure (PNG -> `figures/<name>`) in one run.

    `record` (`<results>/wandb/report.json`) receives the run's id, mode, folder, run file and logged keys.
    """
    run = open_run(_results_of(record), "report", group=group, job_type="report", config={"profile": group},
                   project=settings["project"], entity=settings.get("entity"))
    keyed_tables = _keyed("tables", tables, _results_of(record))
    keyed_figures = _keyed("figures", figures, _results_of(record))
    log_tables(run, keyed_tables)
    log_images(run, keyed_figures)
    return _finish(run, record, {"tables": sorted(keyed_tables), "figures": sorted(keyed_figures)})


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


def log_metrics_file(run, path: str | Path) -> int:
    """Log every line of a `metrics.jsonl` (records with a "step" key) as history at its step; returns the count."""
    count = 0
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        step = record.pop("step")
        run.log(record, step=step)
        count += 1
    return count


def log_tables(run, tables: dict[str, str | Path]) -> None:
    """Log CSV files as W&B tables: {key: csv path}."""
    import pandas as pd
    import wandb

    run.log({key: wandb.Table(dataframe=pd.read_csv(path)) for key, path in tables.items()})


def log_images(run, images: dict[str, str | Path]) -> None:
    """Log image files (PNG) as W&B images: {key: path}."""
    import wandb

    run.log({key: wandb.Image(str(path)) for key, path in images.items()})


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
