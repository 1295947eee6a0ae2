"""Sliding-window perplexity of a causal LM over one long token sequence.

A window feeds the model `context_length` consecutive tokens ids[b : b + C] and reads its next-token predictions
for positions b + 1 .. b + C. Windows start every `stride` tokens. A window scores only the positions no earlier
window scored, so each of the positions 1 .. T - 1 is predicted exactly once: the first window with a context of
1 .. C tokens, every later one with at least C - stride + 1 tokens of context (stride == C gives independent,
non-overlapping input chunks; smaller strides trade compute for context).
"""

from __future__ import annotations

import math
from itertools import groupby

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from focus.models import check_context_length, input_device


def sliding_windows(num_tokens: int, context_length: int, stride: int) -> list[tuple[int, int, int]]:
    """The evaluation windows over a sequence of `num_tokens` tokens.

    Returns:
        (begin, end, scored) per window, in order: the model reads ids[begin:end] (end - begin <= context_length)
        and its last `scored` predictions, for positions end - scored + 1 .. end, are counted. The `scored`
        values sum to num_tokens - 1.
    """
    if num_tokens < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, got {num_tokens}")
    if context_length < 1:
        raise ValueError(f"context_length must be >= 1, got {context_length}")
    if not 1 <= stride <= context_length:
        raise ValueError(f"stride must be in [1, context_length={context_length}], got {stride}")
    windows = []
    next_position = 1  # first position not yet predicted; position 0 has no context and is never predicted
    begin = 0
    while next_position < num_tokens:
        # The input stops at T - 1: the prediction made at the last token has no target.
        end = min(begin + context_length, num_tokens - 1)
        # stride <= context_length keeps next_position >= begin + 1: every new target has context in the window.
        windows.append((begin, end, end + 1 - next_position))
        next_position = end + 1
        begin += stride
    return windows


@torch.no_grad()
def token_nll(
    model,
    input_ids: torch.Tensor,
    context_length: int,
    stride: int,
    batch_size: int = 1,
    progress: bool = True,
) -> torch.Tensor:
    """Negative log-likelihood of every token but the first, under sliding-window evaluation.

    Args:
        model: any Hugging Face causal LM (stock or custom attention); called with `input_ids` only.
        input_ids: LongTensor (T,), T >= 2.
        context_length: tokens the model reads per window (C).
        stride: tokens between window starts, 1 <= stride <= C.
        batch_size: windows per forward pass; only windows of equal length share a batch (no padding).
        progress: show a tqdm bar over windows.

    Returns:
        FloatTensor (T - 1,), float32 on CPU: entry i is -log p(ids[i + 1] | its window's earlier tokens).
    """
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be 1D (T,), got shape {tuple(input_ids.shape)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    check_context_length(model, context_length)
    windows = sliding_windows(input_ids.numel(), context_length, stride)
    device = input_device(model)
    ids = input_ids.to(device=device, dtype=torch.long)
    nll = torch.full((input_ids.numel() - 1,), float("nan"), dtype=torch.float32)

    was_training = model.training
    model.eval()  # dropout would make the numbers random; restored below so callers see no change
    try:
        with tqdm(total=len(windows), desc="perplexity", unit="window", disable=not progress) as bar:
            # Consecutive windows have equal length except at the ends, so grouping keeps the order.
            for length, same_length in groupby(windows, key=lambda w: w[1] - w[0]):
                same_length = list(same_length)
                for start in range(0, len(same_length), batch_size):
                    batch = same_length[start : start + batch_size]
                    _score_batch(model, ids, batch, length, nll)
                    bar.update(len(batch))
    finally:
        model.train(was_training)
    return nll


def perplexity(
    model,
    input_ids: torch.Tensor,
    context_length: int,
    stride: int,
    batch_size: int = 1,
    progress: bool = True,
) -> dict:
    """Sliding-window perplexity (arguments: see `token_nll`).

    Returns:
        {"nll": mean negative log-likelihood per predicted token (nats), "ppl": exp(nll),
         "tokens": number of predicted tokens, always T - 1, "window_nll": the mean NLL of the tokens each window
         scored, in window order (what `paired_ratio` compares two models on), "window_tokens": their counts}.
    """
    per_token = token_nll(model, input_ids, context_length, stride, batch_size, progress).double()
    mean = per_token.mean().item()  # float64: sums over ~1e6 tokens lose digits in float32
    scored = [window[2] for window in sliding_windows(input_ids.numel(), context_length, stride)]
    window_nll = [chunk.mean().item() for chunk in per_token.split(scored)]
    return {"nll": mean, "ppl": math.exp(mean), "tokens": per_token.numel(), "window_nll": window_nll,
            "window_tokens": scored}


def _score_batch(
    model, ids: torch.Tensor, windows: list[tuple[int, int, int]], length: int, nll: torch.Tensor
) -> None:
    """Run one batch of equal-length windows and write their new per-token NLLs into `nll` (T - 1,)."""
    inputs = torch.stack([ids[begin:end] for begin, end, _ in windows])  # (B, L)
    logits = model(input_ids=inputs, use_cache=False).logits  # (B, L, V)
    if logits.shape[:2] != inputs.shape:
        raise ValueError(f"model returned logits of shape {tuple(logits.shape)} for inputs {tuple(inputs.shape)}")
    for row, (_, end, scored) in enumerate(windows):
        # Prediction at input index j targets ids[begin + j + 1]; the last `scored` of them are new.
        row_logits = logits[row, length - scored :].float()  # (scored, V), float32 for the log-softmax
        targets = ids[end - scored + 1 : end + 1]  # (scored,)
        losses = F.cross_entropy(row_logits, targets, reduction="none")  # (scored,)
        nll[end - scored : end] = losses.cpu()  # entry i is position i + 1



@torch.no_grad()
def row_losses(model: torch.nn.Module, rows: torch.Tensor, batch_size: int = 4) -> torch.Tensor:
    """(N,) float64 mean next-token loss of each of `rows` (N, L), unpadded and equally long, so that their mean is
    the rows' loss and two models' losses pair row by row (`focus.eval.paired.paired_ratio`)."""
    model.eval()
    losses = []
    for chunk in rows.split(batch_size):
        chunk = chunk.to(input_device(model))
        logits = model(input_ids=chunk, use_cache=False).logits[:, :-1].float()
        per_token = F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")
        losses.append(per_token.mean(dim=1).double().cpu())
    return torch.cat(losses)
