"""The walk of one attention call through the attention wing: how many times the call moves from one file of
`focus/attention/` to another (stays), how many files it visits and how often it comes back to `function.py` (the
entry asking the cache, the plan, the router and the kernel in turn), for a hard prompt and a decoding step of a tiny
Llama with a native and an eager `FocusCache`. Counted from the attention entry (`focus_attention`), as issue 56 counts
(49 stays in 13 files, function.py re-entered 12 times, before its packages); the cache's own update, which
transformers makes before the attention call, is left out.

    .venv/bin/python scripts/attention_walk.py
"""

import sys
from pathlib import Path

import torch

from focus import FocusConfig, apply_focus
from focus.attention.cache.decoding import FocusCache
from focus.models import tiny_model

WING = str(Path(__file__).resolve().parents[1] / "focus" / "attention")


def walk(run) -> list[tuple[str, str]]:
    """The (file, function) of every call into `focus/attention/` that `run()` makes from the attention entry on, in
    order; each layer's walk starts at `focus_attention` and ends at the next layer's cache update."""
    entered = []
    inside = False

    def profile(frame, event, arg):
        nonlocal inside
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(WING):
            return
        file = code.co_filename.removeprefix(WING + "/")
        if code.co_name == "focus_attention":
            inside = True
        elif code.co_name == "update" and file == "cache/decoding.py":
            inside = False  # (transformers updates the next layer's cache before its attention call)
        if inside:
            entered.append((file, code.co_name))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return entered


def stays(calls: list[tuple[str, str]]) -> int:
    """Changes of file, each layer's entry counted as one."""
    return sum(1 for i, (file, name) in enumerate(calls)
               if i == 0 or name == "focus_attention" or file != calls[i - 1][0])


def reentries(calls: list[tuple[str, str]]) -> int:
    """How often the walk comes back to function.py from another file (a layer's entry not counted)."""
    return sum(1 for i, (file, name) in enumerate(calls)
               if i and file == "function.py" and calls[i - 1][0] != file and name != "focus_attention")


def main() -> None:
    torch.manual_seed(0)
    model = tiny_model("llama")
    apply_focus(model, FocusConfig(num_groups=8, top_k=1, window=16, mode="hard", sink_tokens=1))
    model.eval()
    layers = model.config.num_hidden_layers
    ids = torch.randint(0, model.config.vocab_size, (1, 96))
    with torch.no_grad():
        calls = walk(lambda: model(ids, use_cache=False))
    report("no cache, hard prompt", calls, layers)
    for name, native in (("native cache", True), ("eager cache", False)):
        cache = FocusCache(model, native=native)
        with torch.no_grad():
            prompt = walk(lambda: model(ids, past_key_values=cache, use_cache=True))
            step = walk(lambda: model(ids[:, :1], past_key_values=cache, use_cache=True))
        report(f"{name}, hard prompt", prompt, layers)
        report(f"{name}, decoding step", step, layers)


def report(what: str, calls: list[tuple[str, str]], layers: int) -> None:
    # every layer walks alike: a layer's counts are the forward's over its layers
    files = len({file for file, _ in calls})
    print(f"{what}: {round(stays(calls) / layers)} stays a layer in {files} files, "
          f"function.py re-entered {round(reentries(calls) / layers)} times")


if __name__ == "__main__":
    main()
