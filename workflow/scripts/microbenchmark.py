"""Rule microbenchmark: one script of benchmarks/ run as its command line runs it, its outputs stamped."""

import runpy
import shlex
import sys
from pathlib import Path

from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
inputs = dict(snakemake.input.items())
sys.argv = [snakemake.params.script, "--out", str(Path(snakemake.output.csv).parent),
            *shlex.split(snakemake.params.args), *(["--adapter", inputs["adapter"]] if "adapter" in inputs else []),
            *(["--tokens", inputs["tokens"]] if "tokens" in inputs else [])]
print("benchmarks:", shlex.join(sys.argv), flush=True)
runpy.run_path(snakemake.params.script, run_name="__main__")
