"""The per-key indexer (`focus.attention.routers.indexer`, issue 54): its selection against a per-query statement, its
KL loss against a per-query definition, its training on the frozen model, its adapter, and the recall screen."""

import json
import math

import pytest
import torch
from test_reference import padded_causal_mask
from test_training import tiny_llama

from focus import FocusConfig, apply_focus, load_focus, remove_focus, save_focus, set_focus_mode
from focus.adapter import WEIGHTS_NAME, AdapterError
from focus.attention.routers.indexer import (
    KEY_WEIGHTS,
    QUERY_WEIGHTS,
    indexer_loss,
    indexer_scores,
    principal_directions,
    top_scored,
)
from focus.attention.routers.routing import centroids_training, sink_keys
from focus.attention.routers.selectors import selected_pairs
from focus.config import ConfigError
from focus.eval.recall_screen import routing_recall
from focus.retrofit import attention_modules, focus_parameters
from focus.train.config import TrainConfig
from focus.train.loop import METRICS_NAME, train_parameters
from focus.train.objective import focus_objective

pytestmark = pytest.mark.usefixtures("one_thread")
WINDOW = 3


class Layer(torch.nn.Module):
    """What the indexer reads of a Focus layer: its config and its two weights."""

    def __init__(self, heads=4, k_heads=2, d=8, rank=3, seed=0, **changes):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.focus_config = FocusConfig(**{"mode": "hard", "window": WINDOW, "sink_tokens": 1, "unrotate": False,
                                           "selector": "indexer", "indexer_rank": rank, **changes})
        setattr(self, QUERY_WEIGHTS, torch.nn.Parameter(torch.randn(heads, d, rank, generator=gen)))
        setattr(self, KEY_WEIGHTS, torch.nn.Parameter(torch.randn(k_heads, d, rank, generator=gen)))


def case(seed=1, b=2, heads=4, k_heads=2, length=12, d=8):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, heads, length, d, generator=gen), torch.randn(b, k_heads, length, d, generator=gen)


@pytest.mark.parametrize("route_queries", ["query", "kv_head"])
def test_the_selection_keeps_each_querys_best_scored_distant_keys(route_queries):
    layer = Layer(route_queries=route_queries, budget=0.4)
    query, key = case()
    base = padded_causal_mask(2, 12, [0, 2])
    got = selected_pairs(layer, query, key, base, None)  # (B, H, Q, L)
    wq, wk = getattr(layer, QUERY_WEIGHTS).detach(), getattr(layer, KEY_WEIGHTS).detach()
    for row in range(2):
        real = [j for j in range(12) if base[row, 0, -1, j]]
        for head in range(4):
            kv = head // 2
            heads = [head] if route_queries == "query" else [2 * kv, 2 * kv + 1]
            for i in real:
                def score(j, row=row, i=i, kv=kv, heads=heads):
                    return sum(float((query[row, h, i] @ wq[h]) @ (key[row, kv, j] @ wk[kv])) for h in heads)

                distant = [j for j in real[1:] if i - j >= WINDOW]
                need = math.ceil(0.4 * len(distant))
                chosen = sorted(distant, key=lambda j: -score(j))[:need]
                free = [j for j in real if 0 <= i - j < WINDOW or j == real[0]]
                expected = torch.zeros(12, dtype=torch.bool)
                expected[free + chosen] = True
                assert torch.equal(got[row, head, i], expected), (row, head, i)


def test_top_scored_keeps_none_for_a_zero_need_and_every_distant_key_at_full_need():
    scores = torch.randn(1, 1, 3, 6)
    distant = torch.tensor([[[True, True, False, True, False, False]] * 3])[None]
    need = torch.tensor([0, 3, 1]).view(1, 1, 3, 1)
    kept = top_scored(scores, distant, need)
    assert not kept[0, 0, 0].any() and torch.equal(kept[0, 0, 1], distant[0, 0, 1])
    assert kept[0, 0, 2].sum() == 1 and kept[0, 0, 2, scores[0, 0, 2].masked_fill(~distant[0, 0, 2], -9).argmax()]


