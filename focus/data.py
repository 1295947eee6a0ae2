"""Text corpora for training and perplexity: WikiText-2, PG-19-style novels and non-fiction, from the offline mirror or
the hub.

    wikitext2      Salesforce/wikitext (the mirror holds validation and test; train is hub-only)
    books          the 7 novels, each cut by region: its first 90% train, next 5% validation, last 5% test
    books_by_book  the same novels, cut by book: 5 train, one validation, one test (a domain the centroids never saw)
    nonfiction     10 non-fiction books in many registers, each cut by region as `books`: broad training text


The mirror (see shared/data/README.md) holds hub-layout JSONL files, so a mirror file and its hub split give the
same rows. Every (corpus, split) names exactly one hub dataset/config/split, read from the mirror when it has the
file and from the hub otherwise, so a number never depends on which of the two was reachable.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: profile validation reads this module when Snakemake starts, torch-free
    import torch

MIRROR_ENV = "FOCUS_DATA_MIRROR"
CORPORA = ("wikitext2", "books", "books_by_book", "nonfiction")
SPLITS = ("train", "validation", "test")

_MANIFEST = "MANIFEST.json"
_REPO_ROOT = Path(__file__).resolve().parent.parent  # the folder holding the `focus` package
_WIKITEXT_HUB = "Salesforce/wikitext"

# split -> (hub config, file inside the mirror). The mirror lacks raw validation, so "validation" is the
# tokenized config (`<unk>`, " @-@ ") on the hub too: fine for model selection, not comparable to raw numbers.
_WIKITEXT = {
    "train": ("wikitext-2-raw-v1", "wikitext/wikitext-2-raw-v1/train.jsonl"),  # not in the shipped mirror
    "validation": ("wikitext-2-v1", "wikitext/wikitext-2-v1/validation.jsonl"),
    "test": ("wikitext-2-raw-v1", "wikitext/wikitext-2-raw-v1/test.jsonl"),
}
_BOOKS = "pg19_style_books/books.jsonl"
_NONFICTION = "pg19_style_nonfiction/books.jsonl"
_MIRROR_ONLY = {"books": _BOOKS, "books_by_book": _BOOKS, "nonfiction": _NONFICTION}
"""Corpora read from the mirror alone (deepmind/pg19 on the hub is other data), by the file that holds them."""
# The novels cut by book: the two held-out books are mid-sized (560K and 760K characters), so that each scores 16K
# tokens and the five trained on keep 3.3M of the 4.7M characters.
_HELD_OUT_BOOKS = {"validation": "The Adventures of Sherlock Holmes", "test": "A Tale of Two Cities"}
# Per book, by characters: [0, 90%) train, [90%, 95%) validation, [95%, 100%] test, each cut moved to a line end.
_BOOK_CUTS = (0.90, 0.95)


def find_mirror(explicit: str | Path | None = None) -> Path | None:
    """The offline data mirror folder (one holding MANIFEST.json), or None if there is none.

    Search order: `explicit`, `$FOCUS_DATA_MIRROR`, then `shared/data` and `../shared/data` relative to the
    current directory and to the repository root, so /work/shared/data is found from /work/main.

    Raises:
        FileNotFoundError: `explicit` or `$FOCUS_DATA_MIRROR` is given but is not a mirror; a typo there should
            not silently fall through to another copy or the hub.
    """
    for named, label in ((explicit, "mirror argument"), (os.environ.get(MIRROR_ENV), f"${MIRROR_ENV}")):
        if named:
            path = Path(named).expanduser()
            if not (path / _MANIFEST).is_file():
                raise FileNotFoundError(f"{label} {str(path)!r} is not a data mirror (no {_MANIFEST} in it)")
            return path.resolve()
    for path in _default_mirror_candidates():
        if (path / _MANIFEST).is_file():
            return path.resolve()
    return None


class MirrorError(ValueError):
    """A data mirror file does not match its MANIFEST.json entry. The message names the file and both values."""


def verify_mirror_file(path: str | Path) -> None:
    """Check one file of the data mirror against its MANIFEST.json entry before anything reads it.

    Size and row count are checked every time (a file cut at a line end keeps valid rows, only fewer of them); the
    sha256 once per file version: a match is remembered by (size, mtime) in `<focus cache>/mirror_checks.json`, so
    the first check of an unchanged file in a new process costs a line count, and later ones in it a stat.

    Raises:
        MirrorError: the file is not listed in MANIFEST.json, or its size, rows or sha256 differ (one line naming
            the file, the expected and the found value).
    """
    path = Path(path).resolve()
    root = next((folder for folder in path.parents if (folder / _MANIFEST).is_file()), None)
    if root is None:
        raise MirrorError(f"{path}: no {_MANIFEST} in any folder above it, so it cannot be checked")
    relative = path.relative_to(root).as_posix()
    entry = _manifest_entries(str(root / _MANIFEST)).get(relative)
    if entry is None:
        raise MirrorError(f"{path}: not listed in {root / _MANIFEST}")
    stat = path.stat()
    _verify_version(str(path), stat.st_size, stat.st_mtime_ns, str(root / _MANIFEST))


@functools.lru_cache(maxsize=64)
def _verify_version(file: str, size: int, mtime_ns: int, manifest: str) -> None:
    """`verify_mirror_file` of one file version, done once per process (only a passing check is remembered)."""
    path = Path(file)
    entry = _manifest_entries(manifest)[path.relative_to(Path(manifest).parent).as_posix()]
    if size != entry["bytes"]:
        raise MirrorError(f"{path}: {size:,} bytes, {_MANIFEST} says {entry['bytes']:,}; the file is damaged")
    rows = _row_count(path, entry.get("kind"))
    if entry.get("rows") is not None and rows != entry["rows"]:
        raise MirrorError(f"{path}: {rows:,} rows, {_MANIFEST} says {entry['rows']:,}; the file is damaged")
    _check_sha256(path, entry["sha256"], size, mtime_ns)


def _row_count(path: Path, kind: str | None) -> int:
    """Rows as MANIFEST.json counts them: non-empty lines of a JSON-lines file, every line of a text file."""
    with open(path, "rb") as file:
        if kind == "jsonl":
            return sum(1 for line in file if line.strip())
        return sum(1 for _ in file)


@functools.lru_cache(maxsize=4)
def _manifest_entries(manifest: str) -> dict[str, dict]:
    """{file: entry} of a MANIFEST.json; a file that is not one (empty, cut short, not a mapping of `files`) is a
    MirrorError naming it."""
    import json

    try:
        record = json.loads(Path(manifest).read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise MirrorError(f"{manifest} is not valid JSON ({str(err).splitlines()[0]}); the mirror's manifest is "
                          "damaged") from None
    files = record.get("files", []) if isinstance(record, dict) else None
    if not isinstance(files, list) or not all(isinstance(entry, dict) and "file" in entry for entry in files):
        raise MirrorError(f"{manifest} is not a data mirror manifest (a mapping whose `files` lists entries with a "
                          f"`file` each); found {type(record).__name__}")
    return {entry["file"]: entry for entry in files}


def _check_sha256(path: Path, expected: str, size: int, mtime_ns: int) -> None:
    import hashlib
    import json

    from focus.files import write_json
    from focus.sources import focus_cache_dir

    version = {"size": size, "mtime_ns": mtime_ns, "sha256": expected}
    record = focus_cache_dir() / "mirror_checks.json"
    try:
        checked = json.loads(record.read_text())
    except (OSError, ValueError):
        checked = {}
    if checked.get(str(path)) == version:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise MirrorError(f"{path}: sha256 {digest.hexdigest()}, {_MANIFEST} says {expected}; the file was changed")
    try:
        write_json(record, {**checked, str(path): version})
    except OSError:  # a read-only cache only costs the hash again next time
        pass


def load_corpus(name: str, split: str, mirror: str | Path | None = None) -> str:
    """The text of one corpus split, as one string.

    Args:
        name: "wikitext2" (rows of Salesforce/wikitext joined with "\\n\\n", the usual LLM perplexity text; test
            and train are wikitext-2-raw-v1, validation is wikitext-2-v1), "books" or "nonfiction" (the mirror's 7
            PG-19-style novels or 10 non-fiction books, each split by `split_book`), "books_by_book" (the novels
            split by `split_books_by_book`); books are joined with "\\n\\n" and come from the mirror only.
        split: "train", "validation" or "test".
        mirror: mirror folder; default: `find_mirror()`.

    Raises:
        ValueError: unknown `name` or `split`.
        MirrorError: the mirror file does not match MANIFEST.json (`verify_mirror_file`).
        FileNotFoundError: one line naming the corpus, split, mirror file and places searched, when neither the
            mirror nor (for wikitext2) the hub provides the split.
    """
    path, relative, searched = _mirror_file(name, split, mirror)
    if path is not None:
        verify_mirror_file(path)
        if name == "books_by_book":
            return "\n\n".join(split_books_by_book(_mirror_rows(str(path)))[split])
        texts = _mirror_texts(str(path))
        if name in _MIRROR_ONLY:
            texts = tuple(split_book(book)[split] for book in texts)
        return "\n\n".join(texts)

    if name in _MIRROR_ONLY:
        raise FileNotFoundError(
            f"{name} split {split!r} not found: no mirror file {relative} (searched {searched}); "
            "books come only from the mirror (deepmind/pg19 on the hub is different data)"
        )
    config = _WIKITEXT[split][0]
    try:
        texts = _hub_texts(_WIKITEXT_HUB, config, split)
    except Exception as err:  # datasets raises ConnectionError, FileNotFoundError, ValueError, ... when offline
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise FileNotFoundError(
            f"wikitext2 split {split!r} not found: no mirror file {relative} (searched {searched}) and the hub "
            f"({_WIKITEXT_HUB} {config} {split}) failed: {reason}"
        ) from err
    return "\n\n".join(texts)


def corpus_location(name: str, split: str, mirror: str | Path | None = None) -> str:
    """Where `load_corpus(name, split, mirror)` will read from, without loading it: a mirror file path (verified
    against MANIFEST.json), or "hub <dataset> <config> <split>". Cheap, so a pipeline checks all its data before any
    job starts.

    Raises:
        ValueError: unknown `name` or `split`; MirrorError: the mirror file does not match MANIFEST.json.
        FileNotFoundError: one line naming the corpus, split and places searched, when the mirror lacks the file
            and the hub cannot provide it (books are mirror-only; the hub is unusable with HF_HUB_OFFLINE=1).
    """
    from huggingface_hub import constants  # reads HF_HUB_OFFLINE once, as every hub call does

    path, relative, searched = _mirror_file(name, split, mirror)
    if path is not None:
        verify_mirror_file(path)
        return str(path)
    if name in _MIRROR_ONLY:
        raise FileNotFoundError(f"{name} split {split!r} not found: no mirror file {relative} (searched {searched})")
    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(
            f"wikitext2 split {split!r} not found: no mirror file {relative} (searched {searched}) "
            "and the hub is off (HF_HUB_OFFLINE=1)"
        )
    return f"hub {_WIKITEXT_HUB} {_WIKITEXT[split][0]} {split}"


def split_book(text: str) -> dict[str, str]:
    """Cut one book into {"train", "validation", "test"}: its first 90%, next 5% and last 5% of characters.

    Each cut is moved forward to just after the next newline, so no line is split between two parts. The parts
    are disjoint and cover the book: train + validation + test == text.
    """
    cuts = []
    for fraction in _BOOK_CUTS:
        newline = text.find("\n", int(len(text) * fraction))
        cuts.append(len(text) if newline < 0 else newline + 1)
    first, second = cuts
    return {"train": text[:first], "validation": text[first:second], "test": text[second:]}


def split_books_by_book(rows: tuple[dict, ...]) -> dict[str, list[str]]:
    """The novels cut by book: {"validation": [one novel], "test": [another], "train": [the other five]}, in the
    mirror's order. `rows` are the mirror's rows (`short_book_title`, `text`).

    Raises:
        ValueError: a held-out title is not among the rows (a mirror other than the one this split was chosen for).
    """
    titles = [row["short_book_title"] for row in rows]
    missing = [title for title in _HELD_OUT_BOOKS.values() if title not in titles]
    if missing:
        raise ValueError(f"books_by_book holds out {' and '.join(missing)}, which the mirror's novels lack "
                         f"(it has {', '.join(titles)})")
    parts: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    held_out = {title: split for split, title in _HELD_OUT_BOOKS.items()}
    for row in rows:
        parts[held_out.get(row["short_book_title"], "train")].append(row["text"])
    return parts


def tokenize_corpus(text: str, tokenizer) -> torch.Tensor:
    """Token ids of `text` as one sequence: LongTensor (T,), no special tokens added, never truncated.

    The whole text goes through the tokenizer in one call, so ids are exactly what the tokenizer gives for the
    text (cutting it into pieces could change tokens at the cuts). `verbose=False` silences the "longer than
    the maximum sequence length" warning, which does not apply: `perplexity` windows the ids.
    """
    import torch

    ids = tokenizer(text, add_special_tokens=False, verbose=False, return_attention_mask=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def chunk_tokens(ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping rows of `seq_len` consecutive ids.

    Args:
        ids: LongTensor (T,).
        seq_len: tokens per row, >= 1.

    Returns:
        LongTensor (T // seq_len, seq_len), a view of `ids`; the last T % seq_len ids are dropped.
    """
    if ids.dim() != 1:
        raise ValueError(f"chunk_tokens expects 1D ids (T,), got shape {tuple(ids.shape)}")
    if seq_len < 1:
        raise ValueError(f"chunk_tokens seq_len must be >= 1, got {seq_len}")
    rows = ids.numel() // seq_len
    if rows == 0:
        raise ValueError(f"chunk_tokens: {ids.numel()} ids are fewer than seq_len={seq_len}")
    return ids[: rows * seq_len].view(rows, seq_len)  # (N, seq_len)


