"""The interpretability stage: route held-out text through a trained adapter and write its tables and figures."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from focus.adapter import load_focus
from focus.config import to_dict
from focus.eval.categories import CATEGORIES, CATEGORY_NAMES, categorise, token_texts
from focus.eval.config import InterpretConfig
from focus.eval.diagnostics import distant_attention_recall
from focus.eval.interpret import (
    ROUTINGS,
    analyse,
    held_out_rows,
    resolve_layers,
    route_rows,
    summarise,
)
from focus.eval.interpret_plots import (
    plot_alignment,
    plot_balance,
    plot_category_overview,
    plot_group_categories,
    write_examples_html,
)
from focus.files import write_json, write_text
from focus.models import inference_device, load_model
from focus.pipeline.jobs import read_tokens
from focus.provenance import provenance
from focus.retrofit import attention_modules, focus_config, set_focus_mode


def interpret_adapter(
    source: str,
    dtype: str,
    adapter: str | Path,
    tokens: str | Path,
    seq_len: int,
    settings: dict,
    summary: str | Path,
    layers_csv: str | Path,
    shares_csv: str | Path,
    categories_csv: str | Path,
    top_tokens_csv: str | Path,
    categories_figure: str | Path,
    overview_figure: str | Path,
    balance_figure: str | Path,
    alignment_figure: str | Path,
    examples_html: str | Path,
    labels: dict[str, str] | None = None,
    focus_changes: dict | None = None,
) -> dict:
    """The pipeline stage: route held-out text (the test split of a `prepare_tokens` file) through `source` with the
    Focus adapter in `adapter`, in hard mode, and write the tables, figures and JSON summary (written last).

    Args:
        seq_len: tokens per row (the training sequence length: the routing the centroids were trained on).
        settings: `InterpretConfig` fields.
        labels: extra fields for the summary (the pipeline's model and variant names).
        focus_changes: FocusConfig settings that need no training over the adapter's (an evaluated variant's).
    """
    config = InterpretConfig.from_dict(settings)
    tic = time.perf_counter()
    model, tokenizer = load_model(source, getattr(torch, dtype), inference_device())
    load_focus(model, adapter)
    set_focus_mode(model, "hard", **(focus_changes or {}))
    focus = focus_config(model)
    plot_layers = resolve_layers(config.layers, len(attention_modules(model)))  # a bad layer fails before the work
    rows = held_out_rows(read_tokens(tokens, "test"), seq_len, config.tokens)
    skip = min(focus.sink_tokens, seq_len - 1)
    routing = route_rows(model, rows, config.batch_size, skip)
    categories = categorise(rows, tokenizer)[:, skip:].flatten()
    texts = token_texts(tokenizer, rows)
    tables = analyse(routing, categories, texts, config, seq_len)
    recall = distant_attention_recall(model, rows, config.batch_size)  # what the groups keep of the attention
    for frame, path in ((tables["layers"], layers_csv), (tables["shares"], shares_csv),
                        (tables["categories"], categories_csv), (tables["top_tokens"], top_tokens_csv)):
        write_text(path, frame.to_csv(index=False, float_format="%.6g"))
    record = summarise(tables, plot_layers)
    best = record["representative"]
    plot_group_categories(tables, best["layer"], categories_figure)
    plot_category_overview(tables, plot_layers, overview_figure)
    plot_balance(tables, best["layer"], best["head"], balance_figure)
    plot_alignment(tables, alignment_figure)
    shown = min(config.example_tokens, rows.shape[1] - skip)  # the start of the first row
    blocks = [(layer, head) for layer in [best["layer"], *plot_layers] for head in range(routing.groups["focus"].shape[1])]
    write_examples_html(examples_html, [texts[i] for i in routing.tokens[:shown].tolist()],
                        [CATEGORY_NAMES[c] for c in categories[:shown].tolist()],
                        {block: (routing.groups["focus"][block][:shown].tolist(),
                                 routing.confidence["focus"][block][:shown].tolist()) for block in dict.fromkeys(blocks)},
                        routing.num_groups, f"{(labels or {}).get('model', source)}: first {shown} analysed tokens")
    record.update(
        **(labels or {}),
        source=source,
        adapter=str(adapter),
        split="test",
        rows=rows.shape[0],
        seq_len=seq_len,
        skipped_positions=skip,
        tokens_analysed=int(routing.tokens.numel()),
        num_groups=routing.num_groups,
        plot_layers=plot_layers,
        mode={"model_run": "hard", "top_k": focus.top_k, "hard_group": "top-1"},
        routings=ROUTINGS,
        categories=CATEGORIES,
        distant_attention=recall,
        focus_config=to_dict(focus),
        interpret_config=to_dict(config),
        seconds=round(time.perf_counter() - tic, 1),
        provenance=provenance(),
    )
    write_json(summary, record)
    return record
