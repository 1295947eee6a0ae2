"""Adapters are checked, not trusted: a damaged or foreign adapter is one error naming the folder and the file, and
the model it was loaded onto is left as it was."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from focus import FocusConfig, apply_focus, has_focus, load_focus, save_focus
from focus.adapter import CONFIG_NAME, WEIGHTS_NAME, AdapterError
from focus.models import tiny_model
from focus.retrofit import focus_config, set_focus_mode


@pytest.fixture
def adapter(tmp_path):
    """A saved adapter of a tiny Llama (2 layers, 2 key/value heads, 4 groups, head size 16)."""
    model = tiny_model("llama", seed=0)
    apply_focus(model, FocusConfig(num_groups=4, window=3), init_centroids=False)
    return save_focus(model, tmp_path / "adapter")


def rewrite_tensors(folder, change):
    tensors = load_file(str(folder / WEIGHTS_NAME))
    change(tensors)
    save_file(tensors, str(folder / WEIGHTS_NAME))


def fails_cleanly(folder, match, model_family="llama", **kwargs):
    """load_focus refuses the adapter with one line naming its file, and applies nothing to the model."""
    model = tiny_model(model_family, seed=0)
    with pytest.raises(AdapterError, match=match) as info:
        load_focus(model, folder, **kwargs)
    assert "\n" not in str(info.value) and str(folder) in str(info.value)
    assert not has_focus(model)
    return str(info.value)


def test_shared_centroids_where_the_config_says_per_head_are_refused(adapter):
    """(1, G, D) would broadcast into every head: the model would route with centroids it was never trained with."""
    rewrite_tensors(adapter, lambda t: t.update({name: t[name][:1] for name in t if name.endswith("centroids")}))
    message = fails_cleanly(adapter, r"layers\.0\.centroids has shape \(1, 4, 16\)")
    assert WEIGHTS_NAME in message and "(2, 4, 16)" in message


def test_another_group_count_in_the_tensors_is_refused(adapter):
    rewrite_tensors(adapter, lambda t: t.update({name: torch.cat([t[name], t[name]], dim=1) for name in t}))
    fails_cleanly(adapter, r"has shape \(2, 8, 16\)")


def test_missing_extra_integer_and_non_finite_tensors_are_refused(adapter, tmp_path):
    original = load_file(str(adapter / WEIGHTS_NAME))
    cases = {
        "lacks 'layers.1.group_bias'": lambda t: t.pop("layers.1.group_bias"),
        "unexpected tensor 'layers.2.centroids'": lambda t: t.update({"layers.2.centroids": t["layers.0.centroids"].clone()}),
        "is torch.int64, not a floating-point": lambda t: t.update({"layers.0.group_bias": torch.zeros(2, 4, dtype=torch.long)}),
        "holds NaN or infinite values": lambda t: t["layers.1.centroids"].__setitem__((0, 0, 0), float("nan")),
    }
    for expected, change in cases.items():
        save_file(dict(original), str(adapter / WEIGHTS_NAME))
        rewrite_tensors(adapter, change)
        fails_cleanly(adapter, expected)


def test_a_truncated_config_or_tensor_file_names_the_file(adapter):
    config = (adapter / CONFIG_NAME).read_text()
    (adapter / CONFIG_NAME).write_text(config[: len(config) // 2])
    assert CONFIG_NAME in fails_cleanly(adapter, "is not valid JSON")
    (adapter / CONFIG_NAME).write_text(config)
    weights = (adapter / WEIGHTS_NAME).read_bytes()
    (adapter / WEIGHTS_NAME).write_bytes(weights[: len(weights) // 2])
    fails_cleanly(adapter, "cannot be read")
    (adapter / CONFIG_NAME).write_text(json.dumps({**json.loads(config), "focus_config": {"windw": 3}}))
    fails_cleanly(adapter, "unknown FocusConfig key 'windw'")


def test_another_model_type_warns_and_strict_refuses(adapter):
    """A tiny Qwen2 has the tiny Llama's shapes: the adapter fits, but was trained for another model."""
    qwen2 = tiny_model("qwen2", seed=0)
    with pytest.warns(UserWarning, match="saved from model type 'llama', this model is 'qwen2'"):
        load_focus(qwen2, adapter)
    assert has_focus(qwen2)
    fails_cleanly(adapter, "model type 'llama', this model is 'qwen2'", model_family="qwen2", strict=True)


