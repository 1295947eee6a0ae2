import multiprocessing
import os
import subprocess
import sys
import time

import pytest
import torch

from focus import FocusConfig, apply_focus, models
from focus.files import write_folder_atomically
from focus.models import SPREAD, input_device, load_gguf, load_model, packaged_smollm2_folder, tiny_config, tiny_model
from focus.sources import PACKAGED_SMOLLM2, TINY_FAMILIES, packaged_smollm2_gguf

PAD = 0


pytestmark = pytest.mark.usefixtures("one_thread")


# --- tiny models --------------------------------------------------------------------------------------------------


def test_unknown_family_error_lists_known_families():
    with pytest.raises(ValueError, match="'gpt3'.*gpt2, llama, mistral, qwen2, gemma2, gemma3"):
        tiny_config("gpt3")


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_config_keeps_family_quirks(family):
    model = tiny_model(family)
    config = model.config
    assert not model.training
    assert config.vocab_size == 512 and config.pad_token_id == PAD
    assert model.generation_config.pad_token_id == PAD
    if family == "gpt2":
        assert (config.n_embd, config.n_head, config.n_positions) == (64, 4, 2048)
        return
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    attention = model.model.layers[0].self_attn
    assert attention.k_proj.out_features == 2 * 16  # grouped-query: 2 key/value heads for 4 query heads
    # sdpa where the class implements it (Gemma 2 does from some transformers versions on), else eager
    assert config._attn_implementation == ("sdpa" if getattr(type(model), "_supports_sdpa", False) else "eager")
    if family == "qwen2":
        assert attention.q_proj.bias is not None and attention.k_proj.bias is not None
    if family == "mistral":
        assert config.sliding_window == 16
    if family in ("gemma2", "gemma3"):
        assert set(config.layer_types) == {"sliding_attention", "full_attention"}
        assert config.sliding_window == 8
    if family == "gemma2":
        assert config.attn_logit_softcapping and config.final_logit_softcapping
    if family == "gemma3":
        assert type(model).__name__ == "Gemma3ForCausalLM"


def test_tiny_model_is_deterministic_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = tiny_model("llama", seed=3), tiny_model("llama", seed=3), tiny_model("llama", seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_tiny_model_dtype():
    assert tiny_model("qwen2", dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_forward_padded_batch_and_generate(family):
    model = tiny_model(family)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 512, (2, 40), generator=generator)  # 40 > every sliding window
    short = ids[1, :30]

    # Right padding: causal attention means real positions must not see the pads.
    padded = ids.clone()
    padded[1, 30:] = PAD
    mask = torch.ones_like(padded)
    mask[1, 30:] = 0
    with torch.no_grad():
        batch_logits = model(input_ids=padded, attention_mask=mask).logits  # (2, 40, V)
        alone = model(input_ids=short[None]).logits  # (1, 30, V)
    assert batch_logits.shape == (2, 40, 512)
    torch.testing.assert_close(batch_logits[1, :30], alone[0], atol=1e-5, rtol=0)

    # Left padding for generation: the padded row must continue exactly like the unpadded prompt.
    left = torch.cat([torch.full((10,), PAD), short])[None]
    left_mask = torch.cat([torch.zeros(10, dtype=torch.long), torch.ones(30, dtype=torch.long)])[None]
    batch = torch.cat([ids[:1], left])
    batch_mask = torch.cat([torch.ones(1, 40, dtype=torch.long), left_mask])
    settings = dict(max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    together = model.generate(input_ids=batch, attention_mask=batch_mask, **settings)
    single = model.generate(input_ids=short[None], **settings)
    assert together.sequences.shape[0] == 2 and together.sequences.shape[1] > 40
    torch.testing.assert_close(together.logits[0][1], single.logits[0][0], atol=1e-5, rtol=0)
    steps = min(len(together.logits), len(single.logits))
    assert torch.equal(together.sequences[1, 40 : 40 + steps], single.sequences[0, 30 : 30 + steps])


def test_mistral_sliding_window_limits_what_the_last_token_sees():
    # 2 layers of window 16 reach at most 30 tokens back; llama (full attention) reaches everything.
    ids = torch.randint(3, 512, (1, 64), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, 0] = 3 if ids[0, 0] != 3 else 4
    with torch.no_grad():
        for family, should_change in (("mistral", False), ("llama", True)):
            model = tiny_model(family)
            delta = (model(changed).logits[0, -1] - model(ids).logits[0, -1]).abs().max().item()
            assert (delta > 1e-6) == should_change, (family, delta)


# --- load_model ---------------------------------------------------------------------------------------------------


def test_load_model_from_local_folder_sets_pad_token(tmp_path, tiny_tokenizer):
    # llama, not qwen2: transformers maps a qwen2 folder to Qwen2Tokenizer, which brings its own pad token.
    tiny_model("llama").save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    model, tokenizer = load_model(str(tmp_path), dtype=torch.bfloat16)
    assert tiny_tokenizer.pad_token is None  # the fixture stays as it was
    assert tokenizer.pad_token == tokenizer.eos_token == "</s>"
    assert not model.training and model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "sdpa"
    reference = tiny_model("llama", dtype=torch.bfloat16)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits)


def test_spread_load_goes_through_a_device_map_and_focus_follows_each_layers_device(tmp_path, tiny_tokenizer, monkeypatch):
    # On this CPU-only machine accelerate maps every layer to the CPU; on a multi-GPU job the same call spreads them.
    tiny_model("llama").save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    calls, load = [], models.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", lambda *a, **kw: calls.append(kw) or load(*a, **kw))
    model, _ = load_model(str(tmp_path), device=SPREAD)
    assert calls[0]["device_map"] == "auto" and input_device(model) == torch.device("cpu")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, tiny_model("llama")(ids).logits)

    # Centroids are made on the device of their own layer (here one layer stands on "meta" for a second GPU).
    model = tiny_model("llama")
    model.model.layers[1].self_attn.to("meta")
    apply_focus(model, FocusConfig(num_groups=2, window=2), init_centroids=False)
    devices = [layer.self_attn.focus_centroids.device.type for layer in model.model.layers]
    assert devices == ["cpu", "meta"] and model.model.layers[1].self_attn.focus_group_bias.device.type == "meta"


