"""The library's version, in a module of its own so that every other module can read it without a loop."""

__version__ = "0.1.0"  # keep equal to pyproject.toml's
