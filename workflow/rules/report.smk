rule tables:
    """Perplexity and training tables (CSV is the record, Markdown for reading)."""
    conda:
        ENVIRONMENT
    input:
        perplexity=perplexity_files(),
        training=train_summaries(),
    output:
        perplexity=report(TABLES["perplexity"], caption="../report/perplexity_table.rst", category="Tables"),
        perplexity_md=f"{R}/tables/perplexity.md",
        training=report(TABLES["training"], caption="../report/training_table.rst", category="Tables"),
        training_md=f"{R}/tables/training.md",
    log:
        f"{R}/logs/tables.log",
    script:
        "../scripts/tables.py"


rule figures:
    """Training loss curves and perplexity bars, as PNG (report, W&B) and SVG (papers)."""
    conda:
        ENVIRONMENT
    input:
        metrics=train_metrics(),
        perplexity=TABLES["perplexity"],
    output:
        loss_curves=report(FIGURES["loss_curves"], caption="../report/loss_curves.rst", category="Figures"),
        loss_curves_svg=f"{R}/figures/loss_curves.svg",
        perplexity=report(FIGURES["perplexity"], caption="../report/perplexity_figure.rst", category="Figures"),
        perplexity_svg=f"{R}/figures/perplexity.svg",
    log:
        f"{R}/logs/figures.log",
    script:
        "../scripts/figures.py"


rule wandb_report:
    """Every table and figure, logged to one W&B run (offline by default: results/<profile>/wandb)."""
    conda:
        ENVIRONMENT
    input:
        tables=list(TABLES.values()),
        figures=list(FIGURES.values()),
    output:
        f"{R}/wandb/report.json",
    log:
        f"{R}/logs/wandb_report.log",
    params:
        wandb=WANDB,
        group=P["name"],
    script:
        "../scripts/wandb_report.py"


rule notebook:
    """Execute notebooks/results.ipynb (it reads only results/) and keep the executed copy."""
    conda:
        ENVIRONMENT
    input:
        notebook=f"{workflow.basedir}/notebooks/results.ipynb",
        tables=list(TABLES.values()),
        figures=list(FIGURES.values()),
        wandb=f"{R}/wandb/report.json",
    output:
        f"{R}/notebooks/results.ipynb",
    log:
        f"{R}/logs/notebook.log",
    params:
        results=notebook_results,
    script:
        "../scripts/notebook.py"
