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


if EVALUATION_TABLES:

    rule evaluation_tables:
        """Benchmark, TruthfulQA, prompt-length, LoRA and long-context tables and figures."""
        conda:
            ENVIRONMENT
        input:
            benchmarks=harness_files(),
            samples=harness_samples(),
            lora=lora_summaries(),
            perplexity=perplexity_files(),
            long_context=long_context_files(),
            needle=needle_files(),
            ruler=ruler_files(),
        output:
            **evaluation_outputs(),
        log:
            f"{R}/logs/evaluation_tables.log",
        params:
            sources={model: P["models"][model]["source"] for model in HARNESS["models"]},
            focus={model: P["models"][model]["variants"] for model in HARNESS["models"]},
        script:
            "../scripts/evaluation_tables.py"


if PEERS["models"]:

    rule peers_table:
        """The trained routers against each training-free peer on the same windows (table and trade-off figure): the
        perplexity domains at the perplexity context, and the long-context corpora at their other lengths."""
        conda:
            ENVIRONMENT
        input:
            **peers_table_inputs(),
        output:
            csv=report(TABLES["peers"], caption="../report/peers_table.rst", category="Evaluation"),
            md=TABLES["peers"].replace(".csv", ".md"),
            **({"figure": report(FIGURES["peers_tradeoff"], caption="../report/peers_tradeoff.rst",
                                 category="Evaluation"),
                "figure_svg": FIGURES["peers_tradeoff"].replace(".png", ".svg")} if "peers_tradeoff" in FIGURES else {}),
        log:
            f"{R}/logs/peers_table.log",
        params:
            routers=PEER_ROUTERS,
            domain=P["train"]["domain"],
            other=PEER_OTHER,
        script:
            "../scripts/peers_table.py"


rule claims:
    """Every claim of the paper: its number, ours with the setting, and a verdict (Markdown, CSV, W&B)."""
    conda:
        ENVIRONMENT
    input:
        unpack(claims_inputs),
    output:
        csv=report(TABLES["claims"], caption="../report/claims.rst", category="Claims"),
        md=f"{R}/tables/claims.md",
    log:
        f"{R}/logs/claims.log",
    params:
        main_model=MAIN_MODEL,
        train_domain=P["train"]["domain"],
    script:
        "../scripts/claims.py"


rule provenance:
    """Where each table, figure and page of the profile came from (rule, commit, profile, machine, date, the command
    that re-makes it), one row each from their stamps: the HTML report's Provenance section, W&B and the notebook."""
    conda:
        ENVIRONMENT
    input:
        PROVENANCE_OF,
    output:
        csv=report(TABLES["provenance"], caption="../report/provenance_table.rst", category="Provenance"),
        md=f"{R}/tables/provenance.md",
    log:
        f"{R}/logs/provenance.log",
    params:
        results=profile_results,
    script:
        "../scripts/provenance_table.py"


rule wandb_report:
    """Every table, figure and page, logged to one W&B run (offline by default: results/<profile>/wandb), the tables
    also as an Artifact downstream of the training jobs' weights."""
    conda:
        ENVIRONMENT
    input:
        tables=list(TABLES.values()),
        figures=list(FIGURES.values()),
        pages=list(PAGES.values()),
        trained=training_runs(),
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
        results=profile_results,
    script:
        "../scripts/notebook.py"


rule snapshot:
    """The profile's tables and figures, each with its provenance, copied into benchmarks/results/<profile>/ (run from
    the repository's root), where README and docs cite them: `snakemake snapshot --configfile <profile>`. Not part of
    `all`: a snapshot is what a commit records; the profile's `snapshot.interpret: false` leaves the group pages out."""
    conda:
        ENVIRONMENT
    input:
        snapshot_inputs([*TABLES.values(), *FIGURES.values(), *PAGES.values()], R, **P.get("snapshot", {})),
    output:
        f"{R}/snapshot.json",
    log:
        f"{R}/logs/snapshot.log",
    params:
        results=lambda wildcards, output: str(Path(output[0]).parent),  # results/<profile>
        folder=f"benchmarks/results/{P['name']}",
    script:
        "../scripts/snapshot.py"
