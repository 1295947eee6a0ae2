"""Synthetic retrieval rows mixed into the centroid training: data that asks for attention far back.

Book text rarely needs a token hundreds of positions away, so centroids trained on it alone learn to prune the
pairs that retrieval needs (issue 27: the hard model lost the pass key). A retrieval row is book filler with a few
facts planted in its first part ("The ticket for amber falcon reads 48213.") and the same facts asked back near its
end ("The ticket for amber falcon reads" -> " 48213"): the answer is reachable only through the groups, and its
tokens carry `answer_weight` in the loss, so that a few of them per row weigh against the filler.

The phrasings are our own, on purpose unlike the pass-key check's (`focus.eval.needle`) and RULER's, so that the
checks still measure retrieval and not memorised templates.
"""

from __future__ import annotations

import random

import torch

# (the fact, the question that asks it back); both continue with the key.
TEMPLATES = (
    (" The ticket for {name} reads", " Which ticket was for {name}? The ticket for {name} reads"),
    (" Note that the {name} code is", " Recall the {name} code. The {name} code is"),
    (" {Name} lived at number", " Where did {name} live? {Name} lived at number"),
    (" The {name} register showed", " And the {name} register? The {name} register showed"),
)
WORDS = ("amber", "falcon", "copper", "willow", "harbor", "violet", "granite", "maple", "lantern", "orchid", "silver",
         "meadow", "cobalt", "raven", "thistle", "ember", "juniper", "quartz", "saffron", "badger")


def retrieval_rows(
    tokenizer, filler: torch.Tensor, count: int, seq_len: int, window: int, facts: int = 3, answer_weight: float = 20.0,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` rows of `seq_len` tokens and their per-token loss weights, both (count, seq_len).

    Each row: `facts` facts (fewer where short rows have no room for them all) at random places in its first half,
    then the same facts asked in another order among the last tokens, each answer more than `window` tokens after
    its fact. `weights[r, t]` weighs the prediction of token t (1 for filler, `answer_weight` for an answer's
    tokens; column 0 is never predicted).
    `filler` is a 1-D tensor of book token ids (the train split); row r draws its passage and its facts from
    `seed` and r alone.
    """
    if count < 1:
        raise ValueError(f"retrieval_rows needs count >= 1, got {count}")
    rows = torch.empty(count, seq_len, dtype=filler.dtype)
    weights = torch.ones(count, seq_len)
    # Every row's texts are drawn first and tokenized in one call: one call per text (8 a row) took 27 s of a tiny
    # model's 35 s training job, in the calls' own overhead.
    generators = [random.Random(f"{seed}/{r}") for r in range(count)]
    drawn = [_draw(generator, facts) for generator in generators]
    encoded = _tokenize(tokenizer, [text for texts in drawn for text in texts])
    for r in range(count):
        pieces = encoded[3 * facts * r : 3 * facts * (r + 1)]
        row = _row(filler, seq_len, window, facts, generators[r], pieces, encoded[-1])
        for planted in range(facts - 1, 0, -1):  # fewer facts where the row has no room for them all
            if row is not None:
                break
            # Drawing fewer facts draws the first of the same ones: only the generator's state after them is new.
            generator = random.Random(f"{seed}/{r}")
            _draw(generator, planted)
            row = _row(filler, seq_len, window, planted, generator, pieces, encoded[-1])
        if row is None:
            raise ValueError(f"retrieval rows of {seq_len} tokens have no room for a fact {window} tokens before its "
                             "question: train on longer rows or without retrieval rows (retrieval_share 0)")
        ids, answers = row
        rows[r] = ids
        for start, end in answers:
            weights[r, start:end] = answer_weight
    return rows, weights


def _draw(rng: random.Random, facts: int) -> list[str]:
    """The texts of `facts` facts, each (statement, key, question), drawn from `rng`."""
    texts = []
    for _ in range(facts):
        fact_text, question_text = rng.choice(TEMPLATES)
        name = " ".join(rng.sample(WORDS, 2))
        values = {"name": name, "Name": name.capitalize()}
        key = " " + str(rng.randrange(10 ** rng.randint(2, 5), 10 ** 6))
        texts += [fact_text.format(**values), key, question_text.format(**values)]
    return texts


def _tokenize(tokenizer, texts: list[str]) -> list[torch.Tensor]:
    """The ids of each text, then of the period that ends a fact (the last)."""
    return [torch.tensor(ids, dtype=torch.long) for ids in tokenizer([*texts, "."], add_special_tokens=False).input_ids]


def _row(filler: torch.Tensor, seq_len: int, window: int, facts: int, rng: random.Random, pieces: list[torch.Tensor],
         period: torch.Tensor):
    """(ids, answer spans) of one row from its facts' tokenized texts (`_draw`'s order) and `rng` after the draw, or
    None when the facts and their questions leave under 2 windows of filler."""
    planted = [torch.cat([pieces[3 * f], pieces[3 * f + 1], period]) for f in range(facts)]
    asked = [(pieces[3 * f + 2], pieces[3 * f + 1], period) for f in range(facts)]
    order = rng.sample(range(facts), facts)
    tail = sum(q.numel() + k.numel() + p.numel() for q, k, p in asked)
    room = seq_len - tail - sum(p.numel() for p in planted)
    if room < 2 * window:
        return None
    start = rng.randrange(0, filler.numel() - room)
    text = filler[start : start + room]
    # The facts go into the first half of the filler, the questions after all of it: every answer is at least half
    # the filler (>= window tokens) past its fact.
    cuts = sorted(rng.sample(range(room // 2), facts))
    pieces, at = [], 0
    for cut, fact in zip(cuts, planted):
        pieces += [text[at:cut], fact]
        at = cut
    pieces.append(text[at:])
    answers, length = [], sum(p.numel() for p in pieces)
    for fact in order:
        question, key, period = asked[fact]
        pieces += [question, key, period]
        answers.append((length + question.numel(), length + question.numel() + key.numel()))
        length += question.numel() + key.numel() + period.numel()
    return torch.cat(pieces), answers
