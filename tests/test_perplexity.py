import math

import pytest
import torch
import torch.nn.functional as F

from focus.eval.paired import paired_ratio
from focus.eval.perplexity import perplexity, sliding_windows, token_nll
from focus.models import tiny_model

COMBOS = [(8, 8), (8, 3), (8, 1), (16, 5), (7, 7), (13, 4), (64, 64), (64, 7)]  # (context_length, stride)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 512, (length,), generator=torch.Generator().manual_seed(seed))


def _nll_given(model, context: torch.Tensor, target: torch.Tensor) -> float:
    """-log p(target | context) from one forward pass over exactly `context`."""
    with torch.no_grad():
        logits = model(input_ids=context[None]).logits[0, -1].float()  # (V,)
    return -torch.log_softmax(logits, dim=-1)[target].item()


@pytest.mark.parametrize("num_tokens", [2, 3, 49, 50, 100])
@pytest.mark.parametrize("context_length, stride", COMBOS)
def test_every_position_is_scored_exactly_once(num_tokens, context_length, stride):
    windows = sliding_windows(num_tokens, context_length, stride)
    scored = []
    for begin, end, count in windows:
        assert 1 <= count <= end - begin <= context_length
        positions = list(range(end - count + 1, end + 1))
        assert positions[0] >= begin + 1  # each scored token has at least one token of context in its window
        assert end - begin == context_length or end == num_tokens - 1  # only the last window may be short
        scored += positions
    assert scored == list(range(1, num_tokens))
    starts = [begin for begin, _, _ in windows]
    assert starts == list(range(0, stride * len(windows), stride))


@pytest.mark.parametrize("context_length, stride", COMBOS)
def test_tokens_is_t_minus_one(llama, context_length, stride):
    ids = _ids(50)  # 49 predictions: not a multiple of most strides above
    result = perplexity(llama, ids, context_length, stride, batch_size=3, progress=False)
    assert result["tokens"] == 49
    assert math.isfinite(result["nll"]) and result["ppl"] == pytest.approx(math.exp(result["nll"]))


def test_stride_equal_to_context_is_independent_chunks(llama):
    ids, context = _ids(50), 8
    # Independently: each non-overlapping input chunk ids[kC:(k+1)C] predicts the C tokens after its start.
    losses = []
    with torch.no_grad():
        for start in range(0, 49, context):
            chunk = ids[start : min(start + context, 49)]
            logits = llama(input_ids=chunk[None]).logits[0].float()  # (L, V)
            losses.append(F.cross_entropy(logits, ids[start + 1 : start + 1 + chunk.numel()], reduction="none"))
    expected = torch.cat(losses)
    assert expected.numel() == 49
    per_token = token_nll(llama, ids, context, context, progress=False)
    torch.testing.assert_close(per_token, expected, atol=1e-5, rtol=0)
    result = perplexity(llama, ids, context, context, progress=False)
    assert result["nll"] == pytest.approx(expected.double().mean().item(), abs=1e-6)
    chunks = expected.double().split(context)  # windows of 8 scored tokens, the last of 1
    assert result["window_tokens"] == [8] * 6 + [1]
    assert result["window_nll"] == pytest.approx([chunk.mean().item() for chunk in chunks], abs=1e-6)


