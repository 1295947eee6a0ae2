"""Which router and kernel compute a Focus attention call: decided once, here, from the call's facts.

`focus.attention.function` reads the facts of each call (`CallFacts`), asks `plan` and executes the `Plan` it gets;
no kernel decides again or falls back. The same function answers a user's question before any call is made:

    >>> from focus.attention import explain
    >>> print(explain(model, keys=4096))               # a 4,096-token prompt
    >>> print(explain(model, keys=4096, queries=1, cache="native"))  # one decoding step after it, in a FocusCache

The switches it reads: `FocusConfig` (mode, objective, window, routing, `dense_below`), the fast-path switch
(`focus.attention.fast_path`), the cache (`FocusCache`: none, eager, native) and what is installed (flash-attn, the
native kernels' head-size limit). docs/attention_plan.md has the table of which path runs when, written from this
function (`python -m focus.attention`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from focus.attention.fast_path import current_fast_path
from focus.attention.group_bits import GROUP_BITS
from focus.attention.native import MAX_DIM as NATIVE_MAX_DIM
from focus.attention.selectors import SELECTORS
from focus.attention.step_cost import NATIVE_STEP_BELOW, sparse_step_pays
from focus.config import FocusConfig

KERNELS = {
    "unmodified": "the model's own attention (PyTorch SDPA over the pairs the model allows)",
    "dense_masked": "PyTorch SDPA under the Focus mask over every pair (the oracle, `focus.attention.reference`)",
    "decomposed_torch": "the decomposition (focus.attention.decomposed): a band and group segments, PyTorch kernels",
    "decomposed_flash": "the decomposition, every group segment in one flash-attn varlen call (CUDA)",
    "decomposed_native": "the query-routed decomposition as four native CPU calls (band, segments, rectangles, merge)",
    "masked_step": "a decoding step over every cached key under the mask the index's group bits make",
    "sparse_step": "a decoding step over the keys of the query's groups, read through the index's group lists",
    "native_step": "a decoding step as one native CPU call: routing, index upkeep, the kept keys' attention",
}
"""What each kernel of a plan is; every one computes the dense masked reference's output."""

ROUTERS = {
    "none": "no routing: nothing uses groups",
    "eager": "PyTorch ops (focus.attention.routing)",
    "native": "native CPU calls (focus.attention.native): the same groups within float32 rounding",
    "indexer": "a per-key indexer (focus.attention.indexer): the budget's distant keys by a low-rank logit estimate",
    **{name: f"training-free (focus.attention.selectors): {text}" for name, text in SELECTORS.items()},
}


@dataclass(frozen=True)
class CallFacts:
    """What decides the path of one attention call: read from the call (`focus.attention.function`) or stated
    (`explain`).

    queries, keys: Q and L of the call (a decoding step: Q = 1 with a cache); heads, k_heads, head_dim: its shapes.
    cache: "none", or the group index a `FocusCache` keeps ("eager", "native": whether it runs the native kernels).
    index_current: the index needs only the call's new keys (not cropped, every row's sink tokens seen).
    left_padded: padding, if any, is only on the left. gradients: a gradient flows through the query or the key.
    training: the centroids are training (`centroids_training`). traced: the routing logits are recorded.
    softcap, dropout: the model soft-caps its logits or drops attention weights; model_window: its own sliding
    window, or None. dense_rows: the first queries that attend as the unmodified model (`dense_below`).
    flash_attn: whether flash-attn imports (None: `flash_attn_installed` looks).
    """

    queries: int
    keys: int
    heads: int = 9
    k_heads: int = 3
    head_dim: int = 64
    device: str = "cpu"
    cache: str = "none"
    index_current: bool = True
    left_padded: bool = True
    gradients: bool = False
    training: bool = False
    traced: bool = False
    softcap: bool = False
    dropout: bool = False
    model_window: int | None = None
    dense_rows: int = 0
    flash_attn: bool | None = None  # flash-attn imports here (None: look)


@dataclass(frozen=True)
class Plan:
    """What one call computes (`attention`), how it routes (`router`, one of ROUTERS), what computes it (`kernel`,
    one of KERNELS; for "straight_through" the hard forward pass's, its soft gradient always "dense_masked"), and
    why (`reason`: the fact that ruled the faster kernel out, or the choice)."""

    attention: str
    router: str
    kernel: str
    reason: str
    dense_rows: int = 0

    def __str__(self) -> str:
        rows = f", its first {self.dense_rows} queries unmodified (dense_below)" if self.dense_rows else ""
        return f"{self.attention}: router {self.router}, kernel {self.kernel}{rows} -- {self.reason}"


