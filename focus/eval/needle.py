"""Needle retrieval: can the model recall a pass key planted far back in a long passage?

Benchmark prompts are mostly shorter than the Focus window, where Focus equals full attention (PAPER.md open
point 7). This check puts the only information that answers the question at a chosen depth of a long book
passage, so when the passage is longer than the window the answer can only be reached through the groups.

A trial: book tokens as filler, a needle sentence holding a random five-digit key inserted at `depth` (0 = start,
1 = just before the question), then the question. Scored two ways: greedy decoding (correct when the first
digits generated are the key) and the log-probability of the key's tokens given the prompt (finer-grained).
"""

from __future__ import annotations

import random

import torch
from tqdm.auto import tqdm

from focus.models import check_context_length, input_device

NEEDLE = " The secret pass key is {key}. Remember it: the pass key is {key}. "
QUESTION = " What is the secret pass key? The secret pass key is"


@torch.no_grad()
def needle_trials(
    model,
    tokenizer,
    filler: torch.Tensor,
    lengths: list[int],
    depths: list[float],
    trials: int,
    seed: int = 0,
    progress: bool = True,
) -> list[dict]:
    """One record per (length, depth, trial): the key, the greedy answer, correct or not, the key's log-prob.

    `filler` is a long 1-D tensor of token ids (a book); trial t of each length starts at a different offset.
    The prompt is exactly `length` tokens.
    """
    check_context_length(model, max(lengths))
    rng = random.Random(seed)
    device = input_device(model)
    question = tokenizer(QUESTION, add_special_tokens=False, return_tensors="pt").input_ids[0]
    cells = [(length, depth, trial) for length in lengths for depth in depths for trial in range(trials)]
    records = []
    for length, depth, trial in tqdm(cells, desc="needle", disable=not progress):
        prompt, answer, key, distance, _ = needle_prompt(tokenizer, filler, length, depth, rng, question)
        prompt = prompt.unsqueeze(0).to(device)
        key_logprob = _continuation_logprob(model, prompt, answer.to(device))
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=answer.numel() + 1,
                                   do_sample=False)
        reply = tokenizer.decode(generated[0, prompt.shape[1] :], skip_special_tokens=True)
        digits = "".join(ch for ch in reply if ch.isdigit())
        records.append({
            "length": length,
            "depth": depth,
            "trial": trial,
            "key": key,
            "distance": distance,
            "reply": reply,
            "correct": digits.startswith(key),
            "key_logprob": key_logprob,
        })
    return records


def needle_prompt(
    tokenizer, filler: torch.Tensor, length: int, depth: float, rng: random.Random, question: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, str, int, tuple[int, int]]:
    """One trial's prompt: (prompt (length,) token ids, the answer's token ids, the key, the tokens from the needle's
    end to the last prompt token, the needle's span [start, end) in the prompt). Draws the key, then the filler's
    offset, from `rng`."""
    if question is None:
        question = tokenizer(QUESTION, add_special_tokens=False, return_tensors="pt").input_ids[0]
    key = str(rng.randrange(10000, 100000))
    needle = tokenizer(NEEDLE.format(key=key), add_special_tokens=False, return_tensors="pt").input_ids[0]
    answer = tokenizer(" " + key, add_special_tokens=False, return_tensors="pt").input_ids[0]
    room = length - needle.numel() - question.numel()
    if room < 1:
        raise ValueError(f"needle length {length} leaves no room for filler around a "
                         f"{needle.numel() + question.numel()}-token needle and question")
    start = rng.randrange(0, filler.numel() - room)
    text = filler[start : start + room]
    at = round(depth * room)
    prompt = torch.cat([text[:at], needle, text[at:], question])
    return prompt, answer, key, room - at + question.numel(), (at, at + needle.numel())


def _continuation_logprob(model, prompt: torch.Tensor, continuation: torch.Tensor) -> float:
    """log p(continuation | prompt) under teacher forcing, summed over its tokens."""
    ids = torch.cat([prompt[0], continuation]).unsqueeze(0)
    logits = model(ids).logits[0, prompt.shape[1] - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, continuation.unsqueeze(-1)).sum().item()