def test_another_hub_model_warns_but_local_names_are_not_compared(adapter):
    record = json.loads((adapter / CONFIG_NAME).read_text())
    (adapter / CONFIG_NAME).write_text(json.dumps({**record, "base_model": "someone/llama-a"}))
    model = tiny_model("llama", seed=0)
    model.config._name_or_path = "someone/llama-b"
    with pytest.warns(UserWarning, match="base model 'someone/llama-a', this model is 'someone/llama-b'"):
        load_focus(model, adapter)
    local = tiny_model("llama", seed=0)
    local.config._name_or_path = "/some/folder/llama"  # a folder here says nothing about the hub id saved
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_focus(local, adapter)


@pytest.mark.parametrize("objective, loads_as", [("straight_through", "hard"), ("attention_recall", "hard"),
                                                 ("language_model", "soft")])
def test_an_adapter_loads_in_the_mode_it_was_trained_for(tmp_path, objective, loads_as):
    """Centroids trained for the hard pattern are saved from a model left in soft mode (training's gate): loading
    them must not hand a Python user the mode they were not trained for."""
    trained = tiny_model("llama", seed=0)
    apply_focus(trained, FocusConfig(num_groups=4, window=3, objective=objective, mode="soft"), init_centroids=False)
    folder = save_focus(trained, tmp_path / "adapter")
    assert json.loads((folder / CONFIG_NAME).read_text())["focus_config"]["mode"] == loads_as
    assert focus_config(load_focus(tiny_model("llama", seed=0), folder)).mode == loads_as

    record = json.loads((folder / CONFIG_NAME).read_text())  # as adapters saved before the record said so
    record["focus_config"]["mode"] = "soft"
    (folder / CONFIG_NAME).write_text(json.dumps(record))
    model = load_focus(tiny_model("llama", seed=0), folder)
    assert focus_config(model).mode == loads_as
    set_focus_mode(model, "soft")  # the caller's choice stands
    assert focus_config(model).mode == "soft"


@pytest.mark.parametrize("saver", ["save_pretrained", "push_to_hub"])
def test_a_focus_model_refuses_the_plain_save_and_upload_naming_the_calls_to_use(tmp_path, saver, monkeypatch):
    """transformers' own save would write the centroids into the base weights, which from_pretrained drops as
    unexpected keys, handing back the plain model: refused in one line (before any file or hub request), and the
    class's own again after remove_focus."""
    from focus.retrofit import FocusSaveError, remove_focus

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = apply_focus(tiny_model("llama"), FocusConfig(num_groups=4, window=8), calibration_ids=torch.randint(0, 100, (2, 32)))
    with pytest.raises(FocusSaveError, match="load_focus_model") as refused:
        getattr(model, saver)(str(tmp_path / "saved"))
    assert "\n" not in str(refused.value) and not (tmp_path / "saved").exists()
    remove_focus(model)
    model.save_pretrained(tmp_path / "plain")  # the plain model saves as it always did
    assert (tmp_path / "plain" / "config.json").is_file()


def test_smollm2_with_focus_refuses_save_pretrained_and_saves_again_without_it(smollm2, tmp_path):
    from focus.retrofit import FocusSaveError, remove_focus

    model, tokenizer = smollm2
    apply_focus(model, FocusConfig(num_groups=4, window=64), calibration_ids=tokenizer("Call me Ishmael.",
                                                                                      return_tensors="pt").input_ids)
    try:
        with pytest.raises(FocusSaveError, match="save_focus"):
            model.save_pretrained(tmp_path / "saved")
        save_focus(model, tmp_path / "adapter")
    finally:
        remove_focus(model)
    assert "save_pretrained" not in model.__dict__ and not (tmp_path / "saved").exists()
    assert (tmp_path / "adapter" / CONFIG_NAME).is_file()