def _loop_indexer_loss(layer, query, key, mask, sinks):
    """The definition, one query (and query head) at a time: sum_i m_i KL(p_i || softmax(s_i)) / sum_i m_i."""
    b, h, length, d = query.shape
    k_heads = key.shape[1]
    scores = indexer_scores(layer, query, key).detach()
    numerator = denominator = 0.0
    for row in range(b):
        for head in range(h):
            kv = head // (h // k_heads)
            for i in range(length):
                allowed = [j for j in range(i + 1) if mask is None or mask[row, 0, i, j]]
                if not allowed:
                    continue
                logits = torch.stack([query[row, head, i] @ key[row, kv, j] / math.sqrt(d) for j in allowed])
                weights = dict(zip(allowed, torch.softmax(logits, dim=0).tolist()))
                distant = [j for j in allowed if i - j >= WINDOW and not (sinks is not None and sinks[row, j])]
                mass = sum(weights[j] for j in distant)
                if mass == 0:
                    continue
                log_q = torch.log_softmax(torch.stack([scores[row, head, i, j] for j in distant]), dim=0)
                kl = sum(weights[j] / mass * (math.log(weights[j] / mass) - float(lq)) for j, lq in zip(distant, log_q))
                numerator += mass * kl
                denominator += mass
    return numerator / denominator


def test_the_loss_matches_the_per_query_definition_and_trains_only_the_indexer():
    layer = Layer(rank=3)
    query, key = case()
    query.requires_grad_(True)
    mask = padded_causal_mask(2, 12, [0, 2])
    sinks = sink_keys(mask.any(dim=-2)[:, 0], 12, 1)
    loss = indexer_loss(layer, query, key, mask, sinks, None, None)
    assert loss.item() == pytest.approx(_loop_indexer_loss(layer, query, key, mask, sinks), rel=1e-4)
    loss.backward()
    assert query.grad is None  # the frozen model's activations are detached: only the indexer learns
    assert getattr(layer, QUERY_WEIGHTS).grad.abs().sum() > 0 and getattr(layer, KEY_WEIGHTS).grad.abs().sum() > 0


def test_a_full_rank_indexer_of_orthonormal_directions_scores_the_true_logits_and_loses_nothing():
    query, key = case(d=8)
    layer = Layer(rank=8)
    basis = principal_directions(torch.einsum("bkld,bkle->kde", key, key), 8)  # (K, 8, 8), orthonormal columns
    with torch.no_grad():
        getattr(layer, KEY_WEIGHTS).copy_(basis)
        getattr(layer, QUERY_WEIGHTS).copy_(basis.repeat_interleave(2, dim=0))
    true = torch.einsum("bhqd,bhld->bhql", query, key.repeat_interleave(2, dim=1)) / math.sqrt(8)
    torch.testing.assert_close(indexer_scores(layer, query, key), true, atol=1e-5, rtol=1e-5)
    assert indexer_loss(layer, query, key, None, None, None, None).item() == pytest.approx(0.0, abs=1e-5)


def test_principal_directions_are_the_keys_largest_first():
    moment = torch.diag(torch.tensor([1.0, 5.0, 3.0, 0.5]))[None]
    directions = principal_directions(moment, 2)[0]
    assert torch.allclose(directions.abs(), torch.eye(4)[:, [1, 2]])


def test_the_config_sets_the_indexers_objective_and_refuses_what_cannot_train_it():
    assert FocusConfig(selector="indexer").objective == "attention_recall"
    assert FocusConfig(selector="indexer").trained_mode == "hard"
    with pytest.raises(ConfigError, match="attention_recall"):
        FocusConfig(selector="indexer", objective="language_model")
    with pytest.raises(ConfigError, match="route_queries"):
        FocusConfig(selector="indexer", route_queries="key")
    with pytest.raises(ConfigError, match="indexer_rank"):
        FocusConfig(selector="indexer", indexer_rank=0)


def _indexed_llama(rank=4, **changes):
    model = tiny_llama()
    data = torch.randint(0, 128, (8, 48), generator=torch.Generator().manual_seed(1))
    apply_focus(model, FocusConfig(window=8, selector="indexer", indexer_rank=rank, budget=0.3, **changes),
                calibration_ids=data)
    return model, data