def test_load_model_takes_sdpa_where_the_class_has_it_and_eager_where_not(tmp_path, tiny_tokenizer):
    """Gemma 2 has no sdpa in some transformers versions (eager there), sdpa in others."""
    tiny_model("gemma2").save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    model, _ = load_model(str(tmp_path))
    expected = "sdpa" if getattr(type(model), "_supports_sdpa", False) else "eager"
    assert model.config._attn_implementation == expected


@pytest.mark.parametrize("source", ["./no-such-model", "/nonexistent/folder/model"])
def test_load_model_missing_folder_is_one_clear_line(source):
    with pytest.raises(FileNotFoundError, match="no-such-model|nonexistent") as error:
        load_model(source)
    assert "\n" not in str(error.value) and repr(source) in str(error.value)


def test_load_model_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_model(str(tmp_path))


def test_load_model_unreachable_hub_id_is_one_clear_line(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")

    monkeypatch.setattr(models.AutoConfig, "from_pretrained", offline)
    with pytest.raises(FileNotFoundError) as error:
        load_model("someorg/some-model")
    message = str(error.value)
    assert "\n" not in message and "'someorg/some-model'" in message and "hub id" in message
    assert "couldn't connect" in message


def test_write_folder_atomically_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "cache" / "model"

    def fail(folder):
        (folder / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        write_folder_atomically(target, fail)
    assert list((tmp_path / "cache").iterdir()) == []

    write_folder_atomically(target, lambda folder: (folder / "a.txt").write_text("1"))
    write_folder_atomically(target, lambda folder: (folder / "b.txt").write_text("2"))  # replaces
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    with pytest.raises(RuntimeError):
        write_folder_atomically(target, fail)
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]  # a failed rewrite keeps the old copy
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["model"]


class _StandInModel:
    """The converted model, as far as the cache is concerned: half a second to save, and a count of conversions."""

    def __init__(self, count):
        self.count = count

    def save_pretrained(self, folder):
        time.sleep(0.5)
        (folder / "weights.bin").write_text("complete")
        with open(self.count, "a") as count:
            count.write("converted\n")


class _StandInTokenizer:
    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")


def _convert_then_read(cache, count):
    """A job on a cold cache: convert (or wait for whoever does), then read the folder a second later."""
    models.load_gguf = lambda gguf: (_StandInModel(count), _StandInTokenizer())
    models._dequantized_copy = lambda model: model
    folder = models.packaged_smollm2_folder(cache)
    time.sleep(1.0)  # a second converter, had there been one, would have moved this folder aside by now
    assert (folder / "weights.bin").read_text() == "complete"


def test_processes_finding_the_cache_cold_at_once_convert_it_once(tmp_path):
    fork = multiprocessing.get_context("fork")  # the stand-ins are set in each child, never in this process
    for round in range(5):
        cache, count = tmp_path / f"cache{round}", tmp_path / f"conversions{round}"
        processes = [fork.Process(target=_convert_then_read, args=(cache, count)) for _ in range(6)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=60)
        assert [process.exitcode for process in processes] == [0] * 6
        assert count.read_text() == "converted\n"  # one writer; the five others waited for it and read its folder


@pytest.mark.e2e  # three processes loading SmolLM2, one converting it (about a minute); the lock is tested above
@pytest.mark.slow
def test_jobs_starting_together_on_an_empty_cache_all_load_the_packaged_model(tmp_path):
    """The pipeline's first jobs on a fresh machine: several processes load SmolLM2 on an empty cache at once."""
    load = "from focus.models import load_model, load_tokenizer; load_tokenizer('smollm2-135m-instruct'); " \
           "load_model('smollm2-135m-instruct')"
    environ = {**os.environ, "FOCUS_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    processes = [subprocess.Popen([sys.executable, "-c", load], env=environ, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
    errors = [process.communicate(timeout=600)[1] for process in processes]
    assert [process.returncode for process in processes] == [0] * 3, errors
    assert sum("de-quantizing GGUF tensors" in error for error in errors) == 1


# --- the packaged SmolLM2 -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_packaged_smollm2_architecture(smollm2):
    model, tokenizer = smollm2
    config = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    assert (config.hidden_size, config.head_dim) == (576, 64)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied
    assert not model.training and model.config._attn_implementation == "sdpa"
    # The GGUF's special tokens, whichever transformers converted it (before 5.23 its reader got eos wrong).
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert len(tokenizer) == 49152
    assert tokenizer.chat_template


@pytest.mark.slow
def test_packaged_smollm2_cache_matches_gguf(smollm2):
    model, tokenizer = smollm2
    folder = packaged_smollm2_folder()
    assert (folder / "model.safetensors").is_file() and (folder / "focus_source.json").is_file()

    start = time.perf_counter()
    load_model(PACKAGED_SMOLLM2)
    assert time.perf_counter() - start < 10  # the point of the cache: the GGUF path takes 15-20 s

    gguf_model, gguf_tokenizer = load_gguf(packaged_smollm2_gguf())
    text = "The capital of France is Paris. The capital of Germany is"
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert torch.equal(ids, gguf_tokenizer(text, return_tensors="pt").input_ids)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, gguf_model(ids).logits)
