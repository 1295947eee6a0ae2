BENCH = P.get("benchmark")
BENCH_GPUS = one_gpu_if_any(P["models"][BENCH["model"]]["eval_gpus"]) if BENCH and BENCH.get("model") else 0


rule bench_attention:
    """Hard Focus (two-call decomposition) against full causal attention, one layer and a model prefill."""
    conda:
        ENVIRONMENT
    output:
        attention=report(f"{R}/bench/attention.csv", caption="../report/bench_table.rst", category="Speed"),
        attention_md=f"{R}/bench/attention.md",
        prefill=report(f"{R}/bench/prefill.csv", caption="../report/bench_table.rst", category="Speed"),
        prefill_md=f"{R}/bench/prefill.md",
        figure=report(f"{R}/figures/speedup.png", caption="../report/speedup_figure.rst", category="Speed"),
        figure_svg=f"{R}/figures/speedup.svg",
    log:
        f"{R}/logs/bench_attention.log",
    params:
        bench=BENCH,
        model_source=bench_model_source,
    threads: MACHINE_THREADS  # alone on the machine: timings are not shared with other jobs
    resources:
        gpu=BENCH_GPUS,
    script:
        "../scripts/bench_attention.py"


if (BENCH or {}).get("decode"):

    rule bench_decode:
        """Hard Focus decoding through the cache's group index against full attention over the cache: one layer's
        step and a model's generate()."""
        conda:
            ENVIRONMENT
        input:
            unpack(bench_decode_inputs),
        output:
            steps=report(f"{R}/bench/decode_step.csv", caption="../report/bench_decode_table.rst", category="Speed"),
            steps_md=f"{R}/bench/decode_step.md",
            generate=report(f"{R}/bench/generate.csv", caption="../report/bench_decode_table.rst", category="Speed"),
            generate_md=f"{R}/bench/generate.md",
            figure=report(f"{R}/figures/decode_speedup.png", caption="../report/decode_speedup_figure.rst",
                          category="Speed"),
            figure_svg=f"{R}/figures/decode_speedup.svg",
        log:
            f"{R}/logs/bench_decode.log",
        params:
            decode=BENCH["decode"],
            model_source=bench_model_source,
        threads: MACHINE_THREADS  # alone on the machine: timings are not shared with other jobs
        resources:
            gpu=BENCH_GPUS,
        script:
            "../scripts/bench_decode.py"


if MICRO:

    rule microbenchmark:
        """A kernel microbenchmark of benchmarks/ (profile section `microbenchmarks`), its table stamped as every
        rule's: `benchmarks/<script>.py --out results/<profile>/bench` with the section's arguments (and `--tag`
        where the entry's name is `<script>_<tag>`)."""
        conda:
            ENVIRONMENT
        input:
            unpack(microbenchmark_inputs),
        output:
            csv=report(f"{R}/bench/{{name}}.csv", caption="../report/microbenchmark_table.rst", category="Speed"),
            md=f"{R}/bench/{{name}}.md",
        wildcard_constraints:
            name="|".join(MICRO),
        log:
            f"{R}/logs/microbenchmark/{{name}}.log",
        params:
            script=microbenchmark_path,
            args=microbenchmark_args,
        threads: MACHINE_THREADS  # alone on the machine: timings are not shared with other jobs
        resources:
            gpu=one_gpu_if_any(P["models"][MODELS[0]]["eval_gpus"]),
        script:
            "../scripts/microbenchmark.py"
