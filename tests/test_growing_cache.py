"""GrowingCache: a DynamicCache appending in place, the same generation as transformers' own."""

import pytest
import torch
from test_training import tiny_llama
from transformers import DynamicCache

from focus.attention.cache.growing_cache import GrowingCache, GrowingLayer

pytestmark = pytest.mark.usefixtures("one_thread")


def greedy(model, ids, cache, **kwargs):
    return model.generate(input_ids=ids, past_key_values=cache, do_sample=False, max_new_tokens=40,
                          min_new_tokens=40, output_logits=True, return_dict_in_generate=True, **kwargs)


@pytest.mark.parametrize("with_config", [True, False])
def test_generation_through_a_growing_cache_equals_a_dynamic_cache(with_config):
    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = GrowingCache(config=model.config) if with_config else GrowingCache()
    buffers = set()
    original = GrowingLayer.update

    def update(layer, *args, **kwargs):
        out = original(layer, *args, **kwargs)
        buffers.add(layer.key_buffer.data_ptr())
        assert layer.keys.data_ptr() == layer.key_buffer.data_ptr()  # the cache is the buffer's prefix, in place
        return out

    with torch.no_grad():
        GrowingLayer.update = update
        try:
            grown = greedy(model, ids, cache)
        finally:
            GrowingLayer.update = original
        expected = greedy(model, ids, DynamicCache(config=model.config))
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    assert torch.equal(grown.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(grown.logits), torch.stack(expected.logits), rtol=0, atol=1e-6)
    # 9 + 40 positions fit the first buffer of each layer (64 positions): no step copied the cache
    assert len(buffers) == 2


def test_a_growing_cache_follows_crop_beam_search_and_batch_selection():
    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        beams = greedy(model, ids, GrowingCache(config=model.config), num_beams=3)
        expected = greedy(model, ids, DynamicCache(config=model.config), num_beams=3)
        assert torch.equal(beams.sequences, expected.sequences)

        long_ids = torch.randint(0, 128, (2, 60), generator=torch.Generator().manual_seed(2))
        cache = GrowingCache(config=model.config)
        model(input_ids=long_ids[:, :50], past_key_values=cache)
        cache.crop(-45)  # keep the first 5 positions, write over the rest
        cache.batch_select_indices(torch.tensor([1]))  # replaces the layers' tensors: moved back into a buffer
        logits = [model(input_ids=long_ids[1:, t : t + 1], past_key_values=cache).logits for t in range(5, 60)]
        reference = model(input_ids=long_ids[1:]).logits[:, 5:]
    torch.testing.assert_close(torch.cat(logits, dim=1), reference, rtol=0, atol=1e-5)
    assert cache.get_seq_length() == 60 and cache.layers[0].key_buffer.shape[-2] >= 64 + 8  # grown past one buffer
