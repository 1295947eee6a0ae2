# Focus replication pipeline. Default profile: configs/tiny.yaml (CPU, offline, minutes).
#   snakemake --cores all                                  # tiny profile
#   snakemake --configfile configs/paper.yaml --workflow-profile profiles/slurm   # the paper's grid on SLURM
#   snakemake --report results/tiny/report.html            # HTML report of the tables and figures
# No --configfile: the tiny profile, wherever --directory points. An empty one is a mistake, not a request for it.
if not config and not workflow.config_settings.configfiles:

    configfile: f"{workflow.basedir}/configs/tiny.yaml"

elif not config:
    raise SystemExit(f"config error: {', '.join(map(str, workflow.config_settings.configfiles))} is empty")


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/scratch.smk"
include: "workflow/rules/interpret.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/recall.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        final_targets(),
    default_target: True
