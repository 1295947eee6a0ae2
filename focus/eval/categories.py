"""Token categories for group interpretability: a partition of every token by its text, without a tagger."""

from __future__ import annotations

import unicodedata

import torch

CATEGORIES = {
    "function_word": "word-initial, lower-cased text in FUNCTION_WORDS (the, of, and, he, was, ...)",
    "capitalised": "word-initial, starts with an upper-case letter (names, sentence starts), not a function word",
    "word_start": "word-initial, lower-case, not a function word",
    "continuation": "letters continuing a word: no leading space and the token before ends in a letter or digit",
    "number": "digits (with punctuation), no letters",
    "punctuation": "punctuation and symbols only",
    "space": "whitespace only (spaces, newlines)",
    "other": "special tokens, letters mixed with digits or symbols, partial UTF-8 bytes",
}
CATEGORY_NAMES = tuple(CATEGORIES)
FUNCTION_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below between
    both but by can could did do does doing down during each few for from further had has have having he her here
    hers herself him himself his how i if in into is it its itself just me might more most must my myself no nor not
    now of off on once only or other ought our ours ourselves out over own same shall she should so some such than
    that the their theirs them themselves then there these they this those through to too under until up upon very
    was we were what when where which while who whom whose why will with would yet you your yours yourself
    yourselves""".split()
)
_WORD_MARKS = "'’-"  # letters plus these make a word piece ("n't", "'s", "-like")


def token_texts(tokenizer, ids: torch.Tensor) -> dict[int, str]:
    """{id: decoded text} of every distinct id in `ids`."""
    return {i: tokenizer.decode([i]) for i in ids.unique().tolist()}


def categorise(rows: torch.Tensor, tokenizer) -> torch.Tensor:
    """(R, L) token ids -> (R, L) int64 index into CATEGORY_NAMES: exactly one category per token.

    Word-initial means a leading space (byte-level BPE's 'Ġ', SentencePiece's '▁'), the start of a row, or a token
    before it that does not end in a letter or digit (a word after a newline or an opening quote).
    """
    special = set(tokenizer.all_special_ids)
    texts = token_texts(tokenizer, rows)
    kinds = {}
    for i, text in texts.items():
        piece = tokenizer.convert_ids_to_tokens(i) or ""
        spaced = text[:1].isspace() or piece[:1] in ("Ġ", "▁")
        kinds[i] = (_base_kind(text.strip(), i in special), spaced, text[-1:].isalnum(), text.strip())
    index = {name: k for k, name in enumerate(CATEGORY_NAMES)}
    out = torch.empty_like(rows)
    for r, row in enumerate(rows.tolist()):
        previous_alnum = False
        for t, i in enumerate(row):
            kind, spaced, ends_alnum, core = kinds[i]
            if kind == "word":
                if spaced or t == 0 or not previous_alnum:
                    first = core.lstrip(_WORD_MARKS)[:1]
                    kind = ("function_word" if core.lower() in FUNCTION_WORDS
                            else "capitalised" if first.isupper() else "word_start")
                else:
                    kind = "continuation"
            out[r, t] = index[kind]
            previous_alnum = ends_alnum
    return out


def _base_kind(core: str, special: bool) -> str:
    """Category of a token's own text (stripped of spaces), before context decides word-initial or continuation."""
    if special:
        return "other"
    if not core:
        return "space"
    if any(c.isalpha() for c in core):
        return "word" if all(c.isalpha() or c in _WORD_MARKS for c in core) else "other"
    if any(c.isdigit() for c in core):
        return "number"
    if all(_is_symbol(c) for c in core):
        return "punctuation"
    return "other"


def _is_symbol(char: str) -> bool:
    return unicodedata.category(char)[0] in "PS"
