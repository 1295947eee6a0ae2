rule tokenize:
    """Token ids of one model's tokenizer for the listed splits of one corpus (mirror or hub)."""
    conda:
        ENVIRONMENT
    output:
        tokens_file("{model}", "{domain}"),
    log:
        f"{R}/logs/tokenize/{{model}}/{{domain}}.log",
    params:
        source=model_source,
        splits=domain_splits,
        mirror=P["data"].get("mirror"),
    script:
        "../scripts/tokenize.py"
