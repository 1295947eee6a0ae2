"""The speed benchmark stages: attention, prefill and decoding rows timed, written as tables and figures."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import torch

from focus.artifacts import markdown_table, pyplot, save_figure, token_axis
from focus.data import load_corpus, tokenize_corpus
from focus.eval.decode_speed import decode_step_rows, generate_rows
from focus.eval.speed import attention_rows, prefill_rows
from focus.files import write_text
from focus.models import load_model
from focus.provenance import device_info


def run_benchmark(
    settings: dict,
    model_source: str | None,
    attention_csv: str | Path,
    prefill_csv: str | Path,
    figure: str | Path,
    device: str | None = None,
) -> None:
    """The whole benchmark from a profile's `benchmark` section: attention rows, model prefill rows (when
    `model_source` is given), their tables and the speedup figure."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, settings.get("dtype", "float32"))
    routings = tuple(settings.get("routings", ["key", "query"]))
    attention = attention_rows(
        settings["lengths"], [tuple(s) for s in settings["settings"]], settings.get("heads", 1),
        settings.get("head_dim", 64), dtype, device, settings.get("repeats", 3),
        # One query head per key/value head there: kv_head routing is query routing.
        routings=tuple(r for r in routings if r != "kv_head") or ("query",),
    )
    prefill = []
    if model_source:
        model, _ = load_model(model_source, dtype, device)
        prefill = prefill_rows(model, [tuple(s) for s in settings.get("prefill_settings", [[16, 256, 1]])],
                               settings.get("prefill_lengths", [4096]), repeats=settings.get("repeats", 2),
                               routings=routings)
    machine = _measured_on(device, dtype)
    write_speed_tables(attention, prefill, attention_csv, prefill_csv, machine)
    plot_speedup(attention_csv, figure, machine)


