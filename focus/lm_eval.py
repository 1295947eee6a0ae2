"""lm-evaluation-harness with a Focus model: `python -m focus.lm_eval` is the `lm_eval` command with a `focus` model.

    python -m focus.lm_eval --model focus \\
        --model_args pretrained=smollm2-135m-instruct,adapter=runs/books/adapter,mode=hard --tasks arc_easy_mirror

Every argument is lm-eval's own (`lm_eval --help`). The `focus` model's arguments: `pretrained` (a hub id, a saved
folder or the packaged SmolLM2's name, as `focus.models.load_model` takes), `adapter` (a Focus adapter folder or hub
repo; none: the pretrained model), `mode` (hard, the default, or soft), `dense_below`, `dtype` (float32,
bfloat16, float16), and HFLM's own (`batch_size`, `max_length`, ...). Where a data mirror is found and no
`--include_path` is given, the mirrored tasks are added under their stock names plus `_mirror` (`arc_easy_mirror`),
so they run offline; any other task comes from the hub as `lm_eval` runs it.

Why a module and not `lm_eval --model focus`: lm-eval 0.4 looks models up in its own registry, which an installed
package cannot add to (no entry point is read); importing this module registers `focus` there, so
`lm_eval.simple_evaluate(model="focus", ...)` works too once it is imported.
"""

from __future__ import annotations

import sys
import tempfile

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from focus.adapter import resolve_adapter
from focus.models import load_model

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@register_model("focus")
class FocusLM(HFLM):
    """HFLM over `load_model(pretrained)` with a Focus adapter loaded and set to `mode`."""

    def __init__(self, pretrained: str, adapter: str | None = None, mode: str = "hard", dense_below: int | None = None,
                 dtype: str = "float32", revision: str | None = None, device: str | None = None, **kwargs):
        from focus import load_focus, set_focus_mode

        if dtype not in _DTYPES:
            raise ValueError(f"focus model_args dtype={dtype!r}: one of {', '.join(_DTYPES)}")
        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model, tokenizer = load_model(pretrained, _DTYPES[dtype], device)
        if adapter:
            load_focus(model, resolve_adapter(adapter, revision))
            changes = {} if dense_below is None else {"dense_below": int(dense_below)}
            set_focus_mode(model, mode, **changes)
        elif dense_below is not None:
            raise ValueError("focus model_args dense_below needs an adapter: the pretrained model has no Focus")
        super().__init__(pretrained=model, tokenizer=tokenizer, device=str(model.device), **kwargs)


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line, with the `focus` model registered and the mirrored tasks on the include path."""
    from lm_eval.__main__ import cli_evaluate

    from focus.data import find_mirror
    from focus.eval.harness import write_mirror_tasks

    argv = list(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as tasks:
        if "--include_path" not in argv and find_mirror() is not None:
            write_mirror_tasks(tasks)
            argv += ["--include_path", tasks]
        previous, sys.argv = sys.argv, ["lm_eval", *argv]
        try:
            cli_evaluate()
        finally:
            sys.argv = previous


if __name__ == "__main__":
    main()
