"""Tables, figures and records built from what the stages wrote: the top wing, which reads files only.

    tables      perplexity and training tables
    figures     loss curves and perplexity bars
    evaluation  benchmark, TruthfulQA, LoRA grid, prompt-length, long-context and RULER tables and figures
    study       the design study's table and figure
    scratch     the from-scratch comparison's table, figure and summary
    claims      the paper's claims against this profile's results
"""
