"""The screens' sections of a profile resolved and checked (`focus.pipeline.profile.resolve_profile` calls them):
`study`, `interpret`, `recall_screen`; and which models a section covers."""

from __future__ import annotations

from typing import Any

from focus.config import ConfigError, to_dict
from focus.eval.config import InterpretConfig


def section_models(section: str, values: dict[str, Any], models: dict[str, Any]) -> list[str]:
    """The models a section names (`models`; default every one of the profile's), checked."""
    chosen = values.get("models") or list(models)
    unknown = [name for name in chosen if name not in models]
    if unknown:
        raise ConfigError(f"{section}.models: {unknown[0]!r} is not one of this profile's models {sorted(models)}")
    return list(chosen)


def study_dict(study: dict[str, Any], variants: dict[str, Any], models: dict[str, Any],
               perplexity: dict[str, Any]) -> dict[str, Any]:
    """The `study` section with its `model` (default the first) checked against the profile."""
    study = {"model": next(iter(models)), **study}
    if study["model"] not in models:
        raise ConfigError(f"study.model: {study['model']!r} is not one of this profile's models {sorted(models)}")
    if study["baseline"] not in variants:
        raise ConfigError(f"study.baseline: {study['baseline']!r} is not one of the variants {sorted(variants)}")
    if study["domain"] not in perplexity["validation_domains"]:
        raise ConfigError(
            f"study.domain: {study['domain']!r} must be a perplexity domain scored on its validation split "
            "(list it in perplexity.domains, 'validation' in perplexity.splits and in data.domains)"
        )
    return study


def interpret_dict(section: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    """The `interpret` section resolved: `models` (default all) plus every InterpretConfig field."""
    chosen = section_models("interpret", section, models)
    try:
        fields = InterpretConfig.from_dict({k: v for k, v in section.items() if k != "models"})
    except ConfigError as err:
        raise ConfigError(f"interpret: {err}") from None
    return {"models": chosen, **to_dict(fields)}


def recall_screen_dict(section: dict[str, Any], variants: dict[str, Any], models: dict[str, Any],
                       data: dict[str, Any]) -> dict[str, Any]:
    """The `recall_screen` section with its defaults and its model, domains and variant routers checked."""
    screen = {"model": next(iter(models)), "split": "validation", "rows": 4, "shares": [0.05, 0.1, 0.2, 0.3, 0.5],
              "keys": [256, 512, 1024, 2048], "last_queries": 1024, "ppl_shares": [], "ppl_keys": [], "ppl_rows": 8,
              "ppl_routers": None, **section}
    if "ppl_rows" in section and "ppl_tokens" in section:
        raise ConfigError("recall_screen: give ppl_rows (rows at every length) or ppl_tokens (tokens at every "
                          "length), not both")
    if screen["model"] not in models:
        raise ConfigError(f"recall_screen.model: {screen['model']!r} is not one of this profile's models "
                          f"{sorted(models)}")
    for domain in screen["domains"]:
        if screen["split"] not in data["domains"].get(domain, []):
            raise ConfigError(f"recall_screen.domains: {domain!r} needs its {screen['split']!r} split; list it in "
                              f"data.domains.{domain}")
    for name, spec in screen["routers"].items():
        if spec.startswith("variant:") and spec.removeprefix("variant:") not in variants:
            raise ConfigError(f"recall_screen.routers.{name}: {spec!r} names no variant of this profile "
                              f"{sorted(variants)}")
    for name in screen["ppl_routers"] or []:
        if name not in screen["routers"]:
            raise ConfigError(f"recall_screen.ppl_routers: {name!r} is not one of its routers "
                              f"{sorted(screen['routers'])}")
    return screen
