PPL = P["perplexity"]


rule perplexity:
    """Sliding-window perplexity of one (model, method) on one corpus's test split (perplexity_validation: the
    validation split, which choices are made on)."""
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
        split="test",
        focus_changes=method_focus_changes,
    threads: 1
    resources:
        gpu=model_eval_gpus,  # > 1: one process, the model's layers spread over them
    script:
        "../scripts/perplexity.py"


use rule perplexity as perplexity_validation with:
    output:
        f"{R}/perplexity/{{model}}/{{method}}/{{domain}}.validation.json",
    log:
        f"{R}/logs/perplexity/{{model}}/{{method}}/{{domain}}.validation.log",
    params:
        source=model_source,
        dtype=model_dtype,
        context_length=PPL["context_length"],
        stride=PPL.get("stride"),
        max_tokens=PPL.get("max_tokens"),
        batch_size=PPL.get("batch_size", 4),
        split="validation",
        focus_changes=method_focus_changes,


rule benchmarks:
    """lm-eval scores of one (model, method) on the profile's tasks (TruthfulQA with the chat template)."""
    conda:
        ENVIRONMENT
    input:
        unpack(method_inputs),
    output:
        record=f"{R}/harness/{{model}}/{{method}}.json",
        samples=directory(f"{R}/harness/{{model}}/{{method}}_samples"),
    log:
        f"{R}/logs/benchmarks/{{model}}/{{method}}.log",
    params:
        source=model_source,
        dtype=model_dtype,
        tasks=HARNESS.get("tasks"),
        chat_tasks=HARNESS.get("chat_tasks"),
        limit=HARNESS.get("limit"),
        batch_size=HARNESS.get("batch_size"),
        mirror=P["data"].get("mirror"),
        focus_changes=method_focus_changes,
    threads: 2
    resources:
        gpu=model_eval_gpus,  # > 1: one process, the model's layers spread over them
    script:
        "../scripts/benchmarks.py"


rule long_context_perplexity:
    """Perplexity of one (model, method) on one corpus at one context length: long passages, where Focus sparsifies."""
    conda:
        ENVIRONMENT
    input:
        unpack(long_context_inputs),
    output:
        f"{R}/long_context/{{model}}/{{method}}/{{domain}}/ctx{{context}}.json",
    log:
        f"{R}/logs/long_context/{{model}}/{{method}}/{{domain}}/ctx{{context}}.log",
    params:
        source=model_source,
        dtype=model_dtype,
        max_tokens=LONG.get("max_tokens"),
        batch_size=LONG.get("batch_size"),
        focus_changes=method_focus_changes,
    threads: 2
    resources:
        gpu=model_eval_gpus,  # > 1: one process, the model's layers spread over them
    script:
        "../scripts/long_context_perplexity.py"


use rule long_context_perplexity as long_context_perplexity_validation with:
    output:
        f"{R}/long_context/{{model}}/{{method}}/{{domain}}/ctx{{context}}.validation.json",
    log:
        f"{R}/logs/long_context/{{model}}/{{method}}/{{domain}}/ctx{{context}}.validation.log",
    params:
        source=model_source,
        dtype=model_dtype,
        max_tokens=LONG.get("max_tokens"),
        batch_size=LONG.get("batch_size"),
        focus_changes=method_focus_changes,
        split="validation",


rule needle:
    """Pass-key retrieval from long passages: greedy answer and the key's log-probability per trial."""
    conda:
        ENVIRONMENT
    input:
        unpack(long_context_inputs),
    output:
        f"{R}/long_context/{{model}}/{{method}}/needle.json",
    log:
        f"{R}/logs/needle/{{model}}/{{method}}.log",
    params:
        source=model_source,
        dtype=model_dtype,
        needle={key: value for key, value in (LONG.get("needle") or {}).items() if key != "methods"},
        focus_changes=method_focus_changes,
    threads: 2
    resources:
        gpu=model_eval_gpus,  # > 1: one process, the model's layers spread over them
    script:
        "../scripts/needle.py"


rule ruler:
    """RULER's long-context tasks through lm-eval (synthetic haystacks generated offline), per prompt length."""
    conda:
        ENVIRONMENT
    input:
        unpack(method_inputs),
    output:
        record=f"{R}/long_context/{{model}}/{{method}}/ruler.json",
        samples=directory(f"{R}/long_context/{{model}}/{{method}}/ruler_samples"),
    log:
        f"{R}/logs/ruler/{{model}}/{{method}}.log",
    params:
        source=model_source,
        dtype=model_dtype,
        ruler={key: value for key, value in (LONG.get("ruler") or {}).items() if key != "methods"},
        focus_changes=method_focus_changes,
    threads: 2
    resources:
        gpu=model_eval_gpus,  # > 1: one process, the model's layers spread over them
    script:
        "../scripts/ruler.py"
