# From-scratch comparison (profile section `scratch`): a small Llama-style model trained from random initialisation
# with full attention and with Focus, per seed, on the same tokens; then one table, one figure, one summary.
# SCRATCH, scratch_runs and scratch_tokens are in common.smk.
SCRATCH_RUN = f"{R}/scratch/{{scratch_method}}/seed{{seed}}"


rule scratch_tokens:
    """Token ids of the scratch corpus by the scratch tokenizer (the tokenize stage, with no model of the profile)."""
    conda:
        ENVIRONMENT
    output:
        f"{R}/scratch/data/{{domain}}.safetensors",
    log:
        f"{R}/logs/scratch_tokens/{{domain}}.log",
    params:
        source=SCRATCH.get("tokenizer"),
        splits=domain_splits,
        mirror=P["data"].get("mirror"),
    script:
        "../scripts/tokenize.py"


rule train_scratch:
    """One (method, seed) from random initialisation: full attention, or Focus with every weight and the centroids
    trained (soft routing); resumes from run/checkpoint.pt when a killed job re-runs."""
    conda:
        ENVIRONMENT
    input:
        tokens=scratch_tokens,
    output:
        metrics=f"{SCRATCH_RUN}/metrics.jsonl",
        summary=f"{SCRATCH_RUN}/summary.json",
        wandb=f"{R}/wandb/scratch/{{scratch_method}}/seed{{seed}}.json",
    log:
        f"{R}/logs/train_scratch/{{scratch_method}}/seed{{seed}}.log",
    wildcard_constraints:
        scratch_method="full|focus",
        seed=r"\d+",
    params:
        model=SCRATCH.get("model"),
        focus=SCRATCH.get("focus"),
        train=SCRATCH.get("train"),
        tokenizer=SCRATCH.get("tokenizer"),
        domain=SCRATCH.get("domain"),
        rows=training_rows(SCRATCH),
        wandb=WANDB,
        group=P["name"],
    # One thread per job: on 2 shared CPU cores two 1-thread jobs side by side were several times faster than one
    # 2-thread job (whose threads spin-wait whenever the other core is busy). More threads: set-threads in a profile.
    threads: 1
    resources:
        gpu=one_gpu_if_any(P.get("gpus", 0)),  # one process
    script:
        "../scripts/train_scratch.py"


rule scratch_summary:
    """Validation perplexity of full attention against Focus (soft and hard), mean and spread over seeds."""
    conda:
        ENVIRONMENT
    input:
        summaries=scratch_runs("summary.json"),
        metrics=scratch_runs("metrics.jsonl"),
    output:
        table=report(f"{R}/tables/scratch.csv", caption="../report/scratch_table.rst", category="From scratch"),
        table_md=f"{R}/tables/scratch.md",
        figure=report(f"{R}/figures/scratch.png", caption="../report/scratch_figure.rst", category="From scratch"),
        figure_svg=f"{R}/figures/scratch.svg",
        summary=f"{R}/scratch/summary.json",
    log:
        f"{R}/logs/scratch_summary.log",
    script:
        "../scripts/scratch_summary.py"
