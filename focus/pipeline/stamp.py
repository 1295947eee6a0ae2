"""Every table and figure a pipeline rule writes says where it came from (issue 55): the commit, the profile and its
hash, the machine, the packages, the date and the command that re-makes it.

A table rule's job stamps its outputs when it ends well (`start_job(..., stamp=snakemake.output)` calls
`stamp_outputs`): each Markdown table gets the provenance line at its top (as `focus.provenance.provenance_line`
writes it for the benchmarks), and each table and figure a `<stem>.provenance.json` beside it, which the W&B report
logs with the table. The Snakefile names the profile
(`PROFILE`: name@hash of the resolved profile, `PROFILE_FILE`: the file it came from) in the environment of its jobs.
Torch-free: the table jobs start in a fraction of a second.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterable

from focus.files import write_json, write_text
from focus.provenance import cpu_flags, cpu_name, git_commit, package_versions, short_commit
from focus.version import __version__

PROFILE = "FOCUS_PROFILE"
PROFILE_FILE = "FOCUS_PROFILE_FILE"
STAMP = "*Made at commit "
STAMPED = (".csv", ".md", ".png", ".svg", ".html")


def profile_hash(profile: dict[str, Any]) -> str:
    """12 hex digits of the resolved profile's SHA-256: two runs of the same settings share it. The `snapshot`
    section is left out: it chooses what is copied, not what is made."""
    text = json.dumps({key: value for key, value in profile.items() if key != "snapshot"}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def stamp_outputs(outputs: Iterable[str | Path], rule: str | None = None) -> dict[str, Any]:
    """Stamp the files `rule` wrote (`outputs`, folders skipped): the provenance line atop each Markdown one that has
    none or only the plain line a script writes (`focus.provenance.provenance_line`: no rule, no profile), and
    `<stem>.provenance.json` beside each table and figure (a table's CSV and Markdown share one). Returns the
    record."""
    files = [Path(path) for path in outputs if Path(path).is_file()]
    if not files:
        return {}
    commit = git_commit()
    profile = os.environ.get(PROFILE, "unknown")
    command = f"snakemake {files[0]} --configfile {os.environ.get(PROFILE_FILE, '<profile>')}"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    machine = {"cpu": cpu_name(), "cpu_flags": cpu_flags(), "gpu": _gpu_name(), "arch": platform.machine(),
               "python": platform.python_version()}
    record = {"git_commit": commit, "rule": rule, "profile": profile, "machine": machine,
              "packages": package_versions(), "focus_version": __version__, "date": date, "command": command}
    made_by = f" by rule `{rule}`" if rule else ""
    line = (f"{STAMP}{short_commit(commit)}{made_by} for profile {profile} on "
            f"{machine['gpu'] or machine['cpu']}, {date}; re-make: `{command}`.*")
    for path in files:
        if path.suffix != ".md":
            continue
        text = path.read_text()
        first, _, rest = text.partition("\n")
        if not text.startswith(STAMP):
            write_text(path, f"{line}\n\n{text}")
        elif rule and " by rule `" not in first:  # (a script's line, written before the rule could name itself)
            write_text(path, f"{line}\n{rest}")
    for sidecar in sorted({path.with_suffix(".provenance.json") for path in files if path.suffix in STAMPED}):
        write_json(sidecar, record)
    return record


def _gpu_name() -> str | None:
    """The GPU the job computed on, if it imported torch and has one (a job that only reads records has none)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device())


def write_provenance_table(artifacts: Iterable[str | Path], results: str | Path, csv: str | Path) -> None:
    """One row per table, figure and page of a profile (`artifacts`, under `results`): the rule, commit, profile,
    machine and date its stamp records and the command that re-makes it; Markdown beside the CSV. An artifact with no
    stamp says so in its row (the snapshot refuses it): the HTML report's Provenance section shows where each came
    from."""
    import pandas as pd  # (here, not at the top: the stamp itself stays light)

    from focus.artifacts import markdown_table

    rows = []
    for path in map(Path, artifacts):
        sidecar = path.with_suffix(".provenance.json")
        stamp = json.loads(sidecar.read_text()) if sidecar.is_file() else None
        name = str(path.relative_to(results)) if path.is_relative_to(results) else str(path)
        if stamp is None:
            rows.append({"artifact": name, "rule": "not stamped"})
            continue
        machine = stamp.get("machine", {})
        flags = ", ".join(machine.get("cpu_flags") or [])
        rows.append({"artifact": name, "rule": stamp.get("rule") or "", "commit": stamp["git_commit"][:12],
                     "profile": stamp["profile"], "machine": machine.get("gpu") or machine.get("cpu", ""),
                     "cpu_flags": flags, "date": stamp["date"], "re-make": stamp["command"]})
    frame = pd.DataFrame(rows, columns=["artifact", "rule", "commit", "profile", "machine", "cpu_flags", "date",
                                        "re-make"])
    csv = Path(csv)
    write_text(csv, frame.to_csv(index=False))
    write_text(csv.with_suffix(".md"), markdown_table(frame, ".3g") + "\n")
