# The design study (profile section `study`, configs/study.yaml): every Focus variant side by side.


if STUDY:

    rule study:
        """The study table (validation chooses, test reports) and the training-curve figure."""
        conda:
            ENVIRONMENT
        input:
            summaries=[f"{train_folder(STUDY['model'], v)}/summary.json" for v in VARIANTS],
            metrics=[f"{train_folder(STUDY['model'], v)}/metrics.jsonl" for v in VARIANTS],
            validation=validation_perplexity_files(),
            test=perplexity_files(),
            long_context=long_context_files(domains=[LONG["domain"]]) if LONG["models"] else [],
            needle=needle_files(),
            interpret=[f"{interpret_folder(STUDY['model'], v)}/summary.json" for v in SCORED_VARIANTS
                       if STUDY["model"] in (INTERPRET or {}).get("models", [])],
        output:
            table=report(TABLES["study"], caption="../report/study_table.rst", category="Study"),
            table_md=TABLES["study"].replace(".csv", ".md"),
            figure=report(FIGURES["study_curves"], caption="../report/study_figure.rst", category="Study"),
            figure_svg=FIGURES["study_curves"].replace(".png", ".svg"),
            **({"tradeoff": report(FIGURES["study_tradeoff"], caption="../report/study_tradeoff.rst", category="Study"),
                "tradeoff_svg": FIGURES["study_tradeoff"].replace(".png", ".svg")} if "study_tradeoff" in FIGURES else {}),
        log:
            f"{R}/logs/study.log",
        params:
            model=STUDY["model"],
            variants=P["variants"],
            domain=STUDY["domain"],
            other_domain=STUDY_OTHER,
        script:
            "../scripts/study.py"
