"""Rule claims: the paper's claims against this profile's results."""

from focus.pipeline.start import start_job
from focus.report.claims import write_claims

start_job(snakemake.log[0], 1, stamp=snakemake.output, rule=snakemake.rule)
inputs = dict(snakemake.input.items())
extras = {name: inputs.pop(name) for name in ("scratch", "interpret") if name in inputs}
write_claims(
    tables={name: path for name, path in inputs.items() if str(path).endswith(".csv")},
    extras=extras,
    main_model=snakemake.params.main_model,
    train_domain=snakemake.params.train_domain,
    csv=snakemake.output.csv,
)
