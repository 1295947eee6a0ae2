"""Rule peer: one training-free selector of one model, saved as an adapter the evaluation rules load."""

from focus.pipeline.stages import build_peer
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
build_peer(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    focus=snakemake.params.focus,
    tokens=snakemake.input.tokens,
    seq_len=snakemake.params.seq_len,
    calibration_rows=snakemake.params.calibration_rows,
    adapter_dir=snakemake.output.adapter,
)
