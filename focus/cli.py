"""The `focus` command: the library's main calls from a shell.

    focus train --output runs/books --steps 300 --lr 1e-2 --window 128     # retrofit, train the centroids, save
    focus eval --adapter runs/books/adapter --mode hard --split test         # perplexity (or --tasks arc_easy)
    focus generate --adapter runs/books/adapter --prompt "Once upon a time"  # text through Focus hard decoding
    focus bench --kind decode --lengths 4096 8192 --model ''                 # speed against full attention
    focus --version

Every option's help is the help string of the dataclass field it sets (FocusConfig, TrainConfig and the argument
classes below), read by transformers' HfArgumentParser. Errors are one line on stderr, exit status 2.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from focus.adapter import AdapterError
from focus.config import ConfigError, FocusConfig, to_dict
from focus.sources import PACKAGED_SMOLLM2, check_model_source, position_limit
from focus.train.config import TrainConfig

COMMANDS = ("train", "eval", "generate", "bench")


@dataclass
class ModelArguments:
    model: str = field(default=PACKAGED_SMOLLM2, metadata={
        "help": f"Base model: a hub id, a saved model folder, or {PACKAGED_SMOLLM2!r} (packaged, offline)."})
    dtype: Literal["float32", "bfloat16", "float16"] = field(default="float32", metadata={
        "help": "Weights' dtype (bfloat16 is slow on CPUs without AVX-512 BF16 or AMX)."})


@dataclass
class DataArguments:
    domain: str = field(default="books", metadata={
        "help": "Corpus, from the data mirror or the hub: books (novels cut by region), books_by_book (cut by book), "
                "nonfiction, wikitext2 (see focus.data)."})
    mirror: str | None = field(default=None, metadata={"help": "Data mirror folder (default: FOCUS_DATA_MIRROR or "
                                                               "../shared/data when present)."})


@dataclass
class TrainArguments:
    output: str = field(metadata={"help": "Folder for adapter/, metrics.jsonl, summary.json and the tokens."})
    seq_len: int = field(default=512, metadata={"help": "Tokens per training row."})
    calibration_rows: int = field(default=8, metadata={
        "help": "Rows whose keys k-means-initialise the centroids (not trained on)."})
    eval_rows: int = field(default=8, metadata={"help": "Validation rows scored during training."})
    retrieval_share: float | None = field(default=None, metadata={
        "help": "Share of the trained rows that are synthetic retrieval rows (focus.train.retrieval); 0: none; "
                "default a quarter where the rows hold a fact beyond the window (else none, with a warning)."})
    retrieval_weight: float = field(default=5.0, metadata={"help": "Loss weight of a retrieval row's answer tokens."})
    broad: str | None = field(default=None, metadata={
        "help": "A broad corpus mixed into the trained rows (e.g. nonfiction): text the model must not forget, "
                "learnt from the dense teacher when --distill > 0, else from its next tokens."})
    broad_share: float = field(default=0.0, metadata={"help": "Share of the trained rows from --broad."})
    overwrite: bool = field(default=False, metadata={
        "help": "Train anew into an --output that holds a finished run, replacing its adapter."})


@dataclass
class AdapterArguments:
    adapter: str | None = field(default=None, metadata={
        "help": "Focus adapter: a folder or a hub repo id (none: the pretrained model)."})
    revision: str | None = field(default=None, metadata={"help": "Branch, tag or commit of the adapter's hub repo."})
    mode: Literal["soft", "hard"] = field(default="hard", metadata={
        "help": "Focus at inference: hard (top-k groups, sparse) or soft (the training gate, dense)."})
    dense_below: int | None = field(default=None, metadata={
        "help": "Queries at positions below this attend as the unmodified model does, later ones take Focus "
        "(FocusConfig.dense_below; none: the adapter's setting)."})

    def __post_init__(self) -> None:
        if self.dense_below is not None and not self.adapter:
            raise ConfigError("--dense_below needs an --adapter: the pretrained model has no Focus to switch")
        if self.dense_below is not None and self.dense_below < 0:
            raise ConfigError(f"--dense_below must be >= 0, got {self.dense_below}")

    def focus_changes(self) -> dict:
        """The FocusConfig settings given here that need no training, for `set_focus_mode`."""
        return {} if self.dense_below is None else {"dense_below": self.dense_below}


@dataclass
class EvalArguments:
    split: str = field(default="test", metadata={"help": "Split scored for perplexity (choose on validation)."})
    context_length: int = field(default=512, metadata={"help": "Tokens per scored window."})
    max_tokens: int | None = field(default=None, metadata={"help": "Score only the first this many tokens."})
    batch_size: int = field(default=4, metadata={"help": "Windows (or lm-eval requests) per forward pass."})
    tasks: list[str] = field(default_factory=list, metadata={
        "help": "lm-eval tasks instead of perplexity (e.g. arc_easy, mmlu: any task lm-eval knows); tasks the "
                "data mirror lacks need the hub."})
    limit: int | None = field(default=None, metadata={"help": "lm-eval: documents per task."})
    output: str | None = field(default=None, metadata={"help": "Write the JSON record here too."})


@dataclass
class GenerateArguments:
    prompt: str = field(metadata={"help": "Text to continue."})
    max_new_tokens: int = field(default=50, metadata={"help": "Tokens to generate (greedy)."})
    chat: bool = field(default=False, metadata={"help": "Wrap the prompt in the tokenizer's chat template."})
    device: str = field(default="auto", metadata={
        "help": "Where the model runs: cpu, cuda, cuda:1, ... (auto: the first GPU when there is one, else the CPU)."})
    kernels: Literal["auto", "native", "eager"] = field(default="auto", metadata={
        "help": "Hard mode's prompt and decoding steps: native CPU kernels where they apply (auto, falling back to "
                "PyTorch with a warning when they cannot be built), native (they must), or eager PyTorch."})
    compile_step: bool = field(default=False, metadata={"help": "Deprecated: --kernels native."})


@dataclass
class BenchArguments:
    kind: Literal["decode", "prefill"] = field(metadata={
        "help": "decode: one decoding step and generate() through the group index; prefill: whole-prompt attention."})
    output: str = field(default="benchmarks/results", metadata={"help": "Folder for the tables and the figure."})
    tag: str = field(default="cli", metadata={"help": "Suffix of the written file names."})
    lengths: list[int] = field(default_factory=lambda: [4096, 8192], metadata={
        "help": "Cached tokens (decode) or sequence lengths (prefill) of the one-layer rows."})
    settings: list[str] = field(default_factory=lambda: ["16:256:1", "16:256:2"], metadata={
        "help": "Focus settings as groups:window:top_k."})
    model: str = field(default=PACKAGED_SMOLLM2, metadata={"help": "Model of the whole-model rows ('' skips them)."})
    prompt_lengths: list[int] = field(default_factory=lambda: [4096], metadata={
        "help": "Prompt lengths of the whole-model rows."})
    dtype: Literal["float32", "bfloat16", "float16"] = field(default="float32", metadata={"help": "Tensor dtype."})
    repeats: int = field(default=5, metadata={"help": "Timed repeats (the median is reported)."})
    kernels: Literal["auto", "native", "eager"] = field(default="auto", metadata={
        "help": "decode: the FocusCache's kernels timed: the library's default (auto: native CPU kernels where they "
                "apply), native (they must) or eager PyTorch."})
    compile_step: bool = field(default=False, metadata={"help": "Deprecated: --kernels native."})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--version"], ["-V"]):
        from focus.version import __version__

        print(f"focus {__version__}")
        return 0
    if not argv or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"focus: error: unknown command {argv[0]!r}; one of {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    # A warning is one line a user reads, not a source line of the library (restored: main may run in a process
    # that goes on, as the tests' does).
    formatwarning = warnings.formatwarning
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"focus {command}: warning: {message}\n"
    try:
        return {"train": _train, "eval": _eval, "generate": _generate, "bench": _bench}[command](rest)
    except (OSError, ConfigError, AdapterError, KeyError, ValueError) as err:  # OSError: unwritable output, full disk
        text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)  # KeyError quotes its text
        message = text.splitlines()[0] if text else type(err).__name__
        print(f"focus {command}: error: {message}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = formatwarning


def _parse(command: str, classes: tuple, argv: list[str]) -> tuple:
    from transformers import HfArgumentParser

    parser = HfArgumentParser(classes, prog=f"focus {command}")
    return parser.parse_args_into_dataclasses(args=argv)


def _check_model(source: str, length: int | None = None, what: str = "") -> None:
    """A model that cannot load, or a length beyond its positions, is one line now, before anything loads."""
    try:
        check_model_source(source)
    except ConfigError as err:
        raise ConfigError(f"--model: {err}") from None
    limit = position_limit(source)
    if length is not None and limit is not None and length > limit:
        raise ValueError(f"{what} {length} is beyond the {limit} positions {source} was trained for")


def _check_corpus(domain: str, splits: list[str], mirror: str | None) -> None:
    from focus.data import corpus_location

    for split in splits:
        corpus_location(domain, split, mirror)  # FileNotFoundError or MirrorError, naming where it looked


def _check_tasks(tasks: list[str]) -> None:
    """Tasks the data mirror lacks need the hub: without it, one line now rather than a skipped task later."""
    from focus.eval.harness import MIRRORED_TASKS, hub_unavailable

    elsewhere = [task for task in tasks if task not in MIRRORED_TASKS]
    reason = hub_unavailable() if elsewhere else None
    if reason is not None:
        raise ConfigError(f"--tasks {' '.join(elsewhere)}: {reason}; offline, the mirror holds "
                          f"{', '.join(MIRRORED_TASKS)}")


def _resolve_adapter(adapter: AdapterArguments) -> Path | None:
    """The adapter's folder, its config read and checked: a wrong path or a damaged adapter is one line at once."""
    if not adapter.adapter:
        return None
    from focus.adapter import read_adapter_config, resolve_adapter

    folder = resolve_adapter(adapter.adapter, adapter.revision)
    read_adapter_config(folder)
    return folder


