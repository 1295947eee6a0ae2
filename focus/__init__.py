"""Focus: centroid-routed sparse attention retrofitted onto frozen Hugging Face causal LMs."""

from focus.adapter import load_focus, save_focus
from focus.config import ConfigError, FocusConfig
from focus.hub import load_focus_model, push_to_hub
from focus.retrofit import (
    apply_focus,
    focus_config,
    focus_parameter_count,
    focus_parameters,
    has_focus,
    remove_focus,
    set_focus_mode,
)
from focus.version import __version__ as __version__

__all__ = [
    "ConfigError",
    "FocusConfig",
    "apply_focus",
    "focus_config",
    "focus_parameter_count",
    "focus_parameters",
    "has_focus",
    "load_focus",
    "load_focus_model",
    "push_to_hub",
    "save_focus",
    "remove_focus",
    "set_focus_mode",
]