def test_training_moves_only_the_indexer_lowers_its_loss_and_keeps_the_model_output(tmp_path):
    model, data = _indexed_llama()
    module = attention_modules(model)[0]
    assert not module.focus_centroids.requires_grad and getattr(module, KEY_WEIGHTS).requires_grad
    assert focus_parameters(model) == [p for p in model.parameters() if p.requires_grad]
    with torch.enable_grad():
        assert centroids_training(module)
    set_focus_mode(model, "hard")
    with torch.no_grad():
        dense = _dense_logits(model, data[:2])
    before = [p.detach().clone() for p in focus_parameters(model)]
    config = TrainConfig(steps=15, batch_size=4, lr=1e-2, log_every=1, checkpoint_every=0)
    train_parameters(model, data, config, tmp_path, objective=focus_objective(model), progress=False)
    lines = [json.loads(line) for line in (tmp_path / METRICS_NAME).read_text().splitlines()]
    assert lines[-1]["train/recall_loss"] < lines[0]["train/recall_loss"]
    assert all(not torch.equal(a, b) for a, b in zip(before, focus_parameters(model)))
    with torch.enable_grad():  # the warm-up's forward pass is the model's own
        torch.testing.assert_close(model(input_ids=data[:2]).logits, dense, atol=1e-5, rtol=1e-5)


def _dense_logits(model, ids):
    from focus.retrofit import focus_disabled

    with focus_disabled(model):
        return model(input_ids=ids).logits


def test_an_indexer_adapter_saves_and_loads_its_weights_and_refuses_one_without_them(tmp_path):
    model, data = _indexed_llama(route_queries="kv_head")
    with torch.no_grad():
        for p in focus_parameters(model):
            p.add_(torch.randn_like(p))
        expected = model(input_ids=data[:2]).logits
    save_focus(model, tmp_path / "adapter")
    fresh = tiny_llama()
    load_focus(fresh, tmp_path / "adapter")
    with torch.no_grad():
        torch.testing.assert_close(fresh(input_ids=data[:2]).logits, expected)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "adapter" / WEIGHTS_NAME))
    del tensors["layers.1.indexer_key"]
    save_file(tensors, str(tmp_path / "adapter" / WEIGHTS_NAME))
    with pytest.raises(AdapterError, match="layers.1.indexer_key"):
        load_focus(tiny_llama(), tmp_path / "adapter")


def test_the_screen_gives_the_full_rank_indexer_the_oracles_recall_and_bounds_the_others():
    model, data = _indexed_llama(rank=8)  # tiny_llama: head size 8, so the principal directions span every key
    budgets = [0.25, 0.5, 3, 1.0]
    exact = routing_recall(model, data[:3], "indexer", budgets)
    recent = routing_recall(model, data[:3], "streaming", budgets)
    for shares in exact["overall"]:
        assert shares["recall"] == pytest.approx(shares["oracle_recall"], rel=1e-5)
    for shares in recent["overall"][:3]:
        assert shares["recall"] < shares["oracle_recall"]
    assert recent["overall"][-1]["recall"] == pytest.approx(1.0) and recent["overall"][-1]["kept"] == 1.0
    assert exact["overall"][0]["kept"] == pytest.approx(0.25, abs=0.05)
    assert len(exact["layers"]) == 2 and len(exact["heads"][0]) == 2
    remove_focus(model)


@pytest.mark.parametrize("router", ["indexer", "streaming", "quest", "centroids"])
def test_the_screen_ranks_keys_only_as_far_as_its_budgets_keep_and_tallies_what_ranking_all_tallies(monkeypatch,
                                                                                                  router):
    """The screen ranks each query's distant keys by a top-k as deep as the largest budget needs, not a sort of all
    of them (a third of the time at 8K): the same tallies as ranking every key, the oracle's to the bit; a unit
    router's (a group's, a page's keys share a score) within the mass of the unit its budget cuts."""
    import focus.eval.recall_screen as screen

    model, data = _indexed_llama(rank=4)
    budgets = [0.1, 0.3, 5]
    short = routing_recall(model, data[:3], router, budgets)
    monkeypatch.setattr(screen, "_most_kept", lambda needs: data.shape[1])  # every key ranked
    every = routing_recall(model, data[:3], router, budgets)
    for ours, theirs in zip(short["overall"] + sum(short["layers"], []), every["overall"] + sum(every["layers"], [])):
        assert ours["oracle_recall"] == theirs["oracle_recall"] and ours["kept"] == theirs["kept"]
        tied = router in ("quest", "centroids")
        assert ours["recall"] == pytest.approx(theirs["recall"], abs=0.02 if tied else 1e-6)
    remove_focus(model)