def _mirror_file(name: str, split: str, mirror: str | Path | None) -> tuple[Path | None, str, str]:
    """(mirror file of the split or None if absent, its path inside a mirror, the places searched)."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for corpus {name!r}; known: {', '.join(SPLITS)}")
    root = find_mirror(mirror)
    relative = _MIRROR_ONLY.get(name) or _WIKITEXT[split][1]
    if root is not None and (root / relative).is_file():
        return root / relative, relative, str(root / relative)
    return None, relative, str(root / relative) if root is not None else _searched_places(mirror)


def _default_mirror_candidates() -> list[Path]:
    bases = [Path.cwd(), _REPO_ROOT]
    return [base / up / "shared" / "data" for base in bases for up in (".", "..")]


def _searched_places(explicit: str | Path | None) -> str:
    """The mirror folders that `find_mirror` looked in (none of them held a mirror)."""
    named = [str(p) for p in (explicit, os.environ.get(MIRROR_ENV)) if p]
    return ", ".join(named + [str(p) for p in _default_mirror_candidates()])


@functools.lru_cache(maxsize=8)
def _mirror_texts(path: str) -> tuple[str, ...]:
    """The `text` column of a hub-layout JSONL file in the mirror (cached: books.jsonl is read for every split)."""
    import datasets  # deferred: importing datasets costs about a second and only corpus loading needs it

    rows = datasets.load_dataset("json", data_files={"rows": path}, split="rows")
    return tuple(rows["text"])


@functools.lru_cache(maxsize=8)
def _mirror_rows(path: str) -> tuple[dict, ...]:
    """Every row of a hub-layout JSONL file in the mirror, as dicts (the book titles beside the texts)."""
    import json

    with open(path, encoding="utf-8") as file:
        return tuple(json.loads(line) for line in file if line.strip())


def _hub_texts(path: str, config: str, split: str) -> list[str]:
    """The `text` column of a hub dataset split (needs the network or a warm hub cache)."""
    import datasets

    return list(datasets.load_dataset(path, config, split=split)["text"])
