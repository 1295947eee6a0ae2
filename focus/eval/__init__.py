"""Measuring a model, Focus or not: each module takes a live model and returns numbers, writing no files.

    perplexity      sliding-window perplexity, per-window NLLs, paired ratios with intervals
    needle          pass-key retrieval from long passages
    harness         lm-evaluation-harness tasks on a live model (offline mirror or hub)
    ruler           RULER's long-context tasks through lm-eval
    diagnostics     how much of the pretrained attention a Focus pattern keeps, and the selection oracle
    config          InterpretConfig, the interpretability settings a profile states (torch-free)
    interpret       group balance, contents and alignment with token labels
    categories      the token categories interpretability labels tokens with
    interpret_plots the figures and example page of the interpretability tables
    speed           attention and prefill timings, Focus against full attention, in one process
    decode_speed    decoding-step and generate() timings through the cache's group index
"""
