# Focus replication pipeline. Default profile: configs/tiny.yaml (CPU, offline, minutes).
#   snakemake --cores all                                  # tiny profile
#   snakemake --configfile configs/paper.yaml --workflow-profile profiles/slurm   # the paper's grid on SLURM
#   snakemake --report results/tiny/report.html            # HTML report of the tables and figures
if not config:  # no --configfile: the tiny profile, wherever --directory points

    configfile: f"{workflow.basedir}/configs/tiny.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/scratch.smk"
include: "workflow/rules/interpret.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        final_targets(),
    default_target: True
