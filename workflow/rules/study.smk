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
            long_context=long_context_files(),
            needle=needle_files(),
            interpret=[f"{interpret_folder(STUDY['model'], v)}/summary.json" for v in VARIANTS
                       if STUDY["model"] in (INTERPRET or {}).get("models", [])],
        output:
            table=report(TABLES["study"], caption="../report/study_table.rst", category="Study"),
            table_md=TABLES["study"].replace(".csv", ".md"),
            figure=report(FIGURES["study_curves"], caption="../report/study_figure.rst", category="Study"),
            figure_svg=FIGURES["study_curves"].replace(".png", ".svg"),
        log:
            f"{R}/logs/study.log",
        params:
            model=STUDY["model"],
            variants=P["variants"],
            domain=STUDY["domain"],
        script:
            "../scripts/study.py"
