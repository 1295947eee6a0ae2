"""Adapters by hub repo id (offline, from a folder laid out as huggingface_hub's cache), the one-call loader, the
model card and push_to_hub (the hub's HTTP API answered in-process)."""

import base64
import json
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

from focus import FocusConfig, apply_focus, load_focus, save_focus
from focus.adapter import CARD_NAME, CONFIG_NAME, WEIGHTS_NAME
from focus.hub import load_focus_model, push_to_hub, write_model_card
from focus.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = "tiny:llama"
CONFIG = FocusConfig(num_groups=4, window=3, top_k=1, mode="hard")


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty huggingface_hub cache, with the hub unreachable (HF_HUB_OFFLINE=1)."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def trained_adapter(folder: Path, seed: int) -> tuple[torch.nn.Module, Path]:
    """A tiny model with Focus and random centroids (as if trained), saved to `folder`."""
    model, _ = load_model(BASE)
    apply_focus(model, CONFIG, init_centroids=False)
    torch.manual_seed(seed)
    for name, parameter in model.named_parameters():
        if "focus_centroids" in name:
            parameter.data.normal_()
    return model, save_focus(model, folder, base_model=BASE)


def cache_as_hub(cache: Path, repo_id: str, folder: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> None:
    """Put `folder`'s adapter into the cache as huggingface_hub lays out a download of `repo_id` at `commit`."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)


def logits(model) -> torch.Tensor:
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_an_adapter_loads_by_repo_id_and_revision_from_the_hub_cache_offline(tmp_path, hub_cache):
    first, first_dir = trained_adapter(tmp_path / "v1", seed=1)
    second, second_dir = trained_adapter(tmp_path / "v2", seed=2)
    cache_as_hub(hub_cache, "someone/focus-tiny", first_dir, "a" * 40, refs=("v1",))
    cache_as_hub(hub_cache, "someone/focus-tiny", second_dir, "b" * 40, refs=("main",))
    assert not torch.equal(logits(first), logits(second))  # the two revisions are told apart by their outputs

    for revision, expected in ((None, second), ("v1", first), ("a" * 40, first)):
        model, _ = load_model(BASE)
        load_focus(model, "someone/focus-tiny", revision=revision)
        assert torch.equal(logits(model), logits(expected)), revision

    loaded, tokenizer = load_focus_model("someone/focus-tiny", revision="v1")  # base model built from the record
    assert torch.equal(logits(loaded), logits(first)) and tokenizer is not None


def test_a_missing_repo_is_one_line_and_a_folder_takes_no_revision(tmp_path, hub_cache):
    model, _ = load_model(BASE)
    with pytest.raises(FileNotFoundError, match=r"^no Focus adapter someone/absent: no such folder, nor on the hub"):
        load_focus(model, "someone/absent")
    _, folder = trained_adapter(tmp_path / "adapter", seed=3)
    with pytest.raises(ValueError, match="is a local folder"):
        load_focus(model, folder, revision="main")


def test_the_model_card_names_the_base_model_config_training_and_perplexity(tmp_path):
    _, folder = trained_adapter(tmp_path / "models--someone--focus-tiny" / "snapshots" / ("c" * 40), seed=4)
    summary = {"final": {"step": 300, "train/tokens": 307200, "eval/ppl": 34.61}, "train": {"lr": 0.01},
               "reference_eval": {"pretrained": 35.43}}
    card = write_model_card(folder, training=summary, evaluation={"books test, hard": 35.2}).read_text()
    assert card.startswith("---\nlibrary_name: focus-attention\n")  # a tiny: model is no hub id: no base_model key
    for expected in ("# Focus adapter for tiny:llama", "load_focus_model('someone/focus-tiny')", "| `num_groups` | 4 |",
                     "| training tokens | 307200 |", "| validation perplexity, pretrained | 35.43 |",
                     "| books test, hard | 35.20 |"):
        assert expected in card, expected


@pytest.fixture
def fake_hub():
    """The hub's HTTP API answered in-process (httpx.MockTransport under huggingface_hub's client): the requests
    made, and each committed file's bytes."""
    import httpx
    from huggingface_hub.utils._http import default_client_factory, set_client_factory

    requests, committed = [], {}

    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        requests.append((request.method, path))
        if path == "/api/repos/create":
            return httpx.Response(200, json={"url": "https://huggingface.co/someone/focus-tiny"})
        if path == "/api/validate-yaml":  # the model card's front matter
            return httpx.Response(200, json={"errors": [], "warnings": []})
        if "/preupload/" in path:  # small files: sent inside the commit itself
            files = json.loads(request.content)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
            return httpx.Response(200, json={"files": modes})
        if "/commit/" in path:
            for line in request.content.decode().splitlines():
                entry = json.loads(line)
                if entry["key"] == "file":
                    committed[entry["value"]["path"]] = base64.b64decode(entry["value"]["content"])
            commit = "https://huggingface.co/someone/focus-tiny/commit/" + "d" * 40
            return httpx.Response(200, json={"commitUrl": commit, "commitOid": "d" * 40})
        return httpx.Response(404, json={"error": f"not part of this fake: {request.method} {path}"})

    set_client_factory(lambda: httpx.Client(transport=httpx.MockTransport(answer)))
    try:
        yield requests, committed
    finally:
        set_client_factory(default_client_factory)


def test_push_to_hub_creates_the_repo_and_commits_the_adapter_and_its_card(tmp_path, fake_hub):
    requests, committed = fake_hub
    model, folder = trained_adapter(tmp_path / "saved", seed=5)
    url = push_to_hub(model, "someone/focus-tiny", base_model=BASE, token="hf_not_a_real_token")
    assert url.endswith("d" * 40)
    assert ("POST", "/api/repos/create") in requests
    assert ("POST", "/api/models/someone/focus-tiny/commit/main") in requests
    assert sorted(committed) == sorted([CARD_NAME, CONFIG_NAME, WEIGHTS_NAME])
    assert committed[WEIGHTS_NAME] == (folder / WEIGHTS_NAME).read_bytes()  # the same centroids as save_focus wrote
    assert committed[CARD_NAME].decode().startswith("---\nlibrary_name: focus-attention")
