"""Rule notebook: execute the results notebook headless against this profile's results folder."""

import papermill

from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
papermill.execute_notebook(
    snakemake.input.notebook,
    snakemake.output[0],
    parameters={"results_dir": snakemake.params.results},
    kernel_name="python3",
    progress_bar=False,
)
