"""Which router and kernel compute a Focus attention call: decided once, here, from the call's facts.

`focus.attention.function` reads the facts of each call (`CallFacts`), asks `plan` and executes the `Plan` it gets;
no kernel decides again or falls back. The same function answers a user's question before any call is made:

    >>> from focus.attention import explain
    >>> print(explain(model, keys=4096))               # a 4,096-token prompt
    >>> print(explain(model, keys=4096, queries=1, cache="native"))  # one decoding step after it, in a FocusCache

What it reads: `FocusConfig` (mode, objective, window, routing, `dense_below`) and the call's facts
(`focus.attention.dispatch.facts.CallFacts`: shapes, device, the cache, the fast-path switch, what is installed). It
decides what the call computes (unmodified, soft, hard, a training objective) and which router routes it; the kernel of
hard Focus is the first row of `focus.attention.dispatch.kernel_table` that does not decline the call, each refusal
kept. docs/attention_plan.md has the table of which path runs when, written from this function
(`python -m focus.attention`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from focus.attention.dispatch.facts import CallFacts, decomposition_backend, flash_attn_installed
from focus.attention.dispatch.kernel_table import KERNEL_TABLE, choose_kernel
from focus.attention.routers.selectors import SELECTORS
from focus.config import FocusConfig

__all__ = ["KERNELS", "ROUTERS", "CallFacts", "Plan", "decomposition_backend", "explain", "flash_attn_installed",
           "plan", "plan_table"]

KERNELS = {
    "unmodified": "the model's own attention (PyTorch SDPA over the pairs the model allows)",
    **{kernel.name: kernel.text for kernel in KERNEL_TABLE},
}
"""What each kernel of a plan is; every one computes the dense masked reference's output."""

ROUTERS = {
    "none": "no routing: nothing uses groups",
    "eager": "PyTorch ops (focus.attention.routers.routing)",
    "native": "native CPU calls (focus.attention.native): the same groups within float32 rounding",
    "indexer": "a per-key indexer (focus.attention.routers.indexer): the budget's distant keys by a low-rank logit "
               "estimate",
    **{name: f"training-free (focus.attention.routers.selectors): {text}" for name, text in SELECTORS.items()},
}


@dataclass(frozen=True)
class Plan:
    """What one call computes (`attention`), how it routes (`router`, one of ROUTERS), what computes it (`kernel`,
    one of KERNELS; for "straight_through" the hard forward pass's, its soft gradient always "dense_masked"), why
    (`reason`) and, for a kernel of `KERNEL_TABLE`, why each row before it declined (`declined`: (kernel, reason)).
    """

    attention: str
    router: str
    kernel: str
    reason: str
    dense_rows: int = 0
    declined: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        rows = f", its first {self.dense_rows} queries unmodified (dense_below)" if self.dense_rows else ""
        refused = "".join(f"\n  not {name}: {why}" for name, why in self.declined)
        return f"{self.attention}: router {self.router}, kernel {self.kernel}{rows} -- {self.reason}{refused}"


