PPL = P["perplexity"]


rule perplexity:
    """Sliding-window perplexity of one (model, method) on one corpus's test split."""
    conda:
        ENVIRONMENT
    input:
        unpack(perplexity_inputs),
    output:
        f"{R}/perplexity/{{model}}/{{method}}/{{domain}}.json",
    log:
        f"{R}/logs/perplexity/{{model}}/{{method}}/{{domain}}.log",
    params:
        source=model_source,
        dtype=model_dtype,
        context_length=PPL["context_length"],
        stride=PPL.get("stride"),
        max_tokens=PPL.get("max_tokens"),
        batch_size=PPL.get("batch_size", 4),
    threads: 1
    script:
        "../scripts/perplexity.py"
