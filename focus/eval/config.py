"""The settings of the evaluations a profile states: validated when Snakemake starts, so free of torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from focus.config import ConfigError, check_types, from_dict


@dataclass(frozen=True)
class InterpretConfig:
    """What the interpretability stage analyses and shows (profile section `interpret`, less `models`)."""

    tokens: int = field(default=4096, metadata={
        "help": "Held-out tokens analysed: rows of the training seq_len spread evenly over the test split."})
    layers: list[int] | None = field(default=None, metadata={
        "help": "Layers to plot (negative counts from the end); null: five evenly spaced. Every layer is analysed."})
    top_tokens: int = field(default=10, metadata={"help": "Tokens listed per group, by count and by lift."})
    shuffles: int = field(default=5, metadata={"help": "Label shuffles averaged for the chance level of NMI."})
    batch_size: int = field(default=4, metadata={"help": "Rows per forward pass."})
    example_tokens: int = field(default=200, metadata={"help": "Tokens of example text coloured by group (HTML)."})
    seed: int = field(default=0, metadata={"help": "Seed of the label shuffles."})

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("tokens", "top_tokens", "shuffles", "batch_size", "example_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"InterpretConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.layers is not None and not (
            isinstance(self.layers, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in self.layers)
        ):
            raise ConfigError(f"InterpretConfig.layers must be a list of integers or null, got {self.layers!r}")

    @classmethod
    def from_dict(cls, values: dict) -> "InterpretConfig":
        return from_dict(cls, values)
