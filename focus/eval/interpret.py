"""Group interpretability of trained Focus centroids: how balanced the groups are and which tokens each one holds.

A trained adapter runs over held-out text in hard mode, as at inference, while `trace_routing` records every layer's
routing logits through the hook in `focus.attention.function`. Assignments come from the routing functions attention itself
uses, three ways:

    focus     as at inference: each token's own softmax over groups plus the adapter's learnt balance bias
              (`inference_log_assign`); its hard group is the top-1 (hard mode keeps the top-k; the first is the main one)
    sinkhorn  balanced by Sinkhorn over each sequence, as in training (the adapter's `sinkhorn_iters`)
    raw       the softmax of the logits alone, no balancing of either kind (the ablation)

The first `sink_tokens` positions of every row are left out: sinks belong to every group. Token categories
(`CATEGORIES`) partition the analysed tokens, so each group's category shares sum to 1. How much groups follow a
labelling (category, token identity, position bucket) is the normalised mutual information (NMI) between group and
label, next to its chance level: the mean NMI of the same groups with the labels shuffled (finite samples give a
chance NMI above 0, large for token identity with its many values). No part-of-speech tags: no English tagger
installs from PyPI with its model inside, and the pipeline runs offline.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd
import torch

from focus.attention.function import TRACE_ATTRIBUTE
from focus.attention.routers.centroids import inference_log_assign, sinkhorn, top_k_groups
from focus.eval.categories import CATEGORY_NAMES
from focus.eval.config import InterpretConfig
from focus.models import input_device
from focus.retrofit import attention_modules, focus_config

ROUTINGS = {
    "focus": "as at inference: each token's own softmax plus the learnt balance bias",
    "sinkhorn": "Sinkhorn-balanced over each sequence, as in training",
    "raw": "softmax of the routing logits alone, no balancing",
}
POSITION_BUCKETS = 8  # position label: which eighth of its row a token sits in
_MIN_LIFT_COUNT = 3  # a token ranks by lift only with this many occurrences in the group: lift of 1-2 is noise


@dataclass(frozen=True)
class Routing:
    """Group assignments of N analysed tokens (row-major over rows, then positions) in every layer and routing head.

    groups: {routing: (layers, K, N) int64 hard (top-1) group}.
    soft_mass: {routing: (layers, K, G) float64 sum over tokens of the soft assignment probabilities}.
    confidence: {routing: (layers, K, N) float32 soft probability of the token's hard group}.
    tokens, positions: (N,) token ids and positions within their row.
    """

    groups: dict[str, torch.Tensor]
    soft_mass: dict[str, torch.Tensor]
    confidence: dict[str, torch.Tensor]
    tokens: torch.Tensor
    positions: torch.Tensor
    num_groups: int


@contextmanager
def trace_routing(model: torch.nn.Module) -> Iterator[list[list[torch.Tensor]]]:
    """Within the block, every Focus layer appends the routing logits (B, K, L, G) of each call to its list."""
    modules = attention_modules(model)
    traces: list[list[torch.Tensor]] = [[] for _ in modules]
    for module, trace in zip(modules, traces):
        setattr(module, TRACE_ATTRIBUTE, trace)
    try:
        yield traces
    finally:
        for module in modules:
            delattr(module, TRACE_ATTRIBUTE)


def log_assignments(logits: torch.Tensor, group_bias: torch.Tensor, sinkhorn_iters: int) -> dict[str, torch.Tensor]:
    """{routing: (B, K, L, G) float32 log-assignments} of one layer's logits (B, K, L, G), for each of ROUTINGS."""
    return {
        "focus": inference_log_assign(logits, group_bias),
        "sinkhorn": sinkhorn(logits, sinkhorn_iters)[0],
        "raw": torch.log_softmax(logits.float(), dim=-1),
    }


@torch.no_grad()
def route_rows(model: torch.nn.Module, rows: torch.Tensor, batch_size: int = 4, skip: int = 0) -> Routing:
    """Run the Focus model over `rows` (R, L) token ids and record every token's groups in every layer and head.

    The model runs in whatever mode it is in (hard, as at inference, in the pipeline); positions < `skip` of each
    row (the sinks) are left out, so N = R * (L - skip).
    """
    config = focus_config(model)
    modules = attention_modules(model)
    device = input_device(model)
    groups = {r: [[] for _ in modules] for r in ROUTINGS}  # [routing][layer]: (K, tokens of one batch) chunks
    confidence = {r: [[] for _ in modules] for r in ROUTINGS}
    soft_mass = {r: [0.0 for _ in modules] for r in ROUTINGS}
    with trace_routing(model) as traces:
        for batch in rows.split(batch_size):
            model(input_ids=batch.to(device), use_cache=False)
            for i, (module, trace) in enumerate(zip(modules, traces)):
                (logits,) = trace  # one call per layer: a whole sequence, no cache
                trace.clear()
                assigned = log_assignments(logits, module.focus_group_bias, config.sinkhorn_iters)
                for routing, log_p in assigned.items():
                    log_p = log_p[:, :, skip:].transpose(0, 1).flatten(1, 2).cpu()  # (K, B * (L - skip), G)
                    top = top_k_groups(log_p, 1)  # (K, tokens, 1): the hard routing of inference, at top-1
                    groups[routing][i].append(top[..., 0])
                    confidence[routing][i].append(log_p.gather(-1, top)[..., 0].exp())
                    soft_mass[routing][i] = soft_mass[routing][i] + log_p.double().exp().sum(dim=1)  # (K, G)
    kept = rows[:, skip:]
    return Routing(
        groups={r: torch.stack([torch.cat(x, dim=1) for x in groups[r]]) for r in ROUTINGS},
        soft_mass={r: torch.stack(soft_mass[r]) for r in ROUTINGS},
        confidence={r: torch.stack([torch.cat(x, dim=1) for x in confidence[r]]) for r in ROUTINGS},
        tokens=kept.flatten(),
        positions=torch.arange(skip, rows.shape[1]).repeat(rows.shape[0]),
        num_groups=config.num_groups,
    )


def held_out_rows(ids: torch.Tensor, seq_len: int, tokens: int) -> torch.Tensor:
    """(R, seq_len) rows, R = ceil(tokens / seq_len) (at most all there are), spread evenly over `ids` (T,)."""
    available = ids.numel() // seq_len
    if available == 0:
        raise ValueError(f"the held-out split has {ids.numel()} tokens, fewer than one row of {seq_len}")
    count = min(available, -(-tokens // seq_len))
    starts = torch.linspace(0, available - 1, count).round().long() * seq_len
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])


def balance(counts: np.ndarray) -> dict[str, float]:
    """Entropy of the group shares normalised by log G (1 = perfectly balanced), smallest and largest share."""
    shares = np.asarray(counts, dtype=np.float64) / np.sum(counts)
    nonzero = shares[shares > 0]
    return {
        "normalised_entropy": float(-(nonzero * np.log(nonzero)).sum() / math.log(len(shares))) if len(shares) > 1
        else 1.0,
        "min_share": float(shares.min()),
        "max_share": float(shares.max()),
    }


def contingency(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(distinct a, distinct b) counts of the pairs (a_n, b_n)."""
    _, a = np.unique(a, return_inverse=True)
    _, b = np.unique(b, return_inverse=True)
    cols = int(b.max()) + 1
    return np.bincount(a * cols + b, minlength=(int(a.max()) + 1) * cols).reshape(-1, cols)


def normalised_mutual_information(a: np.ndarray, b: np.ndarray) -> float:
    """I(a; b) / mean(H(a), H(b)) of two labellings of the same N items, in [0, 1]; 0 when either is constant."""
    p = contingency(a, b) / len(a)
    pa, pb = p.sum(axis=1), p.sum(axis=0)
    ha, hb = -(pa * np.log(pa)).sum(), -(pb * np.log(pb)).sum()
    if ha <= 0 or hb <= 0:
        return 0.0
    nz = p > 0
    mi = (p[nz] * np.log(p[nz] / np.outer(pa, pb)[nz])).sum()
    return float(np.clip(mi / ((ha + hb) / 2), 0.0, 1.0))


def shuffled_nmi(a: np.ndarray, b: np.ndarray, shuffles: int, rng: np.random.Generator) -> float:
    """Chance level of `normalised_mutual_information(a, b)`: its mean over `shuffles` random permutations of b."""
    return float(np.mean([normalised_mutual_information(a, rng.permutation(b)) for _ in range(shuffles)]))


def analyse(
    routing: Routing, categories: torch.Tensor, texts: dict[int, str], config: InterpretConfig, seq_len: int
) -> dict[str, pd.DataFrame]:
    """The stage's tables, from the routing of N tokens and their (N,) category indices.

    Returns:
        layers: one row per (layer, head, routing): balance of the hard groups (normalised entropy, min and max
            share), of the soft assignment (soft_normalised_entropy), mean confidence, and NMI of the groups with
            category, token and position (each with its shuffled chance level `*_shuffled`).
        shares: one row per (layer, head, routing, group): count, share, soft_share.
        categories: (focus routing) one row per (layer, head, group, category): count, share within the group,
            lift (that share over the category's share of all tokens).
        top_tokens: (focus routing) per (layer, head, group), the `top_tokens` tokens by count and by lift.
    """
    rng = np.random.default_rng(config.seed)
    g = routing.num_groups
    cats = categories.numpy()
    labels = {"category": cats, "token": routing.tokens.numpy(),
              "position": routing.positions.numpy() * POSITION_BUCKETS // seq_len}
    n = len(cats)
    overall = np.bincount(cats, minlength=len(CATEGORY_NAMES)) / n
    token_ids, token_index = np.unique(labels["token"], return_inverse=True)
    token_total = np.bincount(token_index)
    layers_rows, share_rows, category_rows, top_rows = [], [], [], []
    num_layers, heads = routing.groups["focus"].shape[:2]
    for layer in range(num_layers):
        for head in range(heads):
            where = {"layer": layer, "head": head}
            for name in ROUTINGS:
                groups = routing.groups[name][layer, head].numpy()
                counts = np.bincount(groups, minlength=g)
                soft = routing.soft_mass[name][layer, head].numpy()
                row = {**where, "routing": name, **balance(counts),
                       "soft_normalised_entropy": balance(soft)["normalised_entropy"],
                       "confidence": float(routing.confidence[name][layer, head].mean())}
                for label, values in labels.items():
                    row[f"nmi_{label}"] = normalised_mutual_information(groups, values)
                    row[f"nmi_{label}_shuffled"] = shuffled_nmi(groups, values, config.shuffles, rng)
                layers_rows.append(row)
                share_rows += [{**where, "routing": name, "group": k, "count": int(counts[k]),
                                "share": counts[k] / n, "soft_share": soft[k] / soft.sum()} for k in range(g)]
            groups = routing.groups["focus"][layer, head].numpy()
            table = np.zeros((g, len(CATEGORY_NAMES)), dtype=np.int64)
            np.add.at(table, (groups, cats), 1)
            by_token = np.zeros((g, len(token_ids)), dtype=np.int64)
            np.add.at(by_token, (groups, token_index), 1)
            for k in range(g):
                size = table[k].sum()
                for c, name in enumerate(CATEGORY_NAMES):
                    share = table[k, c] / size if size else 0.0
                    category_rows.append({**where, "group": k, "category": name, "count": int(table[k, c]),
                                          "share": share, "lift": share / overall[c] if overall[c] else 0.0})
                top_rows += _top_tokens(where, k, by_token[k], token_total, token_ids, texts, n, config.top_tokens)
    return {"layers": pd.DataFrame(layers_rows), "shares": pd.DataFrame(share_rows),
            "categories": pd.DataFrame(category_rows), "top_tokens": pd.DataFrame(top_rows)}


def _top_tokens(where, group, in_group, total, ids, texts, n, top) -> list[dict]:
    """Rows of a group's top tokens by count and by lift = P(token | group) / P(token)."""
    size = in_group.sum()
    if size == 0:
        return []
    lift = (in_group / size) / (total / n)
    eligible = in_group >= _MIN_LIFT_COUNT
    rows = []
    for by, order in (("count", np.argsort(-in_group, kind="stable")),
                      ("lift", np.argsort(-np.where(eligible, lift, -1.0), kind="stable"))):
        picked = [t for t in order[:top] if in_group[t] > 0 and (by == "count" or eligible[t])]
        rows += [{**where, "group": group, "by": by, "rank": rank, "token_id": int(ids[t]),
                  "token": visible(texts[int(ids[t])]), "count": int(in_group[t]), "lift": float(lift[t])}
                 for rank, t in enumerate(picked, start=1)]
    return rows


def visible(text: str) -> str:
    """Token text with whitespace made visible: space as '␣', newline as '⏎', tab as '⇥'."""
    return text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥")


def resolve_layers(layers: list[int] | None, num_layers: int) -> list[int]:
    """The layers to plot: `layers` (negative from the end) checked against the model, or five evenly spaced."""
    if layers is None:
        return sorted(set(np.linspace(0, num_layers - 1, min(num_layers, 5)).round().astype(int).tolist()))
    bad = [x for x in layers if not -num_layers <= x < num_layers]
    if bad:
        raise ValueError(f"interpret.layers: layer {bad[0]} is out of range for a {num_layers}-layer model")
    return list(dict.fromkeys(x % num_layers for x in layers))


def summarise(tables: dict[str, pd.DataFrame], plot_layers: list[int], top: int = 5) -> dict:
    """The JSON summary: balance per routing, NMI against its chance level, the representative layer (the plotted
    layer whose groups follow categories most, above chance) with its groups, and the most distinctive groups."""
    layers = tables["layers"]
    focus = layers[layers["routing"] == "focus"]
    summary = {"balance": {}, "alignment": {}, "category_nmi_by_routing": {}}
    for name, part in layers.groupby("routing", sort=False):
        summary["balance"][name] = {
            "normalised_entropy": _spread(part["normalised_entropy"]),
            "soft_normalised_entropy": _spread(part["soft_normalised_entropy"]),
            "min_share": _spread(part["min_share"]),
            "max_share": _spread(part["max_share"]),
            "confidence": _spread(part["confidence"]),
        }
        summary["category_nmi_by_routing"][name] = {
            "nmi_mean": float(part["nmi_category"].mean()), "shuffled_mean": float(part["nmi_category_shuffled"].mean())}
    for label in ("category", "token", "position"):
        excess = focus[f"nmi_{label}"] - focus[f"nmi_{label}_shuffled"]
        best = focus.loc[excess.idxmax()]
        summary["alignment"][label] = {
            "nmi_mean": float(focus[f"nmi_{label}"].mean()),
            "shuffled_mean": float(focus[f"nmi_{label}_shuffled"].mean()),
            "excess_mean": float(excess.mean()),
            "best": {"layer": int(best["layer"]), "head": int(best["head"]), "nmi": float(best[f"nmi_{label}"]),
                     "shuffled": float(best[f"nmi_{label}_shuffled"])},
        }
    excess = (focus["nmi_category"] - focus["nmi_category_shuffled"]).groupby(focus["layer"]).mean()
    layer = int(excess[plot_layers].idxmax())
    in_layer = focus[focus["layer"] == layer]
    head = int(in_layer.loc[(in_layer["nmi_category"] - in_layer["nmi_category_shuffled"]).idxmax(), "head"])
    summary["representative"] = {"layer": layer, "head": head, "category_nmi_excess_by_layer": {
        int(k): round(float(v), 4) for k, v in excess.items()}}
    summary["representative_groups"] = _group_records(tables, layer, None, top)
    summary["distinctive_groups"] = _distinctive(tables, top)
    summary["purest_group_per_category"] = _purest(tables)
    categories = tables["categories"]
    first = categories[(categories["layer"] == 0) & (categories["head"] == 0)]
    totals = first.groupby("category", sort=False)["count"].sum()
    summary["category_shares"] = {name: float(totals[name] / totals.sum()) for name in CATEGORY_NAMES}
    return summary


def _spread(values: pd.Series) -> dict[str, float]:
    return {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max())}


def _group_records(tables: dict[str, pd.DataFrame], layer: int, head: int | None, top: int,
                   groups: list[int] | None = None) -> list[dict]:
    """Per group of `layer` (one head, or every head): its share, category shares and lifts, top tokens."""
    categories, tokens = tables["categories"], tables["top_tokens"]
    shares = tables["shares"][tables["shares"]["routing"] == "focus"]
    selected = categories[(categories["layer"] == layer) & ((categories["head"] == head) if head is not None else True)]
    records = []
    for (h, g), part in selected.groupby(["head", "group"], sort=True):
        if groups is not None and g not in groups:
            continue
        listed = tokens[(tokens["layer"] == layer) & (tokens["head"] == h) & (tokens["group"] == g)]
        share = shares[(shares["layer"] == layer) & (shares["head"] == h) & (shares["group"] == g)]["share"]
        records.append({
            "layer": layer, "head": int(h), "group": int(g), "share": float(share.iloc[0]),
            "categories": {row.category: round(float(row.share), 4) for row in part.itertuples()},
            "lift": {row.category: round(float(row.lift), 3) for row in part.itertuples()},
            "top_by_count": listed[listed["by"] == "count"]["token"].head(top).tolist(),
            "top_by_lift": listed[listed["by"] == "lift"]["token"].head(top).tolist(),
        })
    return records


def _purest(tables: dict[str, pd.DataFrame]) -> dict[str, dict]:
    """Per category (of at least 1% of the tokens): the group, in any layer and head, whose tokens are most often of
    that category (purity), among groups holding at least a quarter of an even share, and the fraction of all
    that category's tokens it holds (coverage)."""
    cats = tables["categories"]
    sizes = cats.groupby(["layer", "head", "group"])["count"].transform("sum")
    per_head = cats.groupby(["layer", "head", "category"])["count"].transform("sum")  # category total per head
    n = cats.groupby(["layer", "head"])["count"].sum().iloc[0]
    found = {}
    eligible = cats[sizes >= 0.25 * n / (cats["group"].max() + 1)].assign(coverage=cats["count"] / per_head)
    for name, part in eligible.groupby("category", sort=False):
        if part["count"].sum() / len(part.groupby(["layer", "head"])) < 0.01 * n:
            continue
        best = part.loc[part["share"].idxmax()]
        found[name] = {"layer": int(best["layer"]), "head": int(best["head"]), "group": int(best["group"]),
                       "purity": round(float(best["share"]), 4), "coverage": round(float(best["coverage"]), 4),
                       "lift": round(float(best["lift"]), 3)}
    return found


def _distinctive(tables: dict[str, pd.DataFrame], top: int, count: int = 8) -> list[dict]:
    """The `count` groups (any layer and head) whose category mix is furthest from that of all tokens
    (KL divergence), among groups holding at least a quarter of an even share of the tokens."""
    categories = tables["categories"]
    c = len(CATEGORY_NAMES)
    counts = categories["count"].to_numpy().reshape(-1, c).astype(np.float64)  # rows: (layer, head, group)
    keys = categories[["layer", "head", "group"]].to_numpy()[::c]
    sizes = counts.sum(axis=1)
    num_groups = int(categories["group"].max()) + 1
    n = sizes.sum() / len(np.unique(keys[:, :2], axis=0))  # tokens per (layer, head)
    overall = counts.sum(axis=0) / counts.sum()
    p = counts / np.maximum(sizes[:, None], 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(p > 0, p * np.log(p / overall), 0.0).sum(axis=1)
    kl[sizes < 0.25 * n / num_groups] = -np.inf
    found = []
    for index in np.argsort(-kl, kind="stable")[:count]:
        layer, head, group = (int(x) for x in keys[index])
        record = _group_records(tables, layer, head, top, groups=[group])[0]
        lifts = {name: lift for name, lift in record["lift"].items() if record["categories"][name] >= 0.1}
        enriched = max(lifts, key=lifts.get)
        found.append({**record, "kl_from_all_tokens": round(float(kl[index]), 4), "enriched_category": enriched})
    return found
