import json
import logging
import re
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from focus import data
from focus.data import (
    MIRROR_ENV,
    chunk_tokens,
    find_mirror,
    load_corpus,
    split_book,
    split_books_by_book,
    tokenize_corpus,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def mirror(monkeypatch):
    """The real mirror found from the repository, with $FOCUS_DATA_MIRROR unset; skips where there is none."""
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    found = find_mirror()
    if found is None:
        pytest.skip("no offline data mirror (shared/data) next to this checkout")
    return found


@pytest.fixture
def offline_hub(monkeypatch):
    """Make the hub unreachable without waiting for its retries (about 25 s when really offline)."""
    calls = []

    def unreachable(*args):
        calls.append(args)
        raise ConnectionError("Couldn't reach 'Salesforce/wikitext' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(data, "_hub_texts", unreachable)
    return calls


def _fake_mirror(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "MANIFEST.json").write_text("{}")
    return folder


# --- find_mirror --------------------------------------------------------------------------------------------------


def test_mirror_found_from_another_working_directory(mirror, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_mirror() == mirror
    assert (mirror / "MANIFEST.json").is_file()


def test_mirror_search_order(tmp_path, monkeypatch):
    explicit, from_env = _fake_mirror(tmp_path / "a"), _fake_mirror(tmp_path / "b")
    monkeypatch.setenv(MIRROR_ENV, str(from_env))
    assert find_mirror(explicit) == explicit.resolve()
    assert find_mirror() == from_env.resolve()


def test_mirror_found_in_working_directory_and_none_when_absent(tmp_path, monkeypatch):
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    monkeypatch.setattr(data, "_REPO_ROOT", tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    assert find_mirror() is None
    local = _fake_mirror(tmp_path / "shared" / "data")
    assert find_mirror() == local.resolve()


@pytest.mark.parametrize("use_env", [False, True])
def test_named_mirror_without_manifest_is_an_error(tmp_path, monkeypatch, use_env):
    if use_env:
        monkeypatch.setenv(MIRROR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not a data mirror") as error:
        find_mirror(None if use_env else tmp_path)
    assert str(tmp_path) in str(error.value)


# --- load_corpus --------------------------------------------------------------------------------------------------


def test_wikitext_test_is_raw_rows_joined(mirror):
    rows = [json.loads(line)["text"] for line in open(mirror / "wikitext/wikitext-2-raw-v1/test.jsonl")]
    assert len(rows) == 4358
    text = load_corpus("wikitext2", "test")
    assert text == "\n\n".join(rows)
    assert text.startswith("\n\n = Robert Boulter = \n") and "<unk>" not in text


def test_wikitext_validation_is_the_tokenized_config(mirror):
    text = load_corpus("wikitext2", "validation")
    assert text.startswith("\n\n = Homarus gammarus = \n") and "<unk>" in text and " @-@ " in text
    assert len(text) > 1_000_000


def test_missing_wikitext_split_names_file_and_places(mirror, offline_hub):
    with pytest.raises(FileNotFoundError) as error:
        load_corpus("wikitext2", "train")
    message = str(error.value)
    assert "\n" not in message
    for part in ("wikitext2", "'train'", "wikitext-2-raw-v1/train.jsonl", str(mirror), "Couldn't reach"):
        assert part in message
    assert offline_hub == [("Salesforce/wikitext", "wikitext-2-raw-v1", "train")]


def test_no_mirror_falls_back_to_the_hub(tmp_path, monkeypatch):
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    monkeypatch.setattr(data, "_REPO_ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(data, "_hub_texts", lambda path, config, split: [f"{config}:{split}", "row"])
    assert load_corpus("wikitext2", "validation") == "wikitext-2-v1:validation\n\nrow"
    assert load_corpus("wikitext2", "test") == "wikitext-2-raw-v1:test\n\nrow"


def test_books_never_come_from_the_hub(tmp_path, offline_hub):
    empty = _fake_mirror(tmp_path / "mirror")
    with pytest.raises(FileNotFoundError) as error:
        load_corpus("books", "test", mirror=empty)
    message = str(error.value)
    assert "\n" not in message and "books" in message and "'test'" in message
    assert str(empty / "pg19_style_books/books.jsonl") in message
    assert offline_hub == []


def test_unknown_corpus_and_split():
    with pytest.raises(ValueError, match="'pg19'.*wikitext2, books"):
        load_corpus("pg19", "test")
    with pytest.raises(ValueError, match="'dev'.*train, validation, test"):
        load_corpus("books", "dev")


# --- books split --------------------------------------------------------------------------------------------------


def test_split_book_is_disjoint_covering_and_cut_at_lines():
    text = "".join(f"line {i} " + "x" * (i % 17) + "\n" for i in range(1000))
    parts = split_book(text)
    assert parts["train"] + parts["validation"] + parts["test"] == text
    assert parts["train"].endswith("\n") and parts["validation"].endswith("\n")
    assert 0.90 <= len(parts["train"]) / len(text) < 0.91
    assert 0.04 < len(parts["validation"]) / len(text) <= 0.05 + 0.01
    assert split_book("no newline at all") == {"train": "no newline at all", "validation": "", "test": ""}


def test_books_splits_partition_every_book(mirror):
    rows = [json.loads(line) for line in open(mirror / "pg19_style_books/books.jsonl")]
    assert len(rows) == 7
    corpus = {split: load_corpus("books", split) for split in ("train", "validation", "test")}
    for split, text in corpus.items():
        assert text == "\n\n".join(split_book(row["text"])[split] for row in rows)
    books = sum(len(row["text"]) for row in rows)
    separators = 3 * 6 * len("\n\n")
    assert sum(len(text) for text in corpus.values()) == books + separators
    assert 0.04 < len(corpus["test"]) / books < 0.06
    probe = corpus["test"][len(corpus["test"]) // 2 :][:300]  # held-out text must not leak into train
    assert probe not in corpus["train"] and probe not in corpus["validation"]


def test_books_by_book_holds_out_whole_novels(mirror):
    """Validation and test are each one whole novel that the train split never holds; train is the other five."""
    rows = [json.loads(line) for line in open(mirror / "pg19_style_books/books.jsonl")]
    corpus = {split: load_corpus("books_by_book", split) for split in ("train", "validation", "test")}
    by_title = {row["short_book_title"]: row["text"] for row in rows}
    assert corpus["validation"] == by_title["The Adventures of Sherlock Holmes"]
    assert corpus["test"] == by_title["A Tale of Two Cities"]
    held_out = ("The Adventures of Sherlock Holmes", "A Tale of Two Cities")
    assert corpus["train"] == "\n\n".join(row["text"] for row in rows if row["short_book_title"] not in held_out)
    for split in ("validation", "test"):  # not a line of either held-out novel leaks into training
        probe = corpus[split][len(corpus[split]) // 2 :][:300]
        assert probe not in corpus["train"]


def test_nonfiction_splits_every_book_by_region(mirror):
    rows = [json.loads(line) for line in open(mirror / "pg19_style_nonfiction/books.jsonl")]
    assert len(rows) == 10
    for split in ("train", "validation", "test"):
        assert load_corpus("nonfiction", split) == "\n\n".join(split_book(row["text"])[split] for row in rows)


def test_held_out_novels_missing_from_a_mirror_is_one_line():
    with pytest.raises(ValueError, match="holds out The Adventures of Sherlock Holmes and A Tale of Two Cities"):
        split_books_by_book(({"short_book_title": "Dracula", "text": "x"},))


# --- tokens -------------------------------------------------------------------------------------------------------


def test_tokenize_corpus_whole_text_no_specials_no_warning(tiny_tokenizer):
    # A copy with a short model_max_length: the session fixture stays untouched.
    backend = Tokenizer.from_str(tiny_tokenizer.backend_tokenizer.to_str())
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", model_max_length=16
    )
    text = "The quick brown fox.\n\nIt was the best of times.\n" * 20
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    tokenizer_logger = logging.getLogger("transformers.tokenization_utils_base")
    tokenizer_logger.addHandler(handler)
    try:
        ids = tokenize_corpus(text, tokenizer)
        assert records == []
        tokenizer(text)  # control: the stock call does warn, so the check above can fail
        assert any("longer than the specified maximum" in r.getMessage() for r in records)
    finally:
        tokenizer_logger.removeHandler(handler)
    assert ids.dtype == torch.long and ids.dim() == 1 and ids.numel() > 16
    assert ids.tolist() == tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.bos_token_id not in ids.tolist()
    assert tokenizer.decode(ids) == text


def test_chunk_tokens_drops_ragged_tail():
    ids = torch.arange(23)
    chunks = chunk_tokens(ids, 5)
    assert chunks.shape == (4, 5) and chunks.dtype == torch.long
    assert torch.equal(chunks.flatten(), torch.arange(20))
    assert torch.equal(chunk_tokens(ids, 23), ids[None])
    with pytest.raises(ValueError, match="fewer than seq_len=24"):
        chunk_tokens(ids, 24)
    with pytest.raises(ValueError, match="1D"):
        chunk_tokens(ids.view(1, 23), 5)
    with pytest.raises(ValueError, match="seq_len must be >= 1, got 0"):
        chunk_tokens(ids, 0)


# ---- the mirror is checked against MANIFEST.json -----------------------------------------------------------------


@pytest.fixture
def mirror_copy(mirror, tmp_path, monkeypatch):
    """A private copy of the mirror's books file and MANIFEST.json, and a private focus cache (the sha256 record)."""
    copy = tmp_path / "mirror"
    (copy / "pg19_style_books").mkdir(parents=True)
    (copy / "MANIFEST.json").write_bytes((mirror / "MANIFEST.json").read_bytes())
    (copy / "pg19_style_books" / "books.jsonl").write_bytes((mirror / "pg19_style_books" / "books.jsonl").read_bytes())
    monkeypatch.setenv("FOCUS_CACHE", str(tmp_path / "cache"))
    data._mirror_texts.cache_clear()
    return copy


def test_a_books_file_cut_at_a_line_end_is_refused_before_it_is_read(mirror_copy):
    books = mirror_copy / "pg19_style_books" / "books.jsonl"
    lines = books.read_bytes().splitlines(keepends=True)
    books.write_bytes(b"".join(lines[:3]))  # 3 of the 7 books: every row still valid JSON
    manifest = json.loads((mirror_copy / "MANIFEST.json").read_text())
    entry = next(e for e in manifest["files"] if e["file"] == "pg19_style_books/books.jsonl")
    entry["bytes"] = books.stat().st_size  # as if the size had been fixed up by hand: the rows still differ
    (mirror_copy / "MANIFEST.json").write_text(json.dumps(manifest))
    data._manifest_entries.cache_clear()
    with pytest.raises(data.MirrorError, match=r"books\.jsonl: 3 rows, MANIFEST\.json says 7; the file is damaged"):
        load_corpus("books", "train", mirror_copy)
    with pytest.raises(data.MirrorError, match="3 rows"):
        data.corpus_location("books", "test", mirror_copy)


def test_a_cut_file_is_refused_by_its_size_and_a_changed_one_by_its_sha256(mirror_copy):
    books = mirror_copy / "pg19_style_books" / "books.jsonl"
    original = books.read_bytes()
    books.write_bytes(original[: len(original) // 2])
    with pytest.raises(data.MirrorError, match=r"books\.jsonl: 2,404,317 bytes, MANIFEST\.json says 4,808,634"):
        load_corpus("books", "train", mirror_copy)
    changed = bytearray(original)
    at = changed.index(b" the ")
    changed[at + 1 : at + 4] = b"THE"  # same size, same rows, other text
    books.write_bytes(bytes(changed))
    with pytest.raises(data.MirrorError, match="sha256 .*, MANIFEST.json says .*; the file was changed"):
        load_corpus("books", "train", mirror_copy)


def test_the_sha256_is_computed_once_per_file_version(mirror_copy, monkeypatch):
    import hashlib

    hashed = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *args: hashed.append(1) or real(*args))
    books = mirror_copy / "pg19_style_books" / "books.jsonl"
    data.verify_mirror_file(books)
    data._verify_version.cache_clear()  # as in a new process: only the record in the focus cache remembers
    data.verify_mirror_file(books)
    assert len(hashed) == 1
    books.touch()  # a new modification time: another version, hashed again
    data.verify_mirror_file(books)
    assert len(hashed) == 2


def test_a_damaged_mirror_fails_profile_validation_in_one_line(mirror_copy):
    import yaml

    from focus.config import ConfigError
    from focus.pipeline.profile import resolve_profile

    root = Path(__file__).resolve().parent.parent
    books = mirror_copy / "pg19_style_books" / "books.jsonl"
    books.write_bytes(books.read_bytes()[:-10])
    config = yaml.safe_load((root / "configs" / "tiny.yaml").read_text())
    config.update(models={"tiny": {"source": "tiny:llama"}}, data={"mirror": str(mirror_copy), "domains": {"books": ["train", "validation", "test"]}})
    config["perplexity"]["domains"] = ["books"]
    config.pop("benchmark"), config.pop("interpret")
    schema = yaml.safe_load((root / "workflow" / "schemas" / "config.schema.yaml").read_text())
    with pytest.raises(ConfigError, match=r"^data\.domains\.books: .*books\.jsonl: .* bytes, MANIFEST\.json says") as info:
        resolve_profile(config, schema)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("content, found", [("", "not valid JSON"), ('{"files": [', "not valid JSON"),
                                            ("[]", "found list"), ('{"files": {"a": 1}}', "found dict")])
def test_a_damaged_manifest_is_one_error_naming_it_in_the_library_the_command_and_a_profile(mirror_copy, content,
                                                                                             found, capsys):
    from focus.cli import main
    from focus.config import ConfigError
    from focus.pipeline.profile import resolve_profile

    manifest = mirror_copy / "MANIFEST.json"
    manifest.write_text(content)
    data._manifest_entries.cache_clear()
    with pytest.raises(data.MirrorError, match=re.escape(str(manifest))) as info:
        load_corpus("books", "train", mirror_copy)
    assert found in str(info.value) and "\n" not in str(info.value)

    assert main(["train", "--model", "tiny:llama", "--mirror", str(mirror_copy), "--output", str(mirror_copy / "run"),
                 "--seq_len", "64", "--window", "8"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and str(manifest) in error and found in error
    assert not (mirror_copy / "run").exists()

    profile = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    profile["data"] = {"mirror": str(mirror_copy), "domains": {"books": ["train", "validation", "test"]}}
    profile["perplexity"]["domains"] = ["books"]
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    with pytest.raises(ConfigError, match=re.escape(str(manifest))):
        resolve_profile(profile, schema)