def run_decode_benchmark(
    settings: dict, model_source: str | None, step_csv: str | Path, generate_csv: str | Path, figure: str | Path,
    device: str | None = None,
) -> None:
    """The decoding benchmark from a profile's `benchmark.decode` section: one-layer step rows, model generate rows
    (when `model_source` is given), their tables (CSV + Markdown headed by the machine) and the step figure."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, settings.get("dtype", "float32"))
    native = decode_kernels(settings)
    steps = decode_step_rows(
        settings["cache_lengths"], [tuple(s) for s in settings["settings"]],
        [tuple(layout) for layout in settings.get("head_layouts", [[1, 1], [9, 3]])], settings.get("head_dim", 64),
        dtype, device, settings.get("repeats", 5), routings=tuple(settings.get("routings", ["query"])),
        native=native is not False and torch.device(device).type == "cpu",
    )
    generated = []
    if model_source:
        model, tokenizer = load_model(model_source, dtype, device)
        prompt_ids = None
        if settings.get("text"):  # real text, e.g. "books:validation", instead of random tokens
            corpus, split = settings["text"].split(":")
            needed = max(settings.get("prompt_lengths", [4096]))
            prompt_ids = tokenize_corpus(load_corpus(corpus, split)[: 8 * needed], tokenizer)[None]
        generated = generate_rows(model, settings.get("prompt_lengths", [4096]),
                                  [tuple(s) for s in settings.get("generate_settings", [[16, 256, 1]])],
                                  settings.get("new_tokens", 32), adapter=settings.get("adapter"),
                                  prompt_ids=prompt_ids, native=native)
    machine = _measured_on(device, dtype)
    write_speed_tables(steps, generated, step_csv, generate_csv, machine)
    plot_decode_speedup(step_csv, figure, machine)


def decode_kernels(settings: dict) -> bool | None:
    """`benchmark.decode.native`: the FocusCache's kernels the decoding benchmark times (absent: the library's default,
    native on the CPU). The deprecated `compile_step` is read as `native` with a warning: `compile_step: false` forced
    the eager path the library no longer defaults to."""
    if "compile_step" in settings:
        warnings.warn("benchmark.decode.compile_step is deprecated: it is benchmark.decode.native (absent: the "
                      "library's default, the native kernels on the CPU)", FutureWarning, stacklevel=2)
        return settings.get("native", settings["compile_step"])
    return settings.get("native")


def plot_decode_speedup(step_csv: str | Path, figure: str | Path, machine: str = "") -> None:
    """Measured speedup of the sparse decoding step over SDPA on the whole cache against cache length, one line per
    (heads, groups, window, top-k), with the pair-count limit dashed in the same colour, no gain (1x) as a solid
    line and the machine under the title. PNG plus SVG sibling."""
    plt = pyplot()
    frame = pd.read_csv(step_csv)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    if "routing" not in frame:  # tables written before routing was a column
        frame["routing"] = "query"
    lines = frame.groupby(["heads", "kv_heads", "groups", "window", "top_k", "routing"])
    for (heads, k_heads, groups, window, top_k, routing), part in lines:
        shared = " shared" if routing == "kv_head" else ""
        (line,) = ax.plot(part["cache"], part["speedup"], marker="o",
                          label=f"H={heads}/{k_heads} G={groups} w={window} top-{top_k}{shared}")
        ax.plot(part["cache"], part["pair_limit"], linestyle="--", color=line.get_color(), alpha=0.7)
        if heads != k_heads and "read_limit" in part:
            ax.plot(part["cache"], part["read_limit"], linestyle=":", color=line.get_color(), alpha=0.7)
    token_axis(ax, frame["cache"])
    _no_gain(ax)
    ax.set(xlabel="cached tokens", ylabel="speedup over SDPA on the whole cache",
           title="Focus hard decoding step through the group index\n(dashed: pair-count limit; dotted: rows-read limit)"
           + (f"\n{machine}" if machine else ""))
    ax.legend(fontsize="small")
    save_figure(fig, figure)


def write_speed_tables(attention: list[dict], prefill: list[dict], attention_csv: str | Path, prefill_csv: str | Path,
                       device: str) -> None:
    """Benchmark rows as CSV, each with a Markdown sibling headed by the device they were measured on."""
    for rows, path in ((attention, attention_csv), (prefill, prefill_csv)):
        frame = pd.DataFrame(rows)
        write_text(path, frame.to_csv(index=False))
        body = markdown_table(frame, ".3g") if len(frame) else "(not measured)"
        write_text(Path(path).with_suffix(".md"), f"Measured on: {device}\n\n{body}\n")


def plot_speedup(attention_csv: str | Path, figure: str | Path, machine: str = "") -> None:
    """Measured speedup of the decomposition over full causal SDPA against sequence length, one line per
    (groups, window, top-k, routing), with the pair-count limit dashed in the same colour, no gain (1x) as a solid
    line and the machine under the title. PNG plus SVG sibling."""
    plt = pyplot()

    frame = pd.read_csv(attention_csv)
    if "routing" not in frame:  # tables measured before query-side routing existed
        frame["routing"] = "key"
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (groups, window, top_k, routing), part in frame.groupby(["groups", "window", "top_k", "routing"]):
        label = f"G={groups} w={window} top-{top_k}, {routing} routing"
        (line,) = ax.plot(part["length"], part["speedup"], marker="o", label=label)
        ax.plot(part["length"], part["theoretical"], linestyle="--", color=line.get_color(), alpha=0.7)
    token_axis(ax, frame["length"])
    _no_gain(ax)
    ax.set(xlabel="sequence length (tokens)", ylabel="speedup over full causal SDPA",
           title="Focus hard top-k, two-call decomposition (dashed: pair-count limit)"
           + (f"\n{machine}" if machine else ""))
    ax.legend(fontsize="small")
    save_figure(fig, figure)


def _no_gain(ax) -> None:
    """The axis from 0, with 1x (Focus as fast as what it replaces) drawn: below it Focus is slower."""
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylim(bottom=0)


def _measured_on(device: str, dtype: torch.dtype) -> str:
    """The heading of a speed table: the machine, the threads and the dtype the rows were timed with."""
    info = device_info()
    name = info.get("cuda_device") if device.startswith("cuda") else info["cpu"]
    return f"{name}, {torch.get_num_threads()} torch threads, {str(dtype).removeprefix('torch.')}"
