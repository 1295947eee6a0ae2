"""What a training step minimises: the next-token loss, weighted, plus whatever terms its caller adds.

The loop (`focus.train.loop.train_parameters`) is generic; the objective is its caller's. A Focus model's config
names its own (`focus_objective`): the next-token loss, the attention-recall loss in its place, and a distillation
term that holds the trained model near the pretrained one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from focus.attention.routers.recall import collect_recall_loss
from focus.retrofit import focus_config, focus_disabled, has_focus

LossTerm = Callable[..., torch.Tensor]
"""`term(model, batch (B, L), logits (B, L, V)) -> scalar`, called right after each training forward pass (so it can
read what the forward left on the modules); `term(model, batch, logits, weights (B, L))` where the run gives the term
weights (`train_parameters(term_weights=...)`), which weigh predicting each token, as the next-token loss's do."""


@dataclass(frozen=True)
class Objective:
    """`next_token_weight` x the next-token loss + sum of weight x term over `terms` ({name: (weight, term)}).

    Every term is logged unweighted as `train/<name>_loss`; `train/loss` is always the next-token loss.
    """

    terms: Mapping[str, tuple[float, LossTerm]] = field(default_factory=dict)
    next_token_weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.next_token_weight >= 0 or any(not w >= 0 for w, _ in self.terms.values()):
            raise ValueError("Objective weights must be >= 0")
        if self.next_token_weight == 0 and not any(w > 0 for w, _ in self.terms.values()):
            raise ValueError("Objective has nothing to minimise: every weight is 0")


def focus_objective(model: nn.Module) -> Objective:
    """The objective a model's Focus config asks for (the next-token loss for a model without Focus).

    `objective="attention_recall"`: the recall loss in place of the next-token loss. `distill` > 0: plus that weight
    x the KL divergence from the pretrained model's next-token distribution (`pretrained_kl`), the dense teacher; a
    run with broad training text gives the term the broad rows alone (`TrainingJob.training_rows`).
    """
    if not has_focus(model):
        return Objective()
    config = focus_config(model)
    terms: dict[str, tuple[float, LossTerm]] = {}
    if config.objective == "attention_recall":
        terms["recall"] = (1.0, recall_term)
    if config.distill > 0:
        terms["distill"] = (config.distill, pretrained_kl)
    return Objective(terms, 0.0 if "recall" in terms else 1.0)


def recall_term(model: nn.Module, batch: torch.Tensor, logits: torch.Tensor,
                weights: torch.Tensor | None = None) -> torch.Tensor:
    """The attention-recall loss of the forward pass that just ran (`focus.attention.routers.recall`)."""
    loss = collect_recall_loss(model)
    if loss is None:
        raise RuntimeError("no attention-recall loss was recorded: the model's Focus objective is not attention_recall")
    return loss


def pretrained_kl(model: nn.Module, batch: torch.Tensor, logits: torch.Tensor,
                  weights: torch.Tensor | None = None) -> torch.Tensor:
    """KL(pretrained || model) of the next-token distributions, the mean per predicted token (weighted by `weights`
    (B, L) where given, as `next_token_loss` weighs: column t weighs predicting token t). The pretrained model is
    the same model with Focus switched off (`focus_disabled`), run without gradients on the rows that carry weight.
    A batch with no weight adds 0."""
    rows = slice(None) if weights is None else weights[:, 1:].sum(dim=1) > 0
    if weights is not None and not bool(rows.any()):
        return logits.sum() * 0.0  # no row of this batch learns from the teacher; keeps the graph for backward
    with torch.no_grad(), focus_disabled(model):
        teacher = model(input_ids=batch[rows], use_cache=False).logits
    log_student = F.log_softmax(logits[rows, :-1].float(), dim=-1)  # (b, L - 1, V)
    log_teacher = F.log_softmax(teacher[:, :-1].float(), dim=-1)
    per_token = F.kl_div(log_student, log_teacher, log_target=True, reduction="none").sum(dim=-1)  # (b, L - 1)
    if weights is None:
        return per_token.mean()
    token_weights = weights[rows, 1:].to(per_token.device, per_token.dtype)
    return (per_token * token_weights).sum() / token_weights.sum()