def test_routers_screened_in_one_pass_tally_what_each_screened_alone_tallies_and_leave_the_model_as_it_was():
    """`routing_recalls` runs the model once per row for several routers (each layer takes each router's state in
    turn): the same tallies, to the bit, as a pass per router; the Focus it ran under keeps its state dict."""
    from focus.eval.recall_screen import router_state, routing_recalls
    from focus.eval.router_screen import build_router

    model = tiny_llama()
    data = torch.randint(0, 128, (3, 48), generator=torch.Generator().manual_seed(5))
    budgets = [0.1, 0.3, 5]
    specs = {"loki": "indexer:4:kv_head", "groups": "centroids", "quest": "quest", "recent": "streaming"}
    alone, states = {}, {}
    for name, spec in specs.items():
        kind = build_router(model, spec, 8, data)
        alone[name] = routing_recall(model, data, kind, budgets)
        states[name] = (kind, router_state(model))
        remove_focus(model)
    apply_focus(model, FocusConfig(window=8), init_centroids=False)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    together = routing_recalls(model, data, states, budgets)
    assert together == alone
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[key], before[key]) for key in before)
    with pytest.raises(ValueError, match="another window or sinks"):
        apply_focus(remove_focus(model), FocusConfig(window=16), init_centroids=False)
        routing_recalls(model, data, states, budgets)
    remove_focus(model)


def test_a_long_calls_loss_is_the_mean_over_evenly_spaced_queries(monkeypatch):
    import focus.attention.routers.indexer as indexer

    layer = Layer(rank=3)
    query, key = case(length=40)
    mask = padded_causal_mask(2, 40, [0, 5])
    sinks = sink_keys(mask.any(dim=-2)[:, 0], 40, 1)
    monkeypatch.setattr(indexer, "LOSS_QUERIES", 10)
    torch.manual_seed(3)
    rows = indexer.loss_queries(40)
    assert len(rows) == 10 and torch.equal(rows.diff(), torch.full((9,), 4)) and 0 <= int(rows[0]) < 4
    torch.manual_seed(3)
    sampled = indexer_loss(layer, query, key, mask, sinks, None, None)
    # The same queries, scored as one call of all queries whose other rows carry no distant mass.
    kept = torch.zeros(40, dtype=torch.bool)
    kept[rows] = True
    only = mask & kept[None, None, :, None]
    monkeypatch.setattr(indexer, "LOSS_QUERIES", 512)
    assert sampled.item() == pytest.approx(indexer_loss(layer, query, key, only, sinks, None, None).item(), rel=1e-5)


