"""Labels for torch.profiler on Focus's parts (`benchmarks/profile_focus.py` reads them), free when no profiler runs.

`record_function` enters a profiler op even with no profiler on, at a cost of the order of a whole native decoding
step of one layer (docs/decoding.md). A decoding step enters one per layer, so labels are set only while a profiler
records (torch's own fast check, which torch.compile's wrappers use the same way).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from torch.autograd import profiler
from torch.profiler import record_function

_UNLABELLED = nullcontext()


def label(name: str) -> AbstractContextManager:
    """`record_function(name)` while a torch profiler records, else a context that does nothing."""
    return record_function(name) if profiler._is_profiler_enabled else _UNLABELLED