def _tokens_usable(path: Path) -> bool:
    """Whether a token file left by an earlier run reads back (a copy cut short, a damaged disk: rebuild it)."""
    if not path.exists():
        return False
    from focus.pipeline.jobs import read_tokens

    try:
        read_tokens(path, "train")
    except Exception as err:  # noqa: BLE001 (whatever the damage, the remedy is the same)
        print(f"focus train: {path} is unreadable ({str(err).splitlines()[0] if str(err) else type(err).__name__}); "
              "rebuilding it", file=sys.stderr)
        path.unlink()
        return False
    return True


def _train(argv: list[str]) -> int:
    from focus.pipeline.jobs import TrainingJob
    from focus.pipeline.stages import prepare_tokens, train_focus

    model, data, args, focus, train = _parse(
        "train", (ModelArguments, DataArguments, TrainArguments, FocusConfig, TrainConfig), argv)
    _check_model(model.model, args.seq_len, "--seq_len")
    if focus.window >= args.seq_len:
        raise ConfigError(f"--window {focus.window} covers every --seq_len {args.seq_len} tokens of a row: no distant "
                          "pair is left for the centroids to learn from; use a window below seq_len")
    out = Path(args.output)
    if (out / "summary.json").exists() and not args.overwrite:
        raise ValueError(f"{out} holds a finished run (summary.json, adapter/); choose another --output, or "
                         "--overwrite to train anew and replace it")
    if bool(args.broad) != bool(args.broad_share):
        raise ValueError("--broad and --broad_share go together: a broad corpus and the share of rows it gives")
    _check_corpus(data.domain, ["train", "validation"], data.mirror)
    if args.broad:
        _check_corpus(args.broad, ["train"], data.mirror)
    job_settings = dict(calibration_rows=args.calibration_rows, eval_rows=args.eval_rows,
                        retrieval_share=args.retrieval_share, retrieval_weight=args.retrieval_weight,
                        broad_share=args.broad_share)
    TrainingJob(out / "tokens", args.seq_len, train, out / "metrics.jsonl", out / "summary.json",
                broad_tokens=args.broad and out / "broad", **job_settings)  # shares refused before any tokenizing
    out.mkdir(parents=True, exist_ok=True)
    tokens = out / f"{data.domain}.tokens.safetensors"
    if not _tokens_usable(tokens):
        prepare_tokens(model.model, data.domain, ["train", "validation"], tokens, data.mirror)
    broad_tokens = None
    if args.broad:
        broad_tokens = out / f"{args.broad}.tokens.safetensors"
        if not _tokens_usable(broad_tokens):
            prepare_tokens(model.model, args.broad, ["train"], broad_tokens, data.mirror)
    job = TrainingJob(tokens, args.seq_len, train, out / "metrics.jsonl", out / "summary.json",
                      broad_tokens=broad_tokens, **job_settings)
    summary = train_focus(model.model, model.dtype, to_dict(focus), job, out / "adapter")
    final = summary.get("final", {})
    print(f"adapter: {out / 'adapter'}  validation perplexity {final.get('eval/ppl', float('nan')):.2f} after "
          f"{final.get('step')} steps ({summary.get('trainable_parameters')} trained parameters)")
    return 0