def test_the_screen_stage_writes_its_tables_figures_and_provenance(tmp_path):
    from safetensors.torch import save_file

    from focus.pipeline.screens import recall_screen

    ids = torch.randint(3, 128, (4096,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    tokens = tmp_path / "corpus.safetensors"
    save_file({"train": ids, "validation": ids.flip(0)}, str(tokens))
    stem = tmp_path / "tables" / "recall_screen"
    recall_screen("tiny:llama", "float32", {"loki": "indexer:4:kv_head", "groups": "centroids"}, {"corpus": tokens},
                  tokens, seq_len=32, calibration_rows=2, window=8, split="validation", lengths=[32, 48], rows=2,
                  shares=[0.2, 0.5], keys=[8], last_queries=16, stem=stem, command="snakemake tables/recall_screen.csv",
                  ppl_shares=[0.5], ppl_rows=2, ppl_routers=["loki"],
                  figure=tmp_path / "figures" / "recall_screen.png")  # (where the rule asks: beside the figures)
    import pandas as pd

    scored = pd.read_csv(stem.parent / "recall_screen_perplexity.csv")  # the router asked for, and the oracle
    assert sorted(set(zip(scored["router"], scored["length"]))) == [("loki", 32), ("loki", 48), ("oracle", 32),
                                                                    ("oracle", 48)]
    assert (scored["budget"] == 0.5).all() and (scored["rows"] == 2).all()

    frame = pd.read_csv(stem.with_suffix(".csv"))
    assert sorted(set(zip(frame["router"], frame["length"]))) == [("groups", 32), ("groups", 48), ("loki", 32),
                                                                   ("loki", 48)]
    assert (frame["recall"] <= frame["oracle_recall"] + 1e-9).all()
    first = stem.with_suffix(".md").read_text().splitlines()[0]
    assert first.startswith("*Made at commit ") and "re-make: `snakemake tables/recall_screen.csv`" in first
    for name in ("recall_screen_layers.csv", "recall_screen.provenance.json"):
        assert (stem.parent / name).stat().st_size > 0, name
    for name in ("recall_screen.png", "recall_screen.svg", "recall_screen_layers.png", "recall_screen_layers.svg"):
        assert (tmp_path / "figures" / name).stat().st_size > 0, name

    # Groups asked for perplexity with no budget (configs/study.yaml's part 4): the table the rule declares is written.
    recall_screen("tiny:llama", "float32", {"groups": "centroids"}, {"corpus": tokens}, tokens, seq_len=32,
                  calibration_rows=2, window=8, split="validation", lengths=[32], rows=2, shares=[0.5], keys=[],
                  last_queries=16, stem=stem, command="snakemake tables/recall_screen.csv", ppl_rows=2,
                  ppl_routers=["groups"])
    scored = pd.read_csv(stem.parent / "recall_screen_perplexity.csv")
    assert list(zip(scored["router"], scored["budget_kind"])) == [("groups", "pattern"), ("oracle", "pattern")]


def test_the_screens_figure_is_a_grid_of_corpora_by_lengths_and_one_row_at_one_length():
    """Three corpora at three lengths were nine panels in a line (4,776 pixels wide); now a row per corpus, a column
    per length, a blank panel where a corpus lacks a length; a screen of one length keeps its corpora side by side."""
    import pandas as pd

    from focus.artifacts import pyplot
    from focus.eval.recall_report import _panels

    cells = [("wikitext2", 512), ("wikitext2", 2048), ("novel", 512), ("novel", 2048), ("novel", 8192)]
    fig, axes, panels = _panels(pd.DataFrame(cells, columns=["corpus", "length"]), height=3.0)
    assert axes.shape == (2, 3) and not axes[0][2].get_visible()
    assert [(key, ax) for ax, key, _ in panels] == [(cell, axes[i][j]) for cell, (i, j) in
                                                    zip(cells, [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)])]
    pyplot().close(fig)
    fig, axes, panels = _panels(pd.DataFrame([("a", 512), ("b", 512), ("c", 512)], columns=["corpus", "length"]), 3.0)
    assert axes.shape == (1, 3) and [key for _, key, _ in panels] == [("a", 512), ("b", 512), ("c", 512)]
    pyplot().close(fig)


def test_the_screen_cells_one_a_job_gather_into_the_tables_one_process_writes(tmp_path):
    """Rule recall_screen_cell measures one corpus and length a job (a screen of hours resumes where it stopped) and
    rule recall_screen gathers them: the same rows as the whole screen in one process, whichever cell ran first."""
    import pandas as pd
    from safetensors.torch import save_file

    from focus.pipeline.screens import gather_recall_screen, recall_screen, recall_screen_cell

    ids = torch.randint(3, 128, (4096,), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    tokens = {"a": tmp_path / "a.safetensors", "b": tmp_path / "b.safetensors"}
    save_file({"train": ids, "validation": ids.flip(0)}, str(tokens["a"]))
    save_file({"train": ids.flip(0), "validation": ids}, str(tokens["b"]))
    routers = {"loki": "indexer:4:kv_head", "groups": "centroids"}
    settings = dict(seq_len=32, calibration_rows=2, window=8, split="validation", rows=2, shares=[0.2, 0.5], keys=[8],
                    last_queries=16, ppl_shares=[0.5], ppl_rows=2, ppl_routers=["loki"])
    whole = tmp_path / "whole" / "recall_screen"
    recall_screen("tiny:llama", "float32", routers, tokens, tokens["a"], lengths=[32, 64], stem=whole,
                  command="snakemake", **settings)
    cells = {(corpus, length): tmp_path / "cells" / corpus / f"{length}.json"
             for corpus in tokens for length in (32, 64)}
    for (corpus, length), out in reversed(cells.items()):
        recall_screen_cell("tiny:llama", "float32", routers, corpus, tokens[corpus], tokens["a"], length=length,
                           out=out, **settings)
    gathered = tmp_path / "gathered" / "recall_screen"
    gather_recall_screen(list(cells.values()), "tiny:llama", "float32", stem=gathered, command="snakemake",
                         **{key: settings[key] for key in ("window", "split", "rows", "last_queries", "ppl_shares",
                                                            "ppl_routers")})
    for suffix in (".csv", "_layers.csv", "_perplexity.csv"):
        expected = pd.read_csv(whole.parent / f"recall_screen{suffix}")
        pd.testing.assert_frame_equal(pd.read_csv(gathered.parent / f"recall_screen{suffix}"), expected)
    assert set(pd.read_csv(whole.with_suffix(".csv"))["corpus"]) == {"a", "b"}
    header = gathered.with_suffix(".md").read_text().split("\n\n")[1]
    assert "Measured at commit " in header and "(a 32" not in header  # (one commit and machine: no list of cells)


def test_a_screen_given_tokens_for_perplexity_scores_as_many_rows_as_they_fill_at_each_length(tmp_path):
    """`ppl_tokens` instead of `ppl_rows`: the short lengths are scored on more rows, never fewer than two."""
    import pandas as pd
    from safetensors.torch import save_file

    from focus.pipeline.screens import recall_screen

    ids = torch.randint(3, 128, (4096,), generator=torch.Generator().manual_seed(4), dtype=torch.int32)
    tokens = tmp_path / "corpus.safetensors"
    save_file({"train": ids, "validation": ids.flip(0)}, str(tokens))
    stem = tmp_path / "recall_screen"
    recall_screen("tiny:llama", "float32", {"loki": "indexer:4:kv_head"}, {"corpus": tokens}, tokens, seq_len=32,
                  calibration_rows=2, window=8, split="validation", lengths=[32, 64, 128], rows=1, shares=[0.5],
                  keys=[], last_queries=16, stem=stem, command="snakemake", ppl_shares=[0.5], ppl_tokens=160)
    scored = pd.read_csv(tmp_path / "recall_screen_perplexity.csv")
    rows = scored[scored["router"] == "loki"].set_index("length")["rows"].to_dict()
    assert rows == {32: 5, 64: 2, 128: 2}


def test_the_screen_scores_perplexity_at_a_count_of_keys_from_its_long_lengths():
    """From `long_from` the screen's perplexity is at counts of keys per query (the routers' own, set through
    `budget_keys`), not the oracle's; below it at shares, the oracle's too. Each budget a different perplexity."""
    from focus.eval.router_screen import screen_routers

    model = tiny_llama()
    ids = torch.randint(3, 128, (4096,), generator=torch.Generator().manual_seed(2))
    _, _, scored = screen_routers(model, {"loki": "indexer:4:kv_head"}, {"corpus": ids}, [32, 64], 1, [0.3], [2, 16],
                                  window=8, calibration=ids[:64].view(2, 32), long_from=64, last_queries=16,
                                  ppl_shares=[0.3], ppl_keys=[2, 16], ppl_rows=2)
    rows = {(row["length"], row["router"], row["budget_kind"], row["budget"]): row for row in scored}
    assert set(rows) == {(32, "loki", "share", 0.3), (32, "oracle", "share", 0.3), (64, "loki", "keys", 2),
                         (64, "loki", "keys", 16)}
    assert rows[(64, "loki", "keys", 2)]["ppl"] != rows[(64, "loki", "keys", 16)]["ppl"]
    assert all(row["rows"] == 2 for row in scored)


def test_groups_named_for_perplexity_are_scored_at_their_own_pattern_beside_the_oracle_at_its_count():
    """The groups keep top-k, not a budget: named in `ppl_routers`, the screen scores them at their hard pattern (the
    perplexity the model gives in hard mode, computed here directly) and the oracle keeping as many distant pairs per
    row; the pattern's kept share is the budget of both, and the oracle keeps more of the distant mass."""
    from focus.eval.paired import paired_ratio
    from focus.eval.perplexity import row_losses
    from focus.eval.router_screen import screen_routers
    from focus.retrofit import focus_disabled

    model = tiny_llama()
    ids = torch.randint(3, 128, (4096,), generator=torch.Generator().manual_seed(3))
    calibration = ids[:64].view(2, 32)
    _, _, scored = screen_routers(model, {"groups": "centroids"}, {"corpus": ids}, [32], 2, [0.3], window=8,
                                  calibration=calibration, ppl_rows=3, ppl_routers=["groups"])
    rows = {row["router"]: row for row in scored}
    assert sorted(rows) == ["groups", "oracle"]
    assert {row["budget_kind"] for row in scored} == {"pattern"} and {row["pattern"] for row in scored} == {"groups"}
    assert rows["groups"]["budget"] == rows["oracle"]["budget"] and 0 < rows["groups"]["budget"] < 1
    assert rows["groups"]["recall"] < rows["oracle"]["recall"] <= 1
    assert rows["groups"]["ppl"] != rows["oracle"]["ppl"]

    apply_focus(model, FocusConfig(window=8, mode="hard"), calibration_ids=calibration)  # the same k-means groups
    block = ids[: 3 * 32].view(3, 32)
    losses = row_losses(model, block, batch_size=1)
    with focus_disabled(model):
        pretrained = row_losses(model, block, batch_size=1)
    assert rows["groups"]["ppl"] == pytest.approx(math.exp(float(losses.mean())), rel=1e-5)
    assert rows["groups"]["vs_pretrained"] == pytest.approx(paired_ratio(losses.tolist(), pretrained.tolist())[0],
                                                            abs=1e-6)


def test_a_rank_above_the_head_size_is_refused_before_the_model_is_touched():
    model = tiny_llama()  # head size 8
    with pytest.raises(ValueError, match="indexer_rank 9 exceeds the head size 8"):
        apply_focus(model, FocusConfig(window=8, selector="indexer", indexer_rank=9))
    from focus.retrofit import has_focus

    assert not has_focus(model) and all(p.requires_grad for p in model.parameters())


def native_indexer_step(layer, step, key, value, codes, base, scaling):
    """The native step (`csrc/indexer_step.cpp`) as its row runs it."""
    from focus.attention.cache.key_codes import KeyCodes
    from focus.attention.dispatch.kernel_runs import run_indexer_native_step
    from focus.attention.kernels.call import AttentionCall, CallState

    index = KeyCodes(key.shape[0], key.shape[1], codes.shape[-1], key.device, native=True)
    index.extend(codes, 0)
    call = AttentionCall(step, key, value, base, scaling, 0.0, None, None)
    return run_indexer_native_step(CallState(layer, index), call)


def eager_indexer_step(layer, step, key, value, codes, base, scaling):
    from focus.attention.routers.indexer import indexer_decode_attention

    return indexer_decode_attention(layer, step, key, value, codes, base, scaling)


STEPS = [pytest.param(eager_indexer_step, id="eager"), pytest.param(native_indexer_step, id="native")]


@pytest.mark.parametrize("step_kernel", STEPS)
@pytest.mark.parametrize("route_queries", ["query", "kv_head"])
@pytest.mark.parametrize("budget", [0.0, 0.3, 1.0])
def test_the_indexer_step_is_the_dense_reference_over_its_selection(step_kernel, route_queries, budget):
    """One decoding step from the cached key codes (the kept keys read by index, eager or native) = attention under
    the selection mask `selected_pairs` makes, with left padding, the window and a sink."""
    from focus.attention.pattern.reference import dense_attention
    from focus.attention.routers.indexer import key_codes

    layer = Layer(route_queries=route_queries, budget=budget)
    query, key = case(seed=5, length=20)
    value = torch.randn_like(key)
    base = padded_causal_mask(2, 20, [3, 0])[..., -1:, :]  # (B, 1, 1, L): row 0 left-padded
    step = query[:, :, -1:]
    expected = dense_attention(step, key, value, selected_pairs(layer, step, key, base, None), None, 8**-0.5)
    with torch.no_grad():
        got = step_kernel(layer, step, key, value, key_codes(layer, key), base, None)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_the_native_indexer_step_keeps_what_the_eager_one_keeps_at_length_in_both_dtypes():
    """A longer cache (several parts per selection over the cores), two sinks, a count budget, query heads per key/value
    head of 3, bfloat16 too: the native step = the eager step."""
    from focus.attention.routers.indexer import key_codes

    layer = Layer(heads=6, k_heads=2, d=16, rank=4, route_queries="kv_head", budget_keys=700, sink_tokens=2)
    query, key = case(seed=7, heads=6, length=3000, d=16)
    value = torch.randn_like(key)
    base = padded_causal_mask(2, 3000, [11, 0])[..., -1:, :]
    step = query[:, :, -1:]
    with torch.no_grad():
        for dtype, tolerance in ((torch.float32, 1e-6), (torch.bfloat16, 2e-2)):
            args = [x.to(dtype) for x in (step, key, value)]
            codes = key_codes(layer, args[1])
            expected = eager_indexer_step(layer, *args, codes, base, None)
            got = native_indexer_step(layer, *args, codes, base, None)
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), expected.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("native", [False, True])
def test_generate_with_the_indexer_steps_through_its_key_codes_as_the_dense_path_decodes(native):
    """generate() through a FocusCache: the prompt caches every key's code, each step runs the indexer's step from them
    (`indexer_step` eager, `indexer_native_step` native) after its prompt (`indexer_prompt`, `indexer_native_prompt`),
    the tokens and logits are the dense masked path's (the fast-path switch pinned to it)."""
    import focus.attention.function as function
    from focus.attention.cache.decoding import FocusCache
    from focus.attention.cache.key_codes import KeyCodes
    from focus.attention.dispatch.fast_path import fast_path

    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    apply_focus(model, FocusConfig(mode="hard", window=8, selector="indexer", indexer_rank=4, budget=0.3,
                                   route_queries="kv_head"), calibration_ids=ids[:, :32])
    kernels, made = [], function.plan

    def recording(config, facts):
        chosen = made(config, facts)
        kernels.append(chosen.kernel)
        return chosen

    function.plan = recording
    try:
        with torch.no_grad():
            cache = FocusCache(model, native=native)
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6,
                                 min_new_tokens=6, past_key_values=cache, output_logits=True,
                                 return_dict_in_generate=True)
            with fast_path("dense"):
                dense = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6,
                                       min_new_tokens=6, past_key_values=FocusCache(model), output_logits=True,
                                       return_dict_in_generate=True)
    finally:
        function.plan = made
    layers = model.config.num_hidden_layers
    assert kernels[: 6 * layers] == ["indexer_native_prompt" if native else "indexer_prompt"] * layers + [
        "indexer_native_step" if native else "indexer_step"] * 5 * layers
    assert torch.equal(out.sequences, dense.sequences)
    torch.testing.assert_close(torch.stack(out.logits), torch.stack(dense.logits), atol=1e-5, rtol=1e-5)
    codes = next(iter(cache.indexes.values()))
    assert isinstance(codes, KeyCodes) and codes.length == 45 and codes.codes.shape == (2, 2, 45, 4)


