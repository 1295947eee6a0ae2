"""The SLURM jobs an earlier Snakemake left behind in a results folder, so that a restarted one does not run them
twice.

snakemake-executor-plugin-slurm tracks its jobs by a name drawn anew for every run, so a Snakemake killed and
started again does not see the jobs it submitted before: it would submit a second copy of every job still queued
or running, and both would write the same outputs. The plugin does mark each job with the comment
`rule_<rule>[_wildcards_<values>]` and runs it in the workflow's folder, which is enough to find them. A job that
finishes writes its own Snakemake metadata (the jobs share the file system), so once they are gone the restarted
run submits only what they did not finish.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "RESIZING"}


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str
    comment: str  # rule_<rule>[_wildcards_<values>], as the plugin submits it


def earlier_jobs(workdir: str | Path) -> list[SlurmJob]:
    """Pipeline jobs queued or running in `workdir`, submitted by any Snakemake; [] where there is no SLURM."""
    if shutil.which("squeue") is None:
        return []
    answer = subprocess.run(["squeue", "--me", "--noheader", "--format=%i|%T|%Z|%k"],
                            capture_output=True, text=True, timeout=60, check=False)
    if answer.returncode != 0:
        return []  # no controller reachable: nothing of ours can be running
    folder = Path(workdir).resolve()
    jobs = []
    for line in answer.stdout.splitlines():
        job_id, state, job_dir, comment = line.split("|", 3)
        if state in _ACTIVE and comment.startswith("rule_") and Path(job_dir).resolve() == folder:
            jobs.append(SlurmJob(job_id, state, comment))
    return jobs


def wait_for_earlier_jobs(workdir: str | Path, report: Callable[[str], None] = print, poll_seconds: float = 10) -> None:
    """Return once no pipeline job of an earlier Snakemake is queued or running in `workdir` (at once if none is)."""
    jobs = earlier_jobs(workdir)
    if not jobs:
        return
    listed = ", ".join(f"{job.job_id} ({job.comment.removeprefix('rule_')}, {job.state.lower()})" for job in jobs)
    report(f"waiting for {len(jobs)} SLURM job(s) an earlier Snakemake left in this folder: {listed}; "
           f"what they finish is not run again (scancel them to have them submitted anew)")
    while jobs:
        time.sleep(poll_seconds)
        jobs = earlier_jobs(workdir)
    report("the earlier SLURM jobs have ended")
