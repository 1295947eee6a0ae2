"""Training rows mixed from a domain, a broad corpus and retrieval rows (`TrainingJob.training_rows`), and the dense
teacher's weights on the broad rows."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from focus.pipeline.jobs import TrainingJob
from focus.train.config import TrainConfig

SEQ = 16


def tokens_file(path, train_rows: int, first_id: int):
    """A token file whose train split is `train_rows` rows of SEQ ids, row r made of the id first_id + r."""
    ids = (first_id + torch.arange(train_rows)).repeat_interleave(SEQ).to(torch.int32)
    save_file({"train": ids, "validation": ids[: 2 * SEQ].clone()}, str(path))
    return path


def job(tmp_path, **changes) -> TrainingJob:
    settings = dict(calibration_rows=0, retrieval_share=0.0, broad_tokens=tokens_file(tmp_path / "broad", 100, 1000),
                    progress=False)
    return TrainingJob(tokens_file(tmp_path / "domain", 10, 0), SEQ, TrainConfig(steps=1, batch_size=2),
                       tmp_path / "metrics.jsonl", tmp_path / "summary.json", **{**settings, **changes})


def test_broad_rows_are_their_share_spread_over_the_corpus_and_learn_from_the_teacher(tmp_path):
    mixed = job(tmp_path, broad_share=0.5)
    _, rows, _ = mixed.rows()
    ids, token_weights, term_weights = mixed.training_rows(rows, tokenizer=None, window=None, teacher=True)
    assert ids.shape == (20, SEQ)
    assert torch.equal(ids[:10], rows)
    broad = ids[10:, 0]
    assert broad[0] == 1000 and broad[-1] == 1099 and bool((broad.diff() > 0).all())  # first to last, in order
    assert torch.equal(token_weights[:10], torch.ones(10, SEQ)) and not token_weights[10:].any()  # teacher alone
    assert not term_weights["distill"][:10].any() and bool((term_weights["distill"][10:] == 1).all())
    ids_plain, weights_plain, terms_plain = mixed.training_rows(rows, tokenizer=None, window=None, teacher=False)
    assert torch.equal(ids_plain, ids) and weights_plain is None and terms_plain is None  # their next tokens


def test_shares_that_leave_no_domain_rows_or_lack_a_corpus_are_refused(tmp_path):
    with pytest.raises(ValueError, match="leave no room for the domain's rows"):
        job(tmp_path, broad_share=0.8, retrieval_share=0.25)
    with pytest.raises(ValueError, match="needs the broad corpus's tokens"):
        job(tmp_path, broad_share=0.5, broad_tokens=None)
    too_many = job(tmp_path, broad_share=0.95)
    _, rows, _ = too_many.rows()
    with pytest.raises(ValueError, match="asks for 190 rows of 16 tokens, its train split has 100"):
        too_many.training_rows(rows, tokenizer=None, window=None)
