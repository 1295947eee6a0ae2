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
from pathlib import Path
from typing import Any, Iterable

from focus.files import write_json, write_text
from focus.provenance import cpu_name, git_commit, package_versions
from focus.version import __version__

PROFILE = "FOCUS_PROFILE"
PROFILE_FILE = "FOCUS_PROFILE_FILE"
STAMP = "*Made at commit "
STAMPED = (".csv", ".md", ".png", ".svg", ".html")


def profile_hash(profile: dict[str, Any]) -> str:
    """12 hex digits of the resolved profile's SHA-256: two runs of the same settings share it."""
    text = json.dumps(profile, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def stamp_outputs(outputs: Iterable[str | Path]) -> dict[str, Any]:
    """Stamp the files a rule wrote (`outputs`, folders skipped): the provenance line atop each Markdown one that has
    none, and `<stem>.provenance.json` beside each table and figure (a table's CSV and Markdown share one).
    Returns the record."""
    files = [Path(path) for path in outputs if Path(path).is_file()]
    if not files:
        return {}
    commit = git_commit()
    profile = os.environ.get(PROFILE, "unknown")
    command = f"snakemake {files[0]} --configfile {os.environ.get(PROFILE_FILE, '<profile>')}"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    record = {"git_commit": commit, "profile": profile, "machine": {"cpu": cpu_name(), "arch": platform.machine(),
              "python": platform.python_version()}, "packages": package_versions(), "focus_version": __version__,
              "date": date, "command": command}
    line = (f"{STAMP}{commit[:12]}{'-dirty' if commit.endswith('-dirty') else ''} for profile {profile} on "
            f"{cpu_name()}, {date}; re-make: `{command}`.*")
    for path in files:
        if path.suffix == ".md" and not (text := path.read_text()).startswith(STAMP):
            write_text(path, f"{line}\n\n{text}")
    for sidecar in sorted({path.with_suffix(".provenance.json") for path in files if path.suffix in STAMPED}):
        write_json(sidecar, record)
    return record
