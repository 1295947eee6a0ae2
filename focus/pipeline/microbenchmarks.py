"""The microbenchmarks a profile lists (`microbenchmarks:`): which script of benchmarks/ each entry runs, and the
checks of its adapter and tokens against the profile. Rule `microbenchmark` runs them."""

from __future__ import annotations

from typing import Any

from focus.config import ConfigError

MICROBENCHMARKS = {"indexer_step": False, "indexer_prompt": False, "indexer_generate": False, "train_step": False,
                   "matrix_units": False, "flex_attention": False, "speed_anchors": True, "profile_focus": True}
"""The scripts of benchmarks/ that rule microbenchmark runs: each writes `<out>/<name>.{csv,md}`; True where the
script takes `--tag` and writes `<out>/<script>_<tag>.{csv,md}` (a profile times it several ways, one tag each)."""


def microbenchmark_script(name: str) -> tuple[str, str | None]:
    """(script, tag) of a `microbenchmarks` entry: `indexer_step` runs benchmarks/indexer_step.py; `speed_anchors_fp32`
    runs benchmarks/speed_anchors.py with `--tag fp32` (the entry's name is the table's name)."""
    if MICROBENCHMARKS.get(name) is False:
        return name, None
    for script, tagged in MICROBENCHMARKS.items():
        if tagged and name.startswith(f"{script}_"):
            return script, name.removeprefix(f"{script}_")
    names = ", ".join(script + ("_<tag>" if tagged else "") for script, tagged in MICROBENCHMARKS.items())
    raise ConfigError(f"microbenchmarks: {name!r} is not a script of benchmarks/ that rule microbenchmark runs "
                      f"({names})")


def check_microbenchmarks(section: dict[str, Any], variants: dict[str, Any], data: dict[str, Any]) -> None:
    """Each microbenchmark names a script (and its tag), its adapter is a variant of the profile, its tokens a corpus
    with a validation split."""
    for name, bench in section.items():
        microbenchmark_script(name)
        if bench.get("adapter") is not None and bench["adapter"] not in variants:
            raise ConfigError(f"microbenchmarks.{name}.adapter: {bench['adapter']!r} names no variant of this profile "
                              f"{sorted(variants)}")
        if bench.get("tokens") is not None and "validation" not in data["domains"].get(bench["tokens"], []):
            raise ConfigError(f"microbenchmarks.{name}.tokens: {bench['tokens']!r} needs its validation split; list "
                              f"it in data.domains.{bench['tokens']}")
