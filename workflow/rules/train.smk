TRAIN = P["train"]


rule train_focus:
    """Retrofit Focus and train only the centroids; resumes from run/checkpoint.pt when a killed job re-runs."""
    conda:
        ENVIRONMENT
    input:
        unpack(train_inputs),
    output:
        adapter=directory(f"{R}/train/{{model}}/{{variant}}/adapter"),
        metrics=f"{R}/train/{{model}}/{{variant}}/metrics.jsonl",
        summary=f"{R}/train/{{model}}/{{variant}}/summary.json",
        wandb=f"{R}/wandb/train/{{model}}/{{variant}}.json",
    log:
        f"{R}/logs/train_focus/{{model}}/{{variant}}.log",
    params:
        source=model_source,
        dtype=model_dtype,
        focus=variant_focus,
        train=centroid_training,
        rows=variant_rows,  # seq_len and row counts: focus.pipeline.jobs.TrainingJob
        wandb=WANDB,
        group=P["name"],
    threads: 2
    resources:
        gpu=model_gpus,  # > 1: one process per GPU, the frozen model sharded over them (focus.distributed)
    script:
        "../scripts/train_focus.py"


rule peer:
    """A training-free peer (peers.selectors) as an adapter: the first variant's window and sinks, its selector and
    budget, the calibration rows' k-means as centroids (the clusters selector ranks them). Nothing trains."""
    conda:
        ENVIRONMENT
    input:
        tokens=train_tokens,
    output:
        adapter=directory(f"{R}/peers/{{model}}/{{peer}}/adapter"),
    log:
        f"{R}/logs/peer/{{model}}/{{peer}}.log",
    params:
        source=model_source,
        dtype=model_dtype,
        focus=peer_focus,
        seq_len=TRAIN["seq_len"],
        calibration_rows=TRAIN.get("calibration_rows"),  # None: a training job's default
    threads: 1
    resources:
        gpu=model_eval_gpus,  # the k-means runs through the model, as an evaluation does
    script:
        "../scripts/build_peer.py"


rule train_full_finetune:
    """The full-attention baseline: every weight trained on the same rows, steps and batch size."""
    conda:
        ENVIRONMENT
    input:
        unpack(train_inputs),
    output:
        model=directory(f"{R}/train/{{model}}/full_finetune/model"),
        metrics=f"{R}/train/{{model}}/full_finetune/metrics.jsonl",
        summary=f"{R}/train/{{model}}/full_finetune/summary.json",
        wandb=f"{R}/wandb/train/{{model}}/full_finetune.json",
    log:
        f"{R}/logs/train_full_finetune/{{model}}.log",
    params:
        source=model_source,
        dtype=model_dtype,
        train=full_finetune_training,
        rows=training_rows(TRAIN),  # seq_len and row counts: focus.pipeline.jobs.TrainingJob
        retrieval_window=retrieval_window,
        wandb=WANDB,
        group=P["name"],
    threads: 2
    resources:
        gpu=model_gpus,
    script:
        "../scripts/train_full_finetune.py"


rule train_lora:
    """One LoRA baseline of the grid (PEFT): the same rows, steps and batch as the centroids, the cell's rank and lr."""
    conda:
        ENVIRONMENT
    input:
        unpack(train_inputs),
    output:
        adapter=directory(f"{R}/train/{{model}}/{{lora}}/adapter"),
        metrics=f"{R}/train/{{model}}/{{lora}}/metrics.jsonl",
        summary=f"{R}/train/{{model}}/{{lora}}/summary.json",
        wandb=f"{R}/wandb/train/{{model}}/{{lora}}.json",
    log:
        f"{R}/logs/train_lora/{{model}}/{{lora}}.log",
    params:
        source=model_source,
        dtype=model_dtype,
        cell=lora_cell,
        target_modules=LORA.get("target_modules"),
        dropout=LORA.get("dropout"),
        train=lora_training,
        rows=training_rows(TRAIN),  # seq_len and row counts: focus.pipeline.jobs.TrainingJob
        retrieval_window=retrieval_window,
        wandb=WANDB,
        group=P["name"],
    threads: 2
    resources:
        gpu=lora_gpus,  # one process
    script:
        "../scripts/train_lora.py"
