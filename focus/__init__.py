"""Focus: centroid-routed sparse attention retrofitted onto frozen Hugging Face causal LMs."""

from .adapter import load_focus, save_focus
from .config import ConfigError, FocusConfig
from .hub import load_focus_model, push_to_hub
from .retrofit import (
    apply_focus,
    focus_config,
    focus_parameter_count,
    focus_parameters,
    has_focus,
    remove_focus,
    set_focus_mode,
)

__version__ = "0.1.0"

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
