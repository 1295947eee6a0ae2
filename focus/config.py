"""Typed, frozen configuration for Focus, and the strict dict -> dataclass parsing shared by every config.

Unknown keys and wrong types raise with the key's name, so a typo in a YAML profile is one clear line
instead of a silently ignored setting.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value or key is invalid. The message names the key."""


def _check_type(cls_name: str, name: str, value: Any, annotation: Any) -> Any:
    """Return `value` coerced to `annotation` where lossless (int -> float), else raise naming the key."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if value not in allowed:
            raise ConfigError(f"{cls_name}.{name} must be one of {list(allowed)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_type(cls_name, name, value, inner[0])
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation in (int, float, str, bool):
        # bool is an int subclass: refuse True where a count is expected, and 1 where a flag is.
        if not isinstance(value, annotation) or (annotation is int and isinstance(value, bool)):
            raise ConfigError(
                f"{cls_name}.{name} must be {annotation.__name__}, got {type(value).__name__} {value!r}"
                + yaml_number_hint(value)
            )
    return value


def yaml_number_hint(value: Any) -> str:
    """A hint for a number YAML read as a string: YAML 1.1 wants a dot in the mantissa of a float (1.0e-2, not 1e-2)."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return ""
        mantissa, _, exponent = value.lower().partition("e")
        if exponent and "." not in mantissa:
            return f" (YAML reads {value} as a string; write {float(mantissa):.1f}e{int(exponent)} for the number {number:g})"
    return ""


def check_types(config: Any) -> None:
    """Validate (and losslessly coerce, int -> float) every field of a frozen dataclass in place.

    Call from `__post_init__` so that direct construction is checked as strictly as `from_dict`.
    """
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = _check_type(type(config).__name__, f.name, getattr(config, f.name), hints[f.name])
        object.__setattr__(config, f.name, value)


def from_dict(cls: type[T], values: dict[str, Any]) -> T:
    """Build the frozen dataclass `cls` from a plain dict, rejecting unknown keys (types: see check_types)."""
    if not isinstance(values, dict):
        raise ConfigError(f"{cls.__name__} expects a mapping, got {type(values).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} key {unknown[0]!r}; known keys: {sorted(known)}")
    return cls(**values)


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


_DENSE_HEAD = re.compile(r"l(\d+)h(\d+)")