def _eval(argv: list[str]) -> int:
    from focus.pipeline.stages import evaluate_benchmarks, evaluate_perplexity, prepare_tokens

    model, data, adapter, args = _parse("eval", (ModelArguments, DataArguments, AdapterArguments, EvalArguments), argv)
    _check_model(model.model, args.context_length, "--context_length")
    if args.context_length < 2:
        raise ValueError(f"--context_length must be at least 2 (a token and the one it predicts), got "
                         f"{args.context_length}")
    trained = _resolve_adapter(adapter)
    if not args.tasks:
        _check_corpus(data.domain, [args.split], data.mirror)
    else:
        _check_tasks(args.tasks)
    method = f"focus-{adapter.mode}" if trained else "pretrained"
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(args.output or Path(scratch) / "record.json")
        if args.tasks:
            record = evaluate_benchmarks(model.model, model.dtype, method, args.tasks, [], output,
                                         Path(scratch) / "samples", args.limit, args.batch_size, trained, data.mirror,
                                         focus_changes=adapter.focus_changes())
            for task, metrics in record["tasks"].items():
                print(f"{task}: " + ", ".join(f"{name} {value:.4f}" for name, value in metrics.items()
                                               if isinstance(value, float)))
            return 0
        tokens = Path(scratch) / "tokens.safetensors"
        prepare_tokens(model.model, data.domain, [args.split], tokens, data.mirror)
        record = evaluate_perplexity(model.model, model.dtype, method, tokens, output, args.context_length,
                                     max_tokens=args.max_tokens, batch_size=args.batch_size, trained=trained,
                                     split=args.split, focus_changes=adapter.focus_changes())
    print(f"{data.domain} {args.split} perplexity {record['perplexity']:.2f} ({method}, {record['tokens']} tokens, "
          f"context {args.context_length})")
    return 0