def plan(config: FocusConfig, facts: CallFacts) -> Plan:
    """The plan of a call with `facts` on a layer set as `config` (under the fast-path switch the facts name)."""
    all_dense = facts.dense_rows >= facts.queries
    groups = config.selector == "centroids"
    if config.mode == "hard" and not groups and not facts.training:
        return _selector_plan(config, facts, all_dense)
    if facts.decoding_step and config.mode == "hard" and not facts.traced and config.window < facts.keys:
        if all_dense:
            return Plan("unmodified", "eager", "unmodified", f"the query is below dense_below={config.dense_below}",
                        facts.dense_rows)
        kernel, declined, reason = _kernel(config, facts)
        if kernel in ("native_step", "sparse_step", "masked_step"):
            return Plan("hard", "native" if kernel == "native_step" else "eager", kernel, reason, facts.dense_rows,
                        declined)
    router = "eager" if facts.cache != "none" or facts.traced else "none"  # a cache indexes its new keys
    if all_dense and not facts.traced:
        return Plan("unmodified", router, "unmodified", f"every query is below dense_below={config.dense_below}",
                    facts.dense_rows)
    if config.window >= facts.keys:
        return Plan("unmodified", router, "unmodified", f"every pair is within the window ({config.window})")
    if facts.training and config.objective == "attention_recall":
        return Plan("attention_recall", "eager", "unmodified", "the layer attends as the model; the routing is scored")
    if facts.training and config.objective == "straight_through":
        kernel, declined, reason = _kernel(config, replace(facts, gradients=False, cache="none"))
        return Plan("straight_through", "eager", kernel, f"hard forward pass without gradients: {reason}",
                    declined=declined)
    if config.mode == "soft":
        return Plan("soft", "eager", "dense_masked", "soft Focus charges every pair its gate", facts.dense_rows)
    kernel, declined, reason = _kernel(config, facts)
    return Plan("hard", "native" if kernel.startswith("decomposed_native") else "eager", kernel, reason,
                facts.dense_rows, declined)


def _kernel(config: FocusConfig, facts: CallFacts) -> tuple[str, tuple[tuple[str, str], ...], str]:
    """The kernel `KERNEL_TABLE` gives the call, the rows that declined it, and what the kernel takes."""
    kernel, declined = choose_kernel(config, facts)
    return kernel.name, declined, kernel.takes


def declined_text(declined: tuple[tuple[str, str], ...]) -> str:
    """The refusals of a plan in one line, kernels that declined for the same reason named together."""
    reasons: dict[str, list[str]] = {}
    for name, why in declined:
        reasons.setdefault(why, []).append(name)
    return "; ".join(f"{', '.join(names)}: {why}" for why, names in reasons.items())


def _selector_plan(config: FocusConfig, facts: CallFacts, all_dense: bool) -> Plan:
    """The plan of a hard call whose distant keys a selector picks per query (`focus.attention.routers.selectors`)."""
    if all_dense:
        return Plan("unmodified", "none", "unmodified", f"every query is below dense_below={config.dense_below}",
                    facts.dense_rows)
    if config.window >= facts.keys:
        return Plan("unmodified", "none", "unmodified", f"every pair is within the window ({config.window})")
    kernel, declined, reason = _kernel(config, facts)
    return Plan("hard", config.selector, kernel, reason, facts.dense_rows, declined)


