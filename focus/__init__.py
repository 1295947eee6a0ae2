"""Focus: centroid-routed sparse attention retrofitted onto frozen Hugging Face causal LMs.

The names below load on first use (`focus.lazy`), so that `import focus.report.tables` in a pipeline job that reads
only CSV files does not pay the seconds torch and transformers take to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from focus.lazy import lazy_exports
from focus.version import __version__ as __version__

if TYPE_CHECKING:  # what type checkers and editors see ("X as X": re-exported); at run time `__getattr__` imports
    from focus.adapter import load_focus as load_focus
    from focus.adapter import save_focus as save_focus
    from focus.attention.cache.decoding import FocusCache as FocusCache
    from focus.config import ConfigError as ConfigError
    from focus.config import FocusConfig as FocusConfig
    from focus.hub import load_focus_model as load_focus_model
    from focus.hub import push_to_hub as push_to_hub
    from focus.retrofit import apply_focus as apply_focus
    from focus.retrofit import focus_config as focus_config
    from focus.retrofit import focus_parameter_count as focus_parameter_count
    from focus.retrofit import focus_parameters as focus_parameters
    from focus.retrofit import has_focus as has_focus
    from focus.retrofit import remove_focus as remove_focus
    from focus.retrofit import set_focus_mode as set_focus_mode

_HOMES = {
    "ConfigError": "focus.config",
    "FocusCache": "focus.attention.cache.decoding",
    "FocusConfig": "focus.config",
    "apply_focus": "focus.retrofit",
    "focus_config": "focus.retrofit",
    "focus_parameter_count": "focus.retrofit",
    "focus_parameters": "focus.retrofit",
    "has_focus": "focus.retrofit",
    "load_focus": "focus.adapter",
    "load_focus_model": "focus.hub",
    "push_to_hub": "focus.hub",
    "save_focus": "focus.adapter",
    "remove_focus": "focus.retrofit",
    "set_focus_mode": "focus.retrofit",
}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