def _generate(argv: list[str]) -> int:
    import torch

    from focus.adapter import load_focus
    from focus.attention.cache.decoding import FocusCache
    from focus.models import load_model
    from focus.retrofit import set_focus_mode

    model_args, adapter, args = _parse("generate", (ModelArguments, AdapterArguments, GenerateArguments), argv)
    if not args.prompt.strip():
        raise ValueError("--prompt is empty: give the text to continue")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be at least 1, got {args.max_new_tokens}")
    # At least one prompt token: what fits is known before the tokenizer loads (the prompt's length after).
    _check_model(model_args.model, 1 + args.max_new_tokens, "a prompt token + --max_new_tokens =")
    # The adapter first: a wrong path is one line at once, not after the model loads (or converts, on a fresh cache).
    trained = _resolve_adapter(adapter)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    try:
        device = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"--device {args.device!r}: {str(err).splitlines()[0]}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: this torch sees no CUDA device")
    model, tokenizer = load_model(model_args.model, getattr(torch, model_args.dtype), device)
    cache = None
    if trained:
        load_focus(model, trained)
        set_focus_mode(model, adapter.mode, **adapter.focus_changes())
        # decoding reads the group index
        cache = FocusCache(model, native=_native(args)) if adapter.mode == "hard" else None
    if args.chat:
        messages = [{"role": "user", "content": args.prompt}]
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)
    else:
        inputs = tokenizer(args.prompt, return_tensors="pt")
    inputs = inputs.to(device)
    length = inputs["input_ids"].shape[1] + args.max_new_tokens
    _check_model(model_args.model, length, f"the prompt's {inputs['input_ids'].shape[1]} tokens + --max_new_tokens =")
    with torch.no_grad():
        out = model.generate(**inputs, past_key_values=cache, do_sample=False, max_new_tokens=args.max_new_tokens)
    print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    return 0


def _native(args) -> bool | None:
    """`--kernels` as `FocusCache(native=...)`; the deprecated `--compile_step` is `--kernels native`."""
    if args.compile_step:
        warnings.warn("--compile_step is deprecated: it is --kernels native (auto, the default, runs the native "
                      "kernels wherever they apply)", FutureWarning, stacklevel=2)
        return True
    return {"auto": None, "native": True, "eager": False}[args.kernels]


def _bench(argv: list[str]) -> int:
    (args,) = _parse("bench", (BenchArguments,), argv)
    from focus.eval.speed import parse_settings

    for name in ("lengths", "prompt_lengths"):
        if any(length < 1 for length in getattr(args, name)):
            raise ValueError(f"--{name} must be positive token counts, got {' '.join(map(str, getattr(args, name)))}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    if args.model:
        _check_model(args.model, max(args.prompt_lengths), "--prompt_lengths")
    settings = parse_settings(args.settings)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    model = args.model or None
    if args.kind == "decode":
        from focus.pipeline.benchmark import run_decode_benchmark

        run_decode_benchmark({"cache_lengths": args.lengths, "settings": settings, "dtype": args.dtype,
                              "repeats": args.repeats, "prompt_lengths": args.prompt_lengths,
                              "generate_settings": settings[:1], "native": _native(args)},
                             model, out / f"decode_step_{args.tag}.csv", out / f"generate_{args.tag}.csv",
                             out / f"decode_speedup_{args.tag}.png")
        tables = (f"decode_step_{args.tag}.md", f"generate_{args.tag}.md")
    else:
        from focus.pipeline.benchmark import run_benchmark

        run_benchmark({"lengths": args.lengths, "settings": settings, "dtype": args.dtype, "repeats": args.repeats,
                       "prefill_lengths": args.prompt_lengths, "prefill_settings": settings[:1]}, model,
                      out / f"attention_{args.tag}.csv", out / f"prefill_{args.tag}.csv",
                      out / f"speedup_{args.tag}.png")
        tables = (f"attention_{args.tag}.md", f"prefill_{args.tag}.md")
    for table in tables:
        print((out / table).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