def test_paired_ratio_is_the_perplexity_ratio_with_an_interval_from_the_window_differences():
    base = [3.0, 3.5, 2.5, 4.0]
    shifted = [nll + 0.1 for nll in base]  # every window 0.1 nats worse: no spread, an interval of zero width
    assert paired_ratio(shifted, base) == pytest.approx((math.expm1(0.1),) * 3)
    noisy = [nll + d for nll, d in zip(base, [0.3, -0.1, 0.2, 0.0])]
    ratio, low, high = paired_ratio(noisy, base)
    half = 1.96 * torch.tensor([0.3, -0.1, 0.2, 0.0]).double().std().item() / 2  # sqrt(4 windows)
    assert ratio == pytest.approx(math.expm1(0.1)) and low < 0 < high
    assert (low, high) == pytest.approx((math.expm1(0.1 - half), math.expm1(0.1 + half)))
    with pytest.raises(ValueError, match="at least 2 windows"):
        paired_ratio([3.0], [2.0])


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2"])
def test_full_context_equals_one_pass(family):
    model = tiny_model(family)
    ids = _ids(40, seed=1)
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0, :-1].float()  # (T - 1, V)
    expected = F.cross_entropy(logits, ids[1:], reduction="none")
    for context_length in (39, 40, 100):
        per_token = token_nll(model, ids, context_length, 5, progress=False)
        torch.testing.assert_close(per_token, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llama", "mistral"])
@pytest.mark.parametrize("context_length, stride", [(8, 3), (10, 10), (12, 5)])
def test_each_token_sees_exactly_its_window(family, context_length, stride):
    """Brute force: position p is scored by the first window reaching it, which starts at b = k * stride."""
    model = tiny_model(family)
    ids = _ids(30, seed=2)
    per_token = token_nll(model, ids, context_length, stride, batch_size=2, progress=False)
    for p in range(1, 30):
        begin = stride * max(0, math.ceil((p - context_length) / stride))
        assert per_token[p - 1].item() == pytest.approx(_nll_given(model, ids[begin:p], ids[p]), abs=1e-5), p


def test_batch_size_does_not_change_the_result(llama):
    ids = _ids(80, seed=3)
    one = token_nll(llama, ids, 16, 6, batch_size=1, progress=False)
    many = token_nll(llama, ids, 16, 6, batch_size=5, progress=False)
    torch.testing.assert_close(one, many, atol=1e-5, rtol=0)


def test_attention_backend_does_not_matter():
    model = tiny_model("qwen2")
    ids = _ids(40, seed=4)
    sdpa = token_nll(model, ids, 12, 5, progress=True)  # also exercises the tqdm bar
    model.set_attn_implementation("eager")
    torch.testing.assert_close(token_nll(model, ids, 12, 5, progress=False), sdpa, atol=1e-5, rtol=0)


def test_training_mode_is_restored_and_ignored():
    model = tiny_model("gpt2")  # gpt2 has dropout: in training mode two passes would differ
    expected = perplexity(model, _ids(30), 8, 4, progress=False)["nll"]
    model.train()
    assert perplexity(model, _ids(30), 8, 4, progress=False)["nll"] == pytest.approx(expected, abs=1e-6)
    assert model.training


def test_bad_arguments(llama):
    with pytest.raises(ValueError, match="stride must be in \\[1, context_length=8\\], got 9"):
        perplexity(llama, _ids(20), 8, 9)
    with pytest.raises(ValueError, match="got 0"):
        perplexity(llama, _ids(20), 8, 0)
    with pytest.raises(ValueError, match="at least 2 tokens, got 1"):
        perplexity(llama, _ids(1), 8, 4)
    with pytest.raises(ValueError, match="1D"):
        perplexity(llama, _ids(20)[None], 8, 4)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        perplexity(llama, _ids(20), 8, 4, batch_size=0)
    limit = llama.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"a context of {limit + 1} tokens exceeds llama's {limit} positions"):
        perplexity(llama, _ids(20), limit + 1, 4)


@pytest.mark.slow
def test_smollm2_wikitext_perplexity_is_plausible(smollm2):
    from focus.data import find_mirror, load_corpus, tokenize_corpus

    if find_mirror() is None:
        pytest.skip("no offline data mirror")
    model, tokenizer = smollm2
    ids = tokenize_corpus(load_corpus("wikitext2", "test"), tokenizer)[:512]
    result = perplexity(model, ids, context_length=256, stride=128, batch_size=2, progress=False)
    assert result["tokens"] == 511
    assert 10 < result["ppl"] < 50, result  # measured 26.8
