"""The committed results are a snapshot of rule outputs (issue 55): `snakemake snapshot --configfile <profile>` copies
the profile's tables and figures, each with the files of its stem (a table's Markdown beside its CSV, a figure's SVG,
the provenance sidecar), from `results/<profile>/` into `benchmarks/results/<profile>/`, where README and docs cite
them. The folder is replaced whole, so it holds exactly what the rules made: nothing hand-assembled, nothing stale.
Torch-free.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterable

from focus.files import write_json
from focus.pipeline.stamp import STAMP

SIBLINGS = (".csv", ".md", ".png", ".svg", ".html", ".provenance.json")


def snapshot_inputs(made: Iterable[str], results: str, interpret: bool = True) -> list[str]:
    """What of `made` (a profile's tables, figures and pages, under `results`) its snapshot copies: everything, or,
    with `interpret` False (the profile's `snapshot.interpret`), all but the group pages under `results`/interpret/
    (megabytes per design, which the docs do not cite: the study's nine were 28 MB)."""
    pages = f"{results}/interpret/"
    return [str(path) for path in made if interpret or not str(path).startswith(pages)]


class SnapshotError(ValueError):
    """A result that cannot join a snapshot (unmade, or without its provenance): nothing is copied."""


def snapshot_files(results: Path, made: Iterable[str | Path]) -> dict[Path, Path]:
    """What a snapshot of `made` (files under `results`, a profile's results folder) copies: each file and its
    siblings of the same stem, by their paths relative to `results`. Refuses a file not under `results`, a missing one,
    a table or figure without its provenance sidecar, or a Markdown table without its provenance line."""
    results = Path(results).resolve()
    copies: dict[Path, Path] = {}
    for path in (Path(p).resolve() for p in made):
        if results not in path.parents:
            raise SnapshotError(f"{path} is not under the profile's results folder {results}")
        if not path.is_file():
            raise SnapshotError(f"{path} was not made: run its rule first")
        stem = path.with_suffix("")
        if not stem.with_suffix(".provenance.json").is_file():
            raise SnapshotError(f"{path} has no provenance ({stem.name}.provenance.json): re-make it with its rule")
        for sibling in (stem.with_name(stem.name + suffix) for suffix in SIBLINGS):
            if sibling.is_file():
                copies[sibling] = sibling.relative_to(results)
    unstamped = [str(path) for path in copies if path.suffix == ".md" and not path.read_text().startswith(STAMP)]
    if unstamped:
        raise SnapshotError(f"Markdown tables without their provenance line: {', '.join(unstamped)}")
    return copies


def snapshot_results(results: str | Path, made: Iterable[str | Path], folder: str | Path,
                     record: str | Path | None = None) -> list[Path]:
    """Replace `folder` with the snapshot of `made` (`snapshot_files`): written beside it first, then swapped in, so
    a refused or interrupted snapshot leaves the previous one whole; `record` (JSON) lists what it holds. Returns the
    files written."""
    copies = snapshot_files(Path(results), made)
    folder = Path(folder)
    staging = folder.with_name(f".{folder.name}.snapshot")
    shutil.rmtree(staging, ignore_errors=True)
    for source, relative in sorted(copies.items()):
        (staging / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, staging / relative)
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    written = sorted(folder / relative for relative in copies.values())
    if record is not None:
        write_json(Path(record), {"folder": str(folder), "files": [str(path) for path in written]})
    return written
