"""The replication pipeline's stages: the only wing that knows method names, profiles, paths and jobs.

    methods    the names of methods (pretrained, full_finetune, <variant>-soft|hard, lora_r<rank>_lr<lr>)
    profile    experiment profiles (configs/*.yaml): validated and resolved before any job starts
    jobs       what every job shares: its log, token files, TrainingJob and the resumable training run
    stages     tokenise, train (Focus, full fine-tune, LoRA) and evaluate (perplexity, lm-eval, needle, RULER)
    scratch    the from-scratch comparison's training stage
    interpret  the interpretability stage
    benchmark  the speed benchmark stages (attention, prefill, decoding)
    tracking   Weights & Biases mirroring of training runs, tables and figures

Each Snakemake rule's script is one call into this wing (after `start_job`).
"""
