"""The walk of one attention call through the attention wing: how many times the call moves from one file of
`focus/attention/` to another (stays) and how many files it visits, for a hard prompt, a native decoding step and an
eager one of a tiny Llama. Issue 56 measured 49 stays in 13 files for a prompt before its packages.

    .venv/bin/python scripts/attention_walk.py
"""

import sys
from pathlib import Path

import torch

from focus import FocusConfig, apply_focus
from focus.attention.cache.decoding import FocusCache
from focus.models import tiny_model

WING = str(Path(__file__).resolve().parents[1] / "focus" / "attention")


def walk(run) -> list[str]:
    """The files of `focus/attention/` entered by the calls `run()` makes from the wing's entry, in order."""
    entered = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(WING):
            entered.append(frame.f_code.co_filename.removeprefix(WING + "/"))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return entered


def stays(files: list[str]) -> int:
    return sum(1 for i, name in enumerate(files) if i == 0 or name != files[i - 1])


def main() -> None:
    torch.manual_seed(0)
    model = tiny_model("llama")
    apply_focus(model, FocusConfig(num_groups=8, top_k=1, window=16, mode="hard", sink_tokens=1))
    model.eval()
    layers = model.config.num_hidden_layers
    ids = torch.randint(0, model.config.vocab_size, (1, 96))
    for name, native in (("hard prompt, native cache", True), ("eager cache", False)):
        cache = FocusCache(model, native=native)
        with torch.no_grad():
            prompt = walk(lambda: model(ids, past_key_values=cache, use_cache=True))
            step = walk(lambda: model(ids[:, :1], past_key_values=cache, use_cache=True))
        for what, files in (("prompt", prompt), ("decoding step", step)):
            # every layer walks alike: a layer's stays are the forward's over its layers
            print(f"{name}, {what}: {round(stays(files) / layers)} stays a layer, in {len(set(files))} files")


if __name__ == "__main__":
    main()