def dense_head_address(name: Any) -> tuple[int, int]:
    """(layer, head) of a `FocusConfig.dense_heads` entry 'l<layer>h<head>'."""
    match = _DENSE_HEAD.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise ConfigError(f"FocusConfig.dense_heads entries are 'l<layer>h<head>' (e.g. 'l12h0'), got {name!r}")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class FocusConfig:
    """How Focus routes tokens to groups and which attention pairs it keeps.

    A pair (query i, key j <= i) is kept when i - j < `window` (local, full resolution) or when the query's
    groups and the key's groups share one; sink tokens belong to every group. Centroids live in each key/value
    head's key space. A key joins the groups its key vector is routed to; a query joins either the groups of
    its own key (`route_queries="key"`: one group set per token) or the groups its own query vector is routed
    to, per query head (`route_queries="query"`: the groups whose keys it would attend to) or per key/value head
    (`route_queries="kv_head"`: its query heads route together, so they read one set of keys).
    """

    num_groups: int = field(default=16, metadata={"help": "Groups (centroids) per routing head."})
    window: int = field(default=256, metadata={"help": "Local window w: pairs with i - j < w are always kept."})
    top_k: int = field(default=2, metadata={"help": "Hard mode: each token joins its top-k groups."})
    sink_tokens: int = field(
        default=1,
        metadata={
            "help": "The first n real tokens of a sequence belong to every group (attention sinks): frozen "
            "LLMs park attention there, and windowed attention without them collapses (StreamingLLM)."
        },
    )
    sinkhorn_iters: int = field(
        default=5, metadata={"help": "Log-domain Sinkhorn iterations while training (0 = plain softmax)."}
    )
    balance_momentum: float = field(
        default=0.9,
        metadata={
            "help": "Momentum of the running mean of Sinkhorn's group potentials; inference adds that mean "
            "to the routing logits so groups stay balanced without looking at future tokens."
        },
    )
    temperature: float = field(
        default=0.1, metadata={"help": "Routing logits are cosine(vector, centroid) / temperature."}
    )
    route_on: Literal["key", "value"] = field(
        default="key",
        metadata={
            "help": "Which per-head vector places a token: its key (as the layer sees it, after any rotary "
            "embedding) or its value (position-free). Both live in the KV cache, so decoding needs no state."
        },
    )
    route_queries: Literal["key", "query", "kv_head"] = field(
        default="query",
        metadata={
            "help": "How a query token picks its groups: 'key' takes the groups of its own key (key-key similarity; "
            "one group set per token); 'query' routes each query head's query vector against the same centroids, "
            "as the Routing Transformer does, so a query joins the groups of the keys it attends to; 'kv_head' "
            "routes the query heads of a key/value head together (the mean of their routing logits), so that they "
            "read one set of keys (grouped-query models). 'query' and 'kv_head' need route_on='key'."
        },
    )
    unrotate: bool = field(
        default=True,
        metadata={
            "help": "Route on keys and queries with the rotary position embedding undone (exact, from each token's "
            "position), so that groups follow content rather than position. Models without rotary embeddings "
            "(GPT-2: learned absolute positions, mixed into the hidden state) have no rotation to undo."
        },
    )
    shared_centroids: bool = field(
        default=False,
        metadata={"help": "One centroid set shared by all key/value heads of a layer instead of one per head."},
    )
    mode: Literal["soft", "hard"] = field(
        default="soft", metadata={"help": "soft: differentiable gate (training); hard: top-k mask (inference)."}
    )
    gate: Literal["overlap", "neutral"] = field(
        default="overlap",
        metadata={
            "help": "Soft gate on distant pairs: 'overlap' adds log(sum_g P_ig P_jg) <= 0, which charges every pair "
            "(about log G for two uncertain tokens); 'neutral' adds min(0, log(G sum_g P_ig P_jg)): pairs that agree "
            "at least as much as chance pay nothing, as the pairs hard mode keeps, and only mismatches are penalised."
        },
    )
    gate_floor: float = field(
        default=1e-6,
        metadata={"help": "Soft gate log(sum_g P_ig P_jg) is clamped at log(gate_floor) to stay finite."},
    )
    objective: Literal["language_model", "straight_through", "attention_recall"] = field(
        default="straight_through",
        metadata={
            "help": "What the centroids learn from: 'straight_through' (the default: the design study's best hard "
            "model) trains them on the hard model's next-token loss, every layer's forward pass the hard top-k "
            "pattern and its gradient the soft gate's (the straight-through estimator: soft + (hard - soft) with "
            "the difference detached); 'language_model' trains them through the soft gate on the next-token loss; 'attention_recall' runs the model's "
            "own attention and trains the routing to keep the distant pairs that attention weighs (the log of each "
            "query's soft recall of its distant attention mass, weighted by that mass), so that the hard pattern "
            "loses as little of the pretrained model as it can at its cost."
        },
    )
    dense_heads: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Key/value heads that keep every pair the model allows (no routing), as 'l<layer>h<head>', e.g. "
            "l12h0: retrieval heads that Focus should not prune (DuoAttention). Their query heads attend densely in "
            "every path; their centroids are kept but unused."
        },
    )
    dense_below: int = field(
        default=0,
        metadata={
            "help": "Inference only: a query at a position below this (its key's slot in the sequence, left padding "
            "counted, from 0) attends to every key the model allows, as the unmodified model does; later queries "
            "take Focus. Sparse attention pays only from some length on (InfLLM-v2 stays dense below 8,192 tokens); "
            "per query, so prefill and decoding agree. Not applied while the centroids train (0 = Focus everywhere)."
        },
    )
    selector: Literal["centroids", "indexer", "streaming", "quest", "clusters"] = field(
        default="centroids",
        metadata={
            "help": "Hard mode at inference: which rule picks a query's distant keys. 'centroids' is Focus (the keys "
            "of the query's top-k groups); the others keep a share `budget` of each query's distant keys: "
            "'indexer' those with the highest low-rank estimate of their logit (focus.attention.routers.indexer: "
            "trained against the frozen model's attention, the objective 'attention_recall'; untrained, the keys' principal "
            "directions, as Loki; always in hard mode), and the training-free peers: 'streaming' the most recent "
            "ones (budget 0: StreamingLLM), 'quest' whole pages of 16 keys by Quest's bound on their logits, "
            "'clusters' whole clusters of keys (nearest centroid) by the query's routing logit (ClusterKV). They run "
            "on the dense masked kernel: a measure, not yet a fast path."
        },
    )
    budget: float = field(
        default=0.3,
        metadata={"help": "The share of each query's distant keys a `selector` other than 'centroids' keeps (0 to 1)."},
    )
    budget_keys: int = field(
        default=0,
        metadata={"help": "A `selector` other than 'centroids' keeps this many of each query's distant keys instead "
                          "of the share `budget` (all where it has fewer; DSA keeps 2,048 at any length; 0 = the "
                          "share)."},
    )
    indexer_rank: int = field(
        default=16,
        metadata={"help": "selector='indexer': dimensions of the low-rank query and key projections per head."},
    )
    distill: float = field(
        default=0.0,
        metadata={
            "help": "Training only: add this weight x KL(pretrained || Focus) of the next-token distributions to "
            "the objective (the same model with Focus switched off is the teacher), so that the centroids gain on "
            "the training domain without moving the model away from what it knew (0 = off)."
        },
    )

    def __post_init__(self) -> None:
        check_types(self)
        if self.num_groups < 1:
            raise ConfigError(f"FocusConfig.num_groups must be >= 1, got {self.num_groups}")
        if self.top_k < 1:
            raise ConfigError(f"FocusConfig.top_k must be >= 1, got {self.top_k}")
        if self.top_k > self.num_groups:
            raise ConfigError(
                f"FocusConfig.top_k ({self.top_k}) must be <= num_groups ({self.num_groups})"
            )
        if self.sink_tokens < 0:
            raise ConfigError(f"FocusConfig.sink_tokens must be >= 0, got {self.sink_tokens}")
        if self.window < 0:
            raise ConfigError(f"FocusConfig.window must be >= 0, got {self.window}")
        if self.dense_below < 0:
            raise ConfigError(f"FocusConfig.dense_below must be >= 0, got {self.dense_below}")
        if self.sinkhorn_iters < 0:
            raise ConfigError(f"FocusConfig.sinkhorn_iters must be >= 0, got {self.sinkhorn_iters}")
        if not 0 <= self.balance_momentum < 1:
            raise ConfigError(f"FocusConfig.balance_momentum must be in [0, 1), got {self.balance_momentum}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"FocusConfig.temperature must be a finite number > 0, got {self.temperature}")
        if self.route_queries != "key" and self.window < 1:
            # A query's groups need not include its own key's: without a window it could see no key at all.
            raise ConfigError(f"FocusConfig.route_queries={self.route_queries!r} needs window >= 1, got {self.window}")
        if self.route_queries != "key" and self.route_on != "key":
            raise ConfigError(
                f"FocusConfig.route_queries={self.route_queries!r} needs route_on='key' (queries live in key space), got "
                f"{self.route_on!r}; to route on {self.route_on}s, set route_queries='key' and unrotate=False"
            )
        if self.unrotate and self.route_on != "key":
            raise ConfigError(f"FocusConfig.unrotate needs route_on='key' (values carry no rotation), got {self.route_on!r}")
        if not isinstance(self.dense_heads, (list, tuple)):
            raise ConfigError(f"FocusConfig.dense_heads must be a list of 'l<layer>h<head>', got {self.dense_heads!r}")
        object.__setattr__(self, "dense_heads", sorted(set(self.dense_heads), key=dense_head_address))
        by_layer: dict[int, list[int]] = {}  # parsed once: every attention call (each decoding step) asks for it
        for layer, head in map(dense_head_address, self.dense_heads):
            by_layer.setdefault(layer, []).append(head)
        object.__setattr__(self, "_dense_by_layer", by_layer)
        if self.selector == "clusters" and self.route_on != "key":
            raise ConfigError(f"FocusConfig.selector='clusters' ranks key clusters by the query: it needs "
                              f"route_on='key', got {self.route_on!r}")
        if self.selector == "indexer":
            if self.objective == "straight_through":  # the default, meant for centroids: the indexer learns as DSA's
                object.__setattr__(self, "objective", "attention_recall")  # warm-up does, from the dense attention
            object.__setattr__(self, "mode", "hard")  # it has no soft gate: it selects, or (training) it is scored
            if self.objective != "attention_recall":
                raise ConfigError(f"FocusConfig.selector='indexer' trains against the frozen model's attention "
                                  f"(objective='attention_recall'), got objective={self.objective!r}")
            if self.route_queries == "key":
                raise ConfigError("FocusConfig.selector='indexer' scores each query against the keys: it needs "
                                  "route_queries='query' or 'kv_head', got 'key'")
        if self.indexer_rank < 1:
            raise ConfigError(f"FocusConfig.indexer_rank must be >= 1, got {self.indexer_rank}")
        if not 0 <= self.budget <= 1:
            raise ConfigError(f"FocusConfig.budget must be in [0, 1], got {self.budget}")
        if self.budget_keys < 0:
            raise ConfigError(f"FocusConfig.budget_keys must be >= 0 (0: the share `budget`), got {self.budget_keys}")
        if not (self.distill >= 0 and math.isfinite(self.distill)):
            raise ConfigError(f"FocusConfig.distill must be a finite number >= 0, got {self.distill}")
        if not 0 < self.gate_floor < 1:
            raise ConfigError(f"FocusConfig.gate_floor must be in (0, 1), got {self.gate_floor}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "FocusConfig":
        return from_dict(cls, values)

    def dense_heads_of(self, layer: int) -> list[int]:
        """The key/value heads of `layer` that attend densely (`dense_heads`)."""
        return self._dense_by_layer.get(layer, [])

    def replace(self, **changes: Any) -> "FocusConfig":
        return from_dict(FocusConfig, {**to_dict(self), **changes})

    @property
    def trained_mode(self) -> Literal["soft", "hard"]:
        """The mode centroids trained under this config are meant to run in: hard for the objectives that train the
        hard pattern (straight-through, attention recall), else the mode set (the soft gate's training mode)."""
        return "hard" if self.objective in ("straight_through", "attention_recall") else self.mode