def test_a_prompt_within_the_window_attends_unmodified_and_still_fills_the_key_codes():
    """Every pair of a prompt no longer than the window is attended as the unmodified model does; the FocusCache still
    keeps every key's code, so that the steps beyond the window can select."""
    from focus.attention.cache.decoding import FocusCache

    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(ids).logits
    apply_focus(model, FocusConfig(mode="hard", window=32, selector="indexer", indexer_rank=4, budget=0.3),
                calibration_ids=ids)
    cache = FocusCache(model)
    with torch.no_grad():
        got = model(ids, past_key_values=cache, use_cache=True).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert all(codes.length == 24 for codes in cache.indexes.values())


def test_a_count_of_keys_per_query_replaces_the_share():
    """`budget_keys`: each query keeps that many distant keys (all where it has fewer), in the selection and the
    step."""
    from focus.attention.pattern.reference import dense_attention
    from focus.attention.routers.indexer import distant_need, indexer_decode_attention, key_codes

    config = FocusConfig(selector="indexer", budget=0.3, budget_keys=4)
    assert distant_need(config, torch.tensor([0, 3, 4, 100])).tolist() == [0, 3, 4, 4]
    assert distant_need(config.replace(budget_keys=0), torch.tensor([10])).tolist() == [3]
    with pytest.raises(ConfigError, match="budget_keys must be >= 0"):
        FocusConfig(budget_keys=-1)
    layer = Layer(route_queries="kv_head", budget_keys=5)
    query, key = case(seed=6, length=30)
    value = torch.randn_like(key)
    step = query[:, :, -1:]
    pairs = selected_pairs(layer, step, key, None, None)
    assert (pairs.sum(dim=-1) == 5 + WINDOW + 1).all()  # the count, the window, the sink
    torch.testing.assert_close(indexer_decode_attention(layer, step, key, value, key_codes(layer, key), None, None),
                               dense_attention(step, key, value, pairs, None, 8**-0.5), atol=1e-6, rtol=1e-5)
