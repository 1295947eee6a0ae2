"""How much of the pretrained model's attention a Focus pattern keeps: the measurement behind routing choices.

`distant_attention_recall` runs a Focus model with its own, unmodified attention and, in every layer, sets the
pretrained attention weights beside the hard top-k pattern routed from the same queries and keys. Over the distant
pairs (beyond the window, sink keys excluded: those are the pairs routing decides), it reports the share of the
attention mass the pattern keeps (recall) and the share of the pairs it keeps (what it costs). A routing that keeps
more mass at the same cost loses less when it sparsifies; a routing no better than chance keeps as much mass as pairs.
The oracle keeps, in every query row, the same number of distant pairs as the pattern but the heaviest ones: no
routing can recall more at that cost, so recall / oracle recall is how much of the possible a routing achieves.

`oracle_selection` makes that oracle the model's attention: every layer keeps its window, its sinks and, per query
row, the heaviest distant pairs, as many as the model's own hard pattern keeps in that row (or, with `share`, that
share of the row's distant pairs). Its perplexity is what a routing that chose pairs by the true attention weights
would score at Focus's cost: the bar a better routing could reach, and, when the pretrained model still beats it, the
sign that the cost itself, not the routing, loses.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from focus.attention.pattern.reference import (
    dense_attention,
    hard_allowed,
    local_pairs,
    model_allowed,
    split_query_heads,
    unmodified_attention,
)
from focus.attention.routers.centroids import top_k_groups
from focus.attention.routers.routing import key_positions, route_call, routing_vectors
from focus.attention.routers.selectors import selected_pairs
from focus.models import input_device
from focus.retrofit import attention_modules, has_focus, head_shape, set_focus_mode

_RECALL = "focus_recall"
_KEPT = "focus_kept"
_ORACLE = "focus_oracle"
_NEEDLE = "focus_needle"
_TALLY = "_focus_recall_tally"  # per module, (K, 6) per key/value head: mass kept, distant mass, pairs kept, distant
# pairs, all mass, oracle mass (distant_pairs_kept: (2,), pairs kept and distant pairs over every head)


@torch.no_grad()
def distant_attention_recall(model: PreTrainedModel, rows: torch.Tensor, batch_size: int = 4) -> dict:
    """Recall of the pretrained model's distant attention under the model's hard Focus pattern.

    Args:
        model: a model with Focus applied (its FocusConfig's window, top_k and routing are used, in hard top-k
            form whatever its mode); it runs with its own attention, so every layer sees the pretrained inputs.
        rows: (N, L) token ids, unpadded.
    Returns:
        {"recall": distant attention mass kept / distant attention mass, "kept": distant pairs kept / distant
         pairs, "oracle_recall": the mass of the heaviest distant pairs, as many per query row as the pattern keeps
         there, / distant mass, "distant_mass": share of all attention mass on distant pairs, "lost": share of all
         attention mass on the distant pairs the pattern drops, "layers": [the same per layer], "heads": [[the same
         per key/value head] per layer]}; sums over every query head (of the key/value head), query and row.
    """
    if not has_focus(model):
        raise ValueError("distant_attention_recall needs a model with Focus applied")
    tallies = _tallies(model, rows, batch_size, _RECALL, _recall_attention)
    return {**_shares(sum(t.sum(dim=0) for t in tallies)), "layers": [_shares(t.sum(dim=0)) for t in tallies],
            "heads": [[_shares(head) for head in t] for t in tallies]}


@torch.no_grad()
def distant_pairs_kept(model: PreTrainedModel, rows: torch.Tensor, batch_size: int = 4) -> float:
    """The share of distant pairs the model's hard Focus pattern keeps on `rows` (N, L): `distant_attention_recall`'s
    "kept", without the attention weights and the oracle's sort its other shares need (on two 8K rows of SmolLM2 those
    took 17 GB and passed 14 minutes on 2 cores; the pattern alone, a boolean per pair, under 5 minutes)."""
    if not has_focus(model):
        raise ValueError("distant_pairs_kept needs a model with Focus applied")
    kept, distant = sum(_tallies(model, rows, batch_size, _KEPT, _kept_attention)).tolist()
    return kept / max(distant, 1)


def _tallies(model: PreTrainedModel, rows: torch.Tensor, batch_size: int, name: str, function) -> list[torch.Tensor]:
    """Each layer's tally after `rows` ran through `model` in batches, every layer attending through `function`
    (registered as `name`), which adds its call's counts to the module's `_TALLY`."""
    modules = attention_modules(model)
    for module in modules:
        setattr(module, _TALLY, 0)
    try:
        with _attending(model, name, function):
            for batch in rows.split(batch_size):
                model(input_ids=batch.to(input_device(model)), use_cache=False)
        return [getattr(module, _TALLY) for module in modules]
    finally:
        for module in modules:
            delattr(module, _TALLY)


def heads_by_lost_attention(model: PreTrainedModel, rows: torch.Tensor, batch_size: int = 1) -> list[tuple[str, float]]:
    """Every key/value head of `model` as a `FocusConfig.dense_heads` entry ('l<layer>h<head>') with the share of its
    attention mass that its hard pattern drops on `rows` (`distant_attention_recall`'s "lost"), most first: the heads
    Focus hurts most, and so the candidates to keep dense. Score on the text the dense heads are for (pass-key prompts:
    `focus.eval.needle.needle_prompt`)."""
    recall = distant_attention_recall(model, rows, batch_size)
    modules = attention_modules(model)
    scored = [(f"l{module.layer_idx}h{head}", share["lost"])
              for module, heads in zip(modules, recall["heads"]) for head, share in enumerate(heads)]
    return sorted(scored, key=lambda item: -item[1])


@torch.no_grad()
def heads_by_loss(model: PreTrainedModel, rows: torch.Tensor, batch_size: int = 4) -> list[tuple[str, float]]:
    """Every key/value head of `model` as a `FocusConfig.dense_heads` entry with how much keeping it dense (besides
    the heads already dense) lowers the mean next-token loss on `rows` (N, L), most first: the heads whose sparsity
    costs the most on that text. One forward of `rows` per head; the model's dense heads are restored after."""
    if not has_focus(model):
        raise ValueError("heads_by_loss needs a model with Focus applied (it names Focus's heads)")
    config = attention_modules(model)[0].focus_config
    device = input_device(model)

    def mean_loss() -> float:
        total, count = 0.0, 0
        for batch in rows.split(batch_size):
            batch = batch.to(device)
            logits = model(input_ids=batch).logits[:, :-1].float()
            total += float(F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum"))
            count += batch[:, 1:].numel()
        return total / count

    base = mean_loss()
    scored = []
    try:
        for module in attention_modules(model):
            for head in range(head_shape(model)[0]):
                name = f"l{module.layer_idx}h{head}"
                if name in config.dense_heads:
                    continue
                set_focus_mode(model, config.mode, dense_heads=[*config.dense_heads, name])
                scored.append((name, base - mean_loss()))
    finally:
        set_focus_mode(model, config.mode, dense_heads=list(config.dense_heads))
    return sorted(scored, key=lambda item: -item[1])


@torch.no_grad()
def heads_by_needle_attention(
    model: PreTrainedModel, rows: torch.Tensor, spans: list[tuple[int, int]], last: int = 8
) -> list[tuple[str, float]]:
    """Every key/value head of `model` as a `FocusConfig.dense_heads` entry with the attention mass that the last
    `last` queries of pass-key prompts put on the needle (mean over prompts, queries and the head's query heads),
    most first: the retrieval heads (Wu et al. 2024, RazorAttention), measured in the pretrained model (Focus off).

    Args:
        rows: (N, L) pass-key prompts (`focus.eval.needle.needle_prompt`), unpadded; spans: each one's needle [start, end).
    """
    if not has_focus(model):
        raise ValueError("heads_by_needle_attention needs a model with Focus applied (it names Focus's heads)")
    modules = attention_modules(model)
    for module in modules:
        setattr(module, _TALLY, 0)
    with _attending(model, _NEEDLE, _needle_attention):
        for row, span in zip(rows, spans):
            for module in modules:
                module._focus_needle = (span, last)
            model(input_ids=row[None].to(input_device(model)), use_cache=False)
    tallies = [getattr(module, _TALLY) for module in modules]
    for module in modules:
        delattr(module, _TALLY)
        del module._focus_needle
    scored = [(f"l{module.layer_idx}h{head}", float(mass) / len(rows))
              for module, tally in zip(modules, tallies) for head, mass in enumerate(tally)]
    return sorted(scored, key=lambda item: -item[1])


def _needle_attention(module: nn.Module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                      **kwargs):
    """The unmodified attention, tallying per key/value head the mass of the last queries on the needle span."""
    (start, end), last = module._focus_needle
    b, h, q_len, d = query.shape
    k_heads, k_len = key.shape[1], key.shape[2]
    q = query[:, :, -last:].float().unflatten(1, (k_heads, h // k_heads))  # (B, K, R, last, D)
    logits = torch.einsum("bkrqd,bkld->bkrql", q, key.float()) * (d**-0.5 if scaling is None else scaling)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    allowed = torch.arange(k_len, device=key.device)[None] <= torch.arange(k_len - last, k_len, device=key.device)[:, None]
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    mass = weights[..., start:end].sum(dim=-1).mean(dim=(0, 2, 3))  # (K,)
    setattr(module, _TALLY, getattr(module, _TALLY) + mass.double().cpu())
    base_mask = None if attention_mask is None else attention_mask[..., :k_len]
    out = unmodified_attention(query, key, value, base_mask, scaling, dropout, softcap)
    return out.transpose(1, 2).contiguous(), None


def _shares(tally: torch.Tensor) -> dict[str, float]:
    kept_mass, distant_mass, kept_pairs, distant_pairs, all_mass, oracle_mass = tally.tolist()
    return {"recall": kept_mass / max(distant_mass, 1e-30), "kept": kept_pairs / max(distant_pairs, 1),
            "oracle_recall": oracle_mass / max(distant_mass, 1e-30),
            "distant_mass": distant_mass / max(all_mass, 1e-30), "lost": (distant_mass - kept_mass) / max(all_mass, 1e-30)}


def _kept_attention(module: nn.Module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                    **kwargs):
    """The unmodified attention, counting the distant pairs the hard Focus pattern of this call keeps (over every
    query head) and the distant pairs there are."""
    kept, distant, _ = _pattern(module, query, key, value, attention_mask, kwargs.get("position_ids"))
    distant_pairs = distant.sum(dtype=torch.float64) * query.shape[1] * (query.shape[0] // distant.shape[0])
    tally = torch.stack([(kept & distant).sum(dtype=torch.float64), distant_pairs]).cpu()
    setattr(module, _TALLY, getattr(module, _TALLY) + tally)
    base_mask = None if attention_mask is None else attention_mask[..., :key.shape[2]]
    out = unmodified_attention(query, key, value, base_mask, scaling, dropout, softcap)
    return out.transpose(1, 2).contiguous(), None


def _recall_attention(module: nn.Module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                      **kwargs):
    """The unmodified attention, tallying what the hard Focus pattern of this call keeps of it."""
    kept, distant, logits, allowed = _pattern_and_logits(module, query, key, value, attention_mask, scaling, softcap,
                                                         kwargs.get("position_ids"))
    k_len = key.shape[2]
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)  # (B, H, Q, L)
    distant = distant.expand_as(weights)
    kept_distant = kept & distant
    # The oracle: per query row, the heaviest distant pairs, as many as the pattern keeps in that row.
    ranked = weights.masked_fill(~distant, -1.0).sort(dim=-1, descending=True).values.clamp_min(0.0)
    count = kept_distant.sum(dim=-1, keepdim=True)  # (B, H, Q, 1)
    k_heads = key.shape[1]

    def per_head(x):  # (B, H, Q, L) -> (K,) float64 sums
        return x.double().unflatten(1, (k_heads, -1)).transpose(0, 1).reshape(k_heads, -1).sum(dim=-1)

    oracle_kept = ranked * (torch.arange(k_len, device=query.device) < count)
    tally = torch.stack([per_head(weights * kept_distant), per_head(weights * distant), per_head(kept_distant),
                         per_head(distant), per_head(weights), per_head(oracle_kept)], dim=-1).cpu()  # (K, 6)
    setattr(module, _TALLY, getattr(module, _TALLY) + tally)
    base_mask = None if attention_mask is None else attention_mask[..., :k_len]
    out = unmodified_attention(query, key, value, base_mask, scaling, dropout, softcap)
    return out.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def oracle_selection(model: PreTrainedModel, share: float | None = None) -> Iterator[PreTrainedModel]:
    """Within the block, every Focus layer of `model` attends to its window, its sinks and, per query row, its
    heaviest distant pairs by the true attention logits: as many as its hard Focus pattern keeps in that row, or,
    with `share`, that share of the row's distant pairs (rounded to the nearest count; the routing plays no part).

    The explicit (dense) attention computes it: for evaluation at moderate lengths, not for speed.
    """
    if not has_focus(model):
        raise ValueError("oracle_selection needs a model with Focus applied")
    if share is not None and not 0 <= share <= 1:
        raise ValueError(f"oracle_selection: share must be within [0, 1], got {share}")
    with _attending(model, _ORACLE, functools.partial(_oracle_attention, share=share)):
        yield model


@contextlib.contextmanager
def _attending(model: PreTrainedModel, name: str, function) -> Iterator[PreTrainedModel]:
    """Within the block every layer of `model` attends through `function`, registered under `name` (with the model's
    mask); the attention the model had is back afterwards."""
    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, sdpa_mask)
    current = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(current)


def _oracle_attention(module: nn.Module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                      share=None, **kwargs):
    kept, distant, logits, allowed = _pattern_and_logits(module, query, key, value, attention_mask, scaling, softcap,
                                                         kwargs.get("position_ids"), with_kept=share is None)
    if share is None:
        count = (kept & distant).sum(dim=-1, keepdim=True)  # (B, H, Q, 1) the pattern's distant pairs per row
    else:
        count = (distant.sum(dim=-1, keepdim=True) * share).round()  # (B or 1, 1, Q, 1)
    chosen = (allowed & ~distant) | _heaviest(logits.masked_fill(~distant, float("-inf")), count)
    out = dense_attention(query, key, value, chosen, None, scaling, softcap)
    return out.transpose(1, 2).contiguous(), None


def _heaviest(scores: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Per row of `scores` (-inf where not eligible), its `count` highest entries (count: broadcastable to (..., 1),
    at most the row's finite entries; equal scores at the cut in top-k's order): a top-k as deep as the largest count,
    its first `count` scattered. Two sorts of every row (the ranks) took several times as long."""
    chosen = torch.zeros_like(scores, dtype=torch.bool)
    most = int(count.max()) if count.numel() else 0
    if most == 0:
        return chosen
    order = scores.topk(most, dim=-1).indices  # (..., most), highest first
    first = torch.arange(most, device=scores.device) < count.expand(*scores.shape[:-1], 1)
    return chosen.scatter_(-1, order, first)  # (each row's indices are distinct: no write lands on another)


def _pattern_and_logits(module: nn.Module, query, key, value, attention_mask, scaling, softcap, position_ids,
                        with_kept: bool = True):
    """(kept, distant, logits, allowed) of one call: `_pattern`'s and the float32 attention logits (B, H, Q, L)."""
    kept, distant, allowed = _pattern(module, query, key, value, attention_mask, position_ids, with_kept)
    h, d, k_heads = query.shape[1], query.shape[3], key.shape[1]
    logits = torch.einsum("bhqd,bhld->bhql", query.float(), key.float().repeat_interleave(h // k_heads, dim=1))
    logits = logits * (d**-0.5 if scaling is None else scaling)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return kept, distant, logits, allowed


def _pattern(module: nn.Module, query, key, value, attention_mask, position_ids, with_kept: bool = True):
    """(kept, distant, allowed) of one call: the hard Focus pattern (B, H, Q, L) bool per query head (None without
    `with_kept`: an oracle at a share needs only the rest), the distant pairs it routes (beyond the window, sinks
    excluded; (B or 1, 1, Q, L)) and the pairs the model allows ((B or 1, 1, Q, L))."""
    config = module.focus_config
    b, h, q_len, d = query.shape
    k_heads, k_len = key.shape[1], key.shape[2]
    base_mask = None if attention_mask is None else attention_mask[..., :k_len]
    positions = key_positions(position_ids, k_len, key.device)
    key_vectors = routing_vectors(module, key if config.route_on == "key" else value, positions)
    routed = route_call(module, query, key_vectors, base_mask, positions)
    sinks = routed.sinks
    if not with_kept:
        kept = None
    elif config.selector != "centroids":  # a training-free peer's pattern (`focus.attention.routers.selectors`)
        kept = selected_pairs(module, query, key, base_mask, position_ids)
    else:
        groups_q = top_k_groups(routed.query_log_assign, config.top_k)
        groups = top_k_groups(routed.key_log_assign, config.top_k)
        kept = hard_allowed(groups_q, groups, config.num_groups, config.window, base_mask, sinks, routed.dense)
        kept = split_query_heads(kept, k_heads).expand(b, k_heads, h // k_heads, q_len, k_len).flatten(1, 2)

    allowed = model_allowed(base_mask, q_len, k_len, query.device)  # (B or 1, 1, Q, L)
    distant = allowed & ~local_pairs(q_len, k_len, config.window, query.device)
    if sinks is not None:
        distant = distant & ~sinks[:, None, None, :]
    return kept, distant, allowed
