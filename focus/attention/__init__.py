"""Focus attention: routing, the dense reference pattern, its fast paths (the two-call decomposition, sparse decoding
through `FocusCache`, the native CPU kernels) and the attention function registered with transformers. Which of them
computes a call is its plan (`focus.attention.dispatch.planning`); `explain` shows it before a call is made."""

from focus.attention.dispatch.planning import CallFacts, Plan, explain, plan

__all__ = ["CallFacts", "Plan", "explain", "plan"]
