"""Names a package exports but imports on first use (PEP 562).

`import focus.sources` runs `focus/__init__.py` first; were that to import the retrofit (torch, transformers), every
light module would cost seconds, and so would Snakemake's start, which validates the profile through them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, homes: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package` exporting {name: module it lives in}."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        namespace[name] = value  # the next lookup is an ordinary one
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