def plan(config: FocusConfig, facts: CallFacts) -> Plan:
    """The plan of a call with `facts` on a layer set as `config`, under the fast-path switch now in force."""
    switch = current_fast_path()
    cached = facts.cache != "none"
    all_dense = facts.dense_rows >= facts.queries
    fast = _fast_path_blocker(facts, switch)  # None: a fast path may compute it
    if config.mode == "hard" and config.selector != "centroids" and not facts.training:
        return _selector_plan(config, facts, all_dense)
    if cached and facts.queries == 1 and config.mode == "hard" and not facts.traced and config.window < facts.keys:
        if all_dense:
            return Plan("unmodified", "eager", "unmodified", f"the query is below dense_below={config.dense_below}",
                        facts.dense_rows)
        if fast is None:
            return _step_plan(config, facts)
    router = "eager" if cached or facts.traced else "none"  # a cache indexes its new keys whatever attends
    if all_dense and not facts.traced:
        return Plan("unmodified", router, "unmodified", f"every query is below dense_below={config.dense_below}",
                    facts.dense_rows)
    if config.window >= facts.keys:
        return Plan("unmodified", router, "unmodified", f"every pair is within the window ({config.window})")
    if facts.training and config.objective == "attention_recall":
        return Plan("attention_recall", "eager", "unmodified", "the layer attends as the model; the routing is scored")
    if facts.training and config.objective == "straight_through":
        kernel, reason = _hard_kernel(config, replace(facts, gradients=False), switch, native=False)
        return Plan("straight_through", "eager", kernel, f"hard forward pass without gradients: {reason}")
    if config.mode == "soft":
        return Plan("soft", "eager", "dense_masked", "soft Focus charges every pair its gate", facts.dense_rows)
    blocker = _native_prefill_blocker(config, facts) if facts.cache == "native" else None
    kernel, reason = _hard_kernel(config, facts, switch, native=facts.cache == "native" and blocker is None)
    if blocker and kernel == "decomposed_torch":
        reason = f"{reason}; not the native prefill: {blocker}"
    return Plan("hard", "native" if kernel == "decomposed_native" else "eager", kernel, reason, facts.dense_rows)


def _selector_plan(config: FocusConfig, facts: CallFacts, all_dense: bool) -> Plan:
    """The plan of a hard call whose distant keys a selector picks per query (`focus.attention.selectors`)."""
    if all_dense:
        return Plan("unmodified", "none", "unmodified", f"every query is below dense_below={config.dense_below}",
                    facts.dense_rows)
    if config.window >= facts.keys:
        return Plan("unmodified", "none", "unmodified", f"every pair is within the window ({config.window})")
    return Plan("hard", config.selector, "dense_masked",
                "a per-query selector: its keys differ per query and fit no group index", facts.dense_rows)


def _fast_path_blocker(facts: CallFacts, switch: str) -> str | None:
    """Why no fast path (decomposition, decoding step) can compute the call, or None where one can."""
    if switch == "dense":
        return "the fast-path switch is 'dense'"
    if facts.softcap:
        return "the model soft-caps its logits"
    if facts.dropout:
        return "attention dropout"
    if facts.model_window is not None and facts.model_window < facts.keys:
        return f"the model's own window ({facts.model_window}) is shorter than the keys"
    if facts.gradients:
        return "a gradient flows through the attention"
    return None


def _hard_kernel(config: FocusConfig, facts: CallFacts, switch: str, native: bool) -> tuple[str, str]:
    """The kernel of a hard call without a decoding step, and why."""
    blocker = _fast_path_blocker(facts, switch)
    if blocker is None and facts.queries != facts.keys:
        blocker = "queries after a cached past (the decomposition takes whole sequences)"
    if blocker is not None:
        return "dense_masked", blocker
    if native and switch == "auto":
        return "decomposed_native", "a native FocusCache's prompt on the CPU, query-routed"
    backend = decomposition_backend(facts.device, facts.flash_attn)
    if switch != "auto":
        return f"decomposed_{backend}", f"the fast-path switch is {switch!r}"
    if backend == "flash":
        return "decomposed_flash", "a whole sequence on CUDA, flash-attn installed"
    return "decomposed_torch", "a whole sequence" + ("; flash-attn is not installed" if facts.device == "cuda" else "")


def decomposition_backend(device: str, flash_attn: bool | None = None) -> str:
    """The decomposition's backend for a call on `device` ("cpu", "cuda"): the one the fast-path switch pins ("flash",
    "torch"), else flash-attn on CUDA where it is installed (`flash_attn`; None: look), else "torch"."""
    switch = current_fast_path()
    if switch in ("flash", "torch"):
        return switch
    installed = flash_attn_installed() if flash_attn is None else flash_attn
    return "flash" if device == "cuda" and installed else "torch"


def _native_prefill_blocker(config: FocusConfig, facts: CallFacts) -> str | None:
    """Why a native FocusCache's hard prompt cannot run the native prefill, or None where it can."""
    if facts.device != "cpu":
        return f"the native kernels run on the CPU, the call on {facts.device}"
    if facts.traced:
        return "the routing logits are traced"
    if config.route_queries == "key":
        return "queries routed by their keys (route_queries='key')"
    if facts.head_dim > NATIVE_MAX_DIM:
        return f"head size {facts.head_dim} > {NATIVE_MAX_DIM}"
    if config.num_groups > GROUP_BITS:
        return f"{config.num_groups} groups > {GROUP_BITS}"
    if not facts.left_padded:
        return "padding not only on the left"
    return None


