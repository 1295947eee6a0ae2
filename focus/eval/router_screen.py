"""Screen routers before training them: recall at budgets beside the oracle, and perplexity where it is asked for.

A router is named by a spec (`build_router`), so that a profile, a command line and a notebook say the same thing:

    indexer:RANK[:kv_head]   the per-key indexer at that rank, untrained: the keys' principal directions (Loki);
                             kv_head: one selection per key/value head
    centroids                Focus's groups (16, top-2) from k-means, ranked per query until the budget
    quest | streaming        the training-free peers
    adapter:FOLDER           a saved adapter: an indexer ranks by its indexer, any other by its groups

`screen_routers` measures each router on each corpus and length: the distant attention mass it keeps at each budget
and the oracle's at the same count (`focus.eval.recall_screen.routing_recall`), and, with `ppl_shares`, the perplexity
of every router that selects at a budget (indexer, peers) and of the oracle, against the pretrained model on the same
rows (paired 95% intervals). Budgets are shares of each query's distant keys below `long_from` tokens and keys per
query from it (what DeepSeek's DSA keeps: a count). Groups keep their top-k, not a budget: a groups router named in
`ppl_routers` is scored at its own hard pattern, beside the oracle that keeps as many distant pairs in every layer and
query row (`budget_kind` "pattern": the budget is the share of the distant pairs the pattern keeps).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Mapping, Sequence

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from focus.adapter import load_focus
from focus.config import FocusConfig
from focus.eval.diagnostics import distant_attention_recall, oracle_selection
from focus.eval.paired import paired_ratio
from focus.eval.perplexity import row_losses
from focus.eval.recall_screen import router_state, routing_recalls
from focus.retrofit import apply_focus, focus_config, focus_disabled, remove_focus, set_focus_mode

KINDS = ("indexer", "centroids", "quest", "streaming", "adapter")


def build_router(model: PreTrainedModel, spec: str, window: int, calibration: torch.Tensor | None) -> str:
    """Apply the router `spec` (see the module's doc) to `model`, calibrated on `calibration` (N, T) token ids;
    returns the kind `routing_recall` ranks its keys by."""
    kind, _, arg = spec.partition(":")
    if kind not in KINDS:
        raise ValueError(f"router spec {spec!r}: unknown kind {kind!r}; known: {list(KINDS)}")
    if kind == "adapter":
        load_focus(model, arg)
        set_focus_mode(model, "hard")
        return "indexer" if focus_config(model).selector == "indexer" else "centroids"
    if kind == "indexer":
        rank, _, route = arg.partition(":")
        if not rank.isdigit():
            raise ValueError(f"router spec {spec!r}: indexer:RANK[:kv_head] needs a rank, e.g. indexer:16")
        config = FocusConfig(selector="indexer", window=window, indexer_rank=int(rank), route_queries=route or "query")
    else:
        config = FocusConfig(window=window, mode="hard", selector=kind)  # centroids: Focus's groups; or a peer
    apply_focus(model, config, calibration_ids=calibration)
    return kind


def screen_routers(
    model: PreTrainedModel,
    routers: Mapping[str, str],
    corpora: Mapping[str, torch.Tensor],
    lengths: Sequence[int],
    rows: int | Mapping[int, int],
    shares: Sequence[float],
    keys: Sequence[int] = (),
    window: int = 128,
    calibration: torch.Tensor | None = None,
    long_from: int = 4096,
    last_queries: int = 1024,
    ppl_shares: Sequence[float] = (),
    ppl_keys: Sequence[int] = (),
    ppl_rows: int = 32,
    ppl_oracle: bool = True,
    report: Callable[[list, list, list], None] | None = None,
    ppl_routers: Collection[str] | None = None,
) -> tuple[list[dict], list[dict], list[dict]]:
    """Screen `routers` ({name: spec}) on `corpora` ({name: (T,) token ids of the split to screen on}).

    Args:
        rows: rows per length (one count for all, or {length: count}); ppl_rows: rows scored for perplexity.
        keys: budgets in keys per query, from `long_from` tokens (then the last `last_queries` queries of each row
            are measured); below it, `shares`. ppl_shares: perplexity at these shares below `long_from`, of the
            oracle too where `ppl_oracle`; ppl_keys: at these counts per query from `long_from` (not the oracle's:
            its ranking of every key by the true logits is a sort of L x L per head and layer). ppl_routers: the
            routers scored for perplexity (None: every one that selects keys; a groups router named here is scored
            at its hard pattern, and the oracle at the pattern's count where `ppl_oracle`: `_pattern_perplexities`).
        report: called with the three lists after every corpus and length (write them as they come).
    Returns:
        (recall, per-layer recall, perplexity) rows: corpus, length, router, budget and the shares of
        `routing_recall` / ppl, vs_pretrained, low, high.
    """
    found, layers, scored = [], [], []
    # (a screen to 8K runs for hours on a CPU: the log says which corpus, length and router it is at)
    progress = tqdm(total=len(corpora) * len(lengths) * (len(routers) + 1), desc="recall screen", unit="step")
    for corpus, ids in corpora.items():
        for length in lengths:
            count = rows if isinstance(rows, int) else rows[length]
            block = _rows(ids, length, count)
            long = length >= long_from
            budgets = list(keys) if long else list(shares)
            ppl_budgets = list(ppl_keys) if long else list(ppl_shares)
            ppl_block = _rows(ids, length, ppl_rows) if ppl_budgets or ppl_routers else None  # (a pattern: none)
            pretrained = None
            where = {"corpus": corpus, "length": length}
            states = {}  # each router as Focus's layers hold it, screened below in one pass per row
            for name, spec in routers.items():
                progress.set_postfix_str(f"{corpus} {length} {name}")
                kind = build_router(model, spec, window, calibration)
                try:
                    states[name] = (kind, router_state(model))
                    scored_here = ppl_block is not None and (name in ppl_routers if ppl_routers is not None
                                                             else kind != "centroids")  # (groups keep top-k)
                    if scored_here and (kind == "centroids" or ppl_budgets):
                        pretrained = pretrained if pretrained is not None else _pretrained(model, ppl_block)
                        here = {**where, "router": name}
                        scored += (_pattern_perplexities(model, here, block, ppl_block, pretrained,
                                                         oracle=ppl_oracle and not long) if kind == "centroids" else
                                   _perplexities(model, here, ppl_block, ppl_budgets, pretrained, keys=long))
                finally:
                    remove_focus(model)
                progress.update()
            progress.set_postfix_str(f"{corpus} {length} recall of every router")
            recalls = _recalls(model, block, states, budgets, last_queries if long else None)
            for name, spec in routers.items():
                result = recalls[name]
                for budget, shares_at in zip(budgets, result["overall"]):
                    found.append({**where, "router": name, "spec": spec, "budget": budget,
                                  "budget_kind": "keys" if long else "share", **shares_at})
                for layer, per_budget in enumerate(result["layers"]):
                    layers += [{**where, "router": name, "layer": layer, "budget": b, **s}
                               for b, s in zip(budgets, per_budget)]
            progress.update()
            if ppl_block is not None and ppl_oracle and ppl_shares and not long:
                apply_focus(model, FocusConfig(window=window), calibration_ids=calibration)
                try:
                    pretrained = pretrained if pretrained is not None else _pretrained(model, ppl_block)
                    scored += _perplexities(model, {**where, "router": "oracle"}, ppl_block, ppl_shares, pretrained,
                                            oracle=True)
                finally:
                    remove_focus(model)
            if report is not None:
                report(found, layers, scored)
    progress.close()
    return found, layers, scored


def _recalls(model: PreTrainedModel, block: torch.Tensor, states: Mapping[str, tuple], budgets: list,
             last_queries: int | None) -> dict[str, dict]:
    """`routing_recalls` of every router in `states` ({name: (kind, its router_state)}): one pass per
    row for those of one window and count of sinks (all of them, as a profile screens them), under a Focus of theirs."""
    found = {}
    groups: dict[tuple, dict] = {}
    for name, (kind, state) in states.items():
        config = state[0]["focus_config"]  # (every layer's window and sinks are the router's)
        groups.setdefault((config.window, config.sink_tokens), {})[name] = (kind, state)
    for (window, sinks), group in groups.items():
        # (a carrier: its layers take each router's state in turn, so its own centroids need no k-means)
        apply_focus(model, FocusConfig(window=window, sink_tokens=sinks), init_centroids=False)
        try:
            found.update(routing_recalls(model, block, group, budgets, last_queries=last_queries))
        finally:
            remove_focus(model)
    return found


def _rows(ids: torch.Tensor, length: int, count: int) -> torch.Tensor:
    count = min(count, len(ids) // length)
    if count < 1:
        raise ValueError(f"screen: {len(ids)} tokens hold no row of {length}")
    return ids[: count * length].long().view(count, length)


def _pretrained(model: PreTrainedModel, rows: torch.Tensor) -> torch.Tensor:
    with focus_disabled(model):
        return row_losses(model, rows, batch_size=1)


def _pattern_perplexities(model, where: dict, recall_rows: torch.Tensor, rows: torch.Tensor, pretrained: torch.Tensor,
                          oracle: bool) -> list[dict]:
    """The groups' perplexity at their own hard pattern and, with `oracle`, the oracle's at the same count of distant
    pairs in every layer and query row (what choosing better pairs alone could reach at their cost). Budget: the
    share of the distant pairs the pattern keeps on `recall_rows`; recall: the distant attention mass each keeps
    there (`distant_attention_recall`). `build_router` left the model in hard mode."""
    pattern = distant_attention_recall(model, recall_rows, batch_size=1)
    selections = [(where["router"], contextlib.nullcontext, pattern["recall"])]
    if oracle:
        selections.append(("oracle", oracle_selection, pattern["oracle_recall"]))
    found = []
    for router, selecting, recall in selections:
        with selecting(model):
            losses = row_losses(model, rows, batch_size=1)
        ratio, low, high = paired_ratio(losses.tolist(), pretrained.tolist())
        found.append({**where, "router": router, "budget": pattern["kept"], "budget_kind": "pattern",
                      "pattern": where["router"], "recall": recall, "ppl": math.exp(float(losses.mean())),
                      "vs_pretrained": ratio, "low": low, "high": high, "rows": rows.shape[0]})
    return found


def _perplexities(model, where: dict, rows: torch.Tensor, budgets: Sequence[float], pretrained: torch.Tensor,
                  oracle: bool = False, keys: bool = False) -> list[dict]:
    """Perplexity per budget: shares of the distant keys, or counts per query (`keys`)."""
    found = []
    for budget in budgets:
        if oracle:
            with oracle_selection(model, share=budget):
                losses = row_losses(model, rows, batch_size=1)
        else:
            set_focus_mode(model, "hard", **({"budget_keys": int(budget)} if keys else {"budget": budget}))
            losses = row_losses(model, rows, batch_size=1)
        ratio, low, high = paired_ratio(losses.tolist(), pretrained.tolist())
        found.append({**where, "budget": budget, "budget_kind": "keys" if keys else "share",
                      "ppl": math.exp(float(losses.mean())), "vs_pretrained": ratio, "low": low, "high": high,
                      "rows": rows.shape[0]})
    return found