def explain(
    model_or_config, keys: int, queries: int | None = None, cache: str = "none", device: str | None = None,
    training: bool = False, **facts,
) -> Plan:
    """The plan of a call a Focus model would make: `keys` tokens seen, the last `queries` of them new (default all:
    a prompt; 1 with a `cache` "eager" or "native": a decoding step), under the switches now in force.

    `model_or_config`: a model with Focus applied (its heads, device and `FocusConfig` are read) or a `FocusConfig`
    (SmolLM2's shapes unless `facts` give others: heads, k_heads, head_dim). Further `facts` are `CallFacts` fields.
    """
    queries = keys if queries is None else queries
    if isinstance(model_or_config, FocusConfig):
        config, shapes = model_or_config, {}
    else:
        layer = next((m for m in model_or_config.modules() if hasattr(m, "focus_config")), None)
        if layer is None:
            raise ValueError("explain: the model has no Focus layer (apply_focus first)")
        config, text = layer.focus_config, model_or_config.config.get_text_config()
        heads = text.num_attention_heads
        shapes = {"heads": heads, "k_heads": getattr(text, "num_key_value_heads", None) or heads,
                  "head_dim": getattr(text, "head_dim", None) or text.hidden_size // heads}
        device = device or next(model_or_config.parameters()).device.type
    below = 0 if training or config.dense_below == 0 else min(max(config.dense_below - (keys - queries), 0), queries)
    return plan(config, CallFacts(queries=queries, keys=keys, cache=cache, device=device or "cpu", training=training,
                                  dense_rows=below, **{**shapes, **facts}))


SCENARIOS = [  # (what the user does, FocusConfig changes from hard top-2 query routing, CallFacts, fast-path switch)
    ("prompt of 4K, no cache (model(ids), perplexity)", {}, dict(queries=4096, keys=4096), "auto"),
    ("the same on CUDA, flash-attn installed", {}, dict(queries=4096, keys=4096, device="cuda", flash_attn=True),
     "auto"),
    ("the same on CUDA without flash-attn", {}, dict(queries=4096, keys=4096, device="cuda", flash_attn=False), "auto"),
    ("prompt of 4K into a FocusCache (generate(), CPU)", {}, dict(queries=4096, keys=4096, cache="native"), "auto"),
    ("the same, keys route the queries (route_queries='key')", {"route_queries": "key"},
     dict(queries=4096, keys=4096, cache="native"), "auto"),
    ("the same, padding on the right", {}, dict(queries=4096, keys=4096, cache="native", left_padded=False), "auto"),
    ("the same, 70 groups", {"num_groups": 70}, dict(queries=4096, keys=4096, cache="native"), "auto"),
    ("the same, FocusCache(native=False)", {}, dict(queries=4096, keys=4096, cache="eager"), "auto"),
    ("the same in bfloat16 on a CPU with AMX", {}, dict(queries=4096, keys=4096, cache="native", dtype="bfloat16",
                                                        matrix_units=True), "auto"),
    ("the same in bfloat16 on a CPU without", {}, dict(queries=4096, keys=4096, cache="native", dtype="bfloat16",
                                                       matrix_units=False), "auto"),
    ("a chunk of 16 tokens after a cached past", {}, dict(queries=16, keys=4096, cache="native"), "auto"),
    ("decoding step at 4K keys (generate(), CPU)", {}, dict(queries=1, keys=4096, cache="native"), "auto"),
    ("decoding step at 200K keys, top-1", {"top_k": 1}, dict(queries=1, keys=200_000, cache="native"), "auto"),
    ("decoding step, index cropped or sinks not yet seen", {}, dict(queries=1, keys=4096, cache="native",
                                                                   index_current=False), "auto"),
    ("decoding step, FocusCache(native=False), 4K keys", {}, dict(queries=1, keys=4096, cache="eager"), "auto"),
    ("decoding step on CUDA, 200K keys, top-1", {"top_k": 1}, dict(queries=1, keys=200_000, cache="eager",
                                                                   device="cuda"), "auto"),
    ("decoding step, 70 groups", {"num_groups": 70}, dict(queries=1, keys=4096, cache="eager"), "auto"),
    ("prompt of 4K, dense_below=2048", {"dense_below": 2048}, dict(queries=4096, keys=4096, dense_rows=2048), "auto"),
    ("decoding step at 1K keys, dense_below=2048", {"dense_below": 2048},
     dict(queries=1, keys=1024, cache="native", dense_rows=1), "auto"),
    ("a prompt no longer than the window", {}, dict(queries=200, keys=200), "auto"),
    ("soft mode", {"mode": "soft"}, dict(queries=4096, keys=4096), "auto"),
    ("hard mode with gradients (outside training)", {}, dict(queries=4096, keys=4096, gradients=True), "auto"),
    ("training, straight-through (the default objective)", {"mode": "soft"},
     dict(queries=512, keys=512, gradients=True, training=True), "auto"),
    ("training, objective attention_recall", {"mode": "soft", "objective": "attention_recall"},
     dict(queries=512, keys=512, gradients=True, training=True), "auto"),
    ("a model that soft-caps its logits (Gemma 2)", {}, dict(queries=4096, keys=4096, softcap=True), "auto"),
    ("a sliding-window layer shorter than the keys (Gemma, Qwen2)", {},
     dict(queries=4096, keys=4096, model_window=1024), "auto"),
    ("a training-free peer at the same budget: selector='quest'", {"selector": "quest"},
     dict(queries=4096, keys=4096), "auto"),
    ("its decoding step", {"selector": "quest"}, dict(queries=1, keys=4096, cache="native"), "auto"),
    ("the per-key indexer (selector='indexer'), a prompt of 4K (CPU)", {"selector": "indexer"},
     dict(queries=4096, keys=4096, native_kernels=True), "auto"),
    ("the same in FocusCache(native=False)", {"selector": "indexer"}, dict(queries=4096, keys=4096, cache="eager"),
     "auto"),
    ("the same on CUDA", {"selector": "indexer"}, dict(queries=4096, keys=4096, device="cuda"), "auto"),
    ("its decoding step, from the cached key codes (generate(), CPU)", {"selector": "indexer"},
     dict(queries=1, keys=4096, cache="native"), "auto"),
    ("its step, FocusCache(native=False)", {"selector": "indexer"}, dict(queries=1, keys=4096, cache="eager"), "auto"),
    ("the indexer with a head kept dense (dense_heads=['l0h0'])", {"selector": "indexer", "dense_heads": ["l0h0"]},
     dict(queries=4096, keys=4096, native_kernels=True), "auto"),
    ("its step after the cache was cropped behind its key codes", {"selector": "indexer"},
     dict(queries=1, keys=4096, cache="native", index_current=False), "auto"),
    ("the switch pinned to the oracle: fast_path('dense')", {}, dict(queries=4096, keys=4096), "dense"),
    ("fast_path('torch'), a FocusCache prompt", {}, dict(queries=4096, keys=4096, cache="native"), "torch"),
]
"""The rows of docs/attention_plan.md: each a user's situation and the plan it gets."""


PLAN_TABLE_HEAD = """# Which attention path runs when

Written by `python -m focus.attention > docs/attention_plan.md` from `focus.attention.dispatch.planning.plan`, the one
function that decides (`tests/test_planning.py` checks that this file is its output). A layer set as
`FocusConfig(mode="hard", top_k=2, window=256, route_queries="query")` on SmolLM2's shapes (9 query heads, 3 key/value
heads of 64), on the CPU, except where a row says otherwise. Ask for any other call with
`focus.attention.explain(model, keys=..., queries=..., cache=...)`. The kernels of hard Focus are the rows of
`focus.attention.dispatch.kernel_table.KERNEL_TABLE`, asked in the order listed at the end: the first that does not
decline computes the call, and "declined" says why each one before it did (rows that compute only a decoding step, or
only one selector's, are not asked about other calls).
"""


def plan_table() -> str:
    """docs/attention_plan.md's text: every `SCENARIOS` row's plan, as a markdown table, and the kernels."""
    base = FocusConfig(mode="hard", top_k=2, window=256, route_queries="query")
    rows = ["| situation | attention | router | kernel | why | declined |", "|---|---|---|---|---|---|"]
    for situation, changes, facts, switch in SCENARIOS:
        chosen = plan(base.replace(**changes), CallFacts(**facts, fast_path=switch))
        rows_below = chosen.dense_rows if chosen.attention == "hard" else 0
        why = chosen.reason + (f"; its first {rows_below} queries unmodified" if rows_below else "")
        rows.append(f"| {situation} | {chosen.attention} | {chosen.router} | `{chosen.kernel}` | {why} | "
                    f"{declined_text(chosen.declined)} |")
    kernels = [f"- `{name}`: {text}" for name, text in KERNELS.items()]
    tests = "`tests/test_decomposed.py`, `tests/test_decoding.py`, `tests/test_native_step.py`"
    return "\n".join([PLAN_TABLE_HEAD, *rows, "", f"The kernels, each the dense masked reference's output ({tests}); "
                      "after the model's own, the rows of the table in the order the plan asks them:", "", *kernels,
                      ""])
