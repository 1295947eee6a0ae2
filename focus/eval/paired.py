"""Paired comparisons of two models scored on the same windows: the noise of a difference, not of either score.

Kept free of torch, so that the report jobs, which only read the records the evaluation jobs wrote, start without it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def paired_ratio(nll: Sequence[float], base_nll: Sequence[float]) -> tuple[float, float, float]:
    """Perplexity ratio - 1 of a model to a base model scored on the same windows (or rows), with its 95% interval:
    (ratio, low, high) from the mean per-window difference of NLL +- 1.96 standard errors (paired: the windows'
    own difficulty cancels, so the interval is the noise of the comparison, not of either perplexity)."""
    if len(nll) != len(base_nll):
        raise ValueError(f"paired scores need the same windows: {len(nll)} against {len(base_nll)}")
    difference = [float(ours) - float(base) for ours, base in zip(nll, base_nll)]
    if len(difference) < 2:
        raise ValueError(f"a paired interval needs at least 2 windows, got {len(difference)}")
    mean = math.fsum(difference) / len(difference)
    half = 1.96 * statistics.stdev(difference) / math.sqrt(len(difference))
    return math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half)
