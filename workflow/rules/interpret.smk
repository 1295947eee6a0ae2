INTERPRET_DIR = interpret_folder("{model}", "{variant}")


rule interpret:
    """Which tokens each trained Focus group holds and how balanced the groups are, on held-out text (the test
    split of the training domain), with and without Sinkhorn balancing."""
    conda:
        ENVIRONMENT
    input:
        adapter=variant_adapter,
        tokens=train_tokens,
    output:
        summary=f"{INTERPRET_DIR}/summary.json",
        layers=interpret_report("group_layers.csv", "interpret_layers"),
        shares=f"{INTERPRET_DIR}/group_shares.csv",
        categories=f"{INTERPRET_DIR}/group_categories.csv",
        top_tokens=f"{INTERPRET_DIR}/group_top_tokens.csv",
        categories_figure=interpret_report("group_categories.png", "interpret_categories"),
        categories_figure_svg=f"{INTERPRET_DIR}/group_categories.svg",
        overview_figure=interpret_report("group_categories_overview.png", "interpret_overview"),
        overview_figure_svg=f"{INTERPRET_DIR}/group_categories_overview.svg",
        balance_figure=interpret_report("group_balance.png", "interpret_balance"),
        balance_figure_svg=f"{INTERPRET_DIR}/group_balance.svg",
        alignment_figure=interpret_report("group_alignment.png", "interpret_alignment"),
        alignment_figure_svg=f"{INTERPRET_DIR}/group_alignment.svg",
        examples=interpret_report("group_examples.html", "interpret_examples"),
    log:
        f"{R}/logs/interpret/{{model}}/{{variant}}.log",
    params:
        source=model_source,
        dtype=model_dtype,
        seq_len=P["train"]["seq_len"],
        settings={key: value for key, value in (INTERPRET or {}).items() if key != "models"},
        focus_changes=variant_focus_changes,
    threads: 2
    resources:
        gpu=model_eval_gpus,  # > 1: one process, the model's layers spread over them
    script:
        "../scripts/interpret.py"