def _step_plan(config: FocusConfig, facts: CallFacts) -> Plan:
    """The kernel of a hard decoding step with a cache, a fast path allowed."""
    routing_heads = facts.k_heads if config.route_queries == "kv_head" else facts.heads
    has_bits = config.num_groups <= GROUP_BITS
    pays = sparse_step_pays(config.num_groups, config.top_k, routing_heads, facts.k_heads, facts.keys)
    if facts.cache == "native":
        blocker = (f"the native kernels run on the CPU, the call on {facts.device}" if facts.device != "cpu"
                   else f"{config.num_groups} groups > {GROUP_BITS}" if not has_bits
                   else "the index is cropped or a row's sink tokens are not all seen" if not facts.index_current
                   else None)
        if blocker is None and (facts.keys < NATIVE_STEP_BELOW or not pays):
            return Plan("hard", "native", "native_step", "a native FocusCache's step on the CPU", facts.dense_rows)
        blocker = blocker or f"{facts.keys} keys >= {NATIVE_STEP_BELOW}, where the sparse step pays"
        why = f"; not the native step: {blocker}"
    else:
        why = ""
    if not has_bits:
        return Plan("hard", "eager", "sparse_step", f"{config.num_groups} groups > {GROUP_BITS}: no group bits{why}")
    if pays:
        return Plan("hard", "eager", "sparse_step", f"{facts.keys} keys: the sparse step pays{why}")
    return Plan("hard", "eager", "masked_step", f"{facts.keys} keys: below the sparse step's break-even{why}")


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


@functools.cache
def flash_attn_installed() -> bool:
    """Whether flash-attn's varlen kernel imports here."""
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except ImportError:
        return False
    return True


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
    ("a chunk of 16 tokens after a cached past", {}, dict(queries=16, keys=4096, cache="native"), "auto"),
    ("decoding step at 4K keys (generate(), CPU)", {}, dict(queries=1, keys=4096, cache="native"), "auto"),
    ("decoding step at 100K keys, top-1", {"top_k": 1}, dict(queries=1, keys=100_000, cache="native"), "auto"),
    ("decoding step, index cropped or sinks not yet seen", {}, dict(queries=1, keys=4096, cache="native",
                                                                   index_current=False), "auto"),
    ("decoding step, FocusCache(native=False), 4K keys", {}, dict(queries=1, keys=4096, cache="eager"), "auto"),
    ("decoding step on CUDA, 100K keys, top-1", {"top_k": 1}, dict(queries=1, keys=100_000, cache="eager",
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
    ("the switch pinned to the oracle: fast_path('dense')", {}, dict(queries=4096, keys=4096), "dense"),
    ("fast_path('torch'), a FocusCache prompt", {}, dict(queries=4096, keys=4096, cache="native"), "torch"),
]
"""The rows of docs/attention_plan.md: each a user's situation and the plan it gets."""


PLAN_TABLE_HEAD = """# Which attention path runs when

Written by `python -m focus.attention > docs/attention_plan.md` from `focus.attention.planning.plan`, the one function
that decides (`tests/test_planning.py` checks that this file is its output). A layer set as
`FocusConfig(mode="hard", top_k=2, window=256, route_queries="query")` on SmolLM2's shapes (9 query heads, 3 key/value
heads of 64), on the CPU, except where a row says otherwise. Ask for any other call with
`focus.attention.explain(model, keys=..., queries=..., cache=...)`.
"""


def plan_table() -> str:
    """docs/attention_plan.md's text: every `SCENARIOS` row's plan, as a markdown table, and the kernels."""
    from focus.attention.fast_path import fast_path

    base = FocusConfig(mode="hard", top_k=2, window=256, route_queries="query")
    rows = ["| situation | attention | router | kernel | why |", "|---|---|---|---|---|"]
    for situation, changes, facts, switch in SCENARIOS:
        with fast_path(switch):
            chosen = plan(base.replace(**changes), CallFacts(**facts))
        rows_below = chosen.dense_rows if chosen.attention == "hard" else 0
        why = chosen.reason + (f"; its first {rows_below} queries unmodified" if rows_below else "")
        rows.append(f"| {situation} | {chosen.attention} | {chosen.router} | `{chosen.kernel}` | {why} |")
    kernels = [f"- `{name}`: {text}" for name, text in KERNELS.items()]
    tests = "`tests/test_decomposed.py`, `tests/test_decoding.py`, `tests/test_native_step.py`"
    return "\n".join([PLAN_TABLE_HEAD, *rows, "", f"The kernels, each the dense masked reference's output ({tests}):",
                      "", *kernels, ""])
