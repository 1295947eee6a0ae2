"""The plan (`focus.attention.dispatch.planning`): the one decision of which router and kernel compute a call, what
executes, and the table docs/attention_plan.md writes of it."""

from pathlib import Path

import pytest
import torch
from test_training import tiny_llama

import focus.attention.dispatch.kernel_runs
import focus.attention.function
import focus.attention.kernels.decomposed
from focus import FocusConfig, apply_focus
from focus.attention import CallFacts, explain, plan
from focus.attention.cache.decoding import FocusCache
from focus.attention.dispatch.fast_path import fast_path
from focus.attention.dispatch.kernel_table import KERNEL_TABLE
from focus.attention.dispatch.planning import KERNELS, SCENARIOS, plan_table

DOCS = Path(__file__).parents[1] / "docs" / "attention_plan.md"


def test_the_docs_table_is_the_plans_output():
    assert DOCS.read_text() == plan_table(), "run: python -m focus.attention > docs/attention_plan.md"
    assert len(SCENARIOS) == len({situation for situation, *_ in SCENARIOS})
    kernels_shown = {line.split("`")[1] for line in DOCS.read_text().splitlines() if line.startswith("| ") and "`" in line}
    assert kernels_shown == set(KERNELS)  # every kernel has a row where it runs


def test_the_docs_table_has_every_kernel_take_a_call_and_refuse_one():
    """Each row of the kernel table computes some situation of docs/attention_plan.md, and each but the last resort
    (the dense masked kernel, which takes every call) is refused in one, its reason printed there."""
    base = FocusConfig(mode="hard", top_k=2, window=256, route_queries="query")
    plans = [plan(base.replace(**changes), CallFacts(**facts, fast_path=switch))
             for _, changes, facts, switch in SCENARIOS]
    chosen = {chosen.kernel for chosen in plans}
    refused = {name for chosen in plans for name, _ in chosen.declined}
    assert {row.name for row in KERNEL_TABLE} <= chosen
    assert {row.name for row in KERNEL_TABLE} - refused == {"dense_masked"}


def test_explain_reads_a_models_shapes_device_and_config():
    model = tiny_llama()
    with pytest.raises(ValueError, match="no Focus layer"):
        explain(model, keys=32)
    apply_focus(model, FocusConfig(num_groups=4, window=4, top_k=2, mode="hard", route_queries="kv_head",
                                   dense_below=16), calibration_ids=torch.randint(0, 128, (2, 32)))
    assert explain(model, keys=32, cache="native").kernel == "decomposed_native"
    assert explain(model, keys=32, queries=1, cache="native").kernel == "native_step"
    assert explain(model, keys=32, queries=1, cache="eager").kernel == "masked_step"
    assert explain(model, keys=12, queries=1, cache="native").attention == "unmodified"  # below dense_below
    prompt = explain(model, keys=32)
    assert (prompt.kernel, prompt.dense_rows) == ("decomposed_torch", 16)
    assert "its first 16 queries unmodified" in str(prompt)
    assert explain(model, keys=32, training=True).dense_rows == 0  # rows below dense_below still train


def test_a_pinned_flash_path_without_flash_attn_is_planned_as_asked():
    """The switch pins the backend whatever is installed (the kernel then fails in one line where flash-attn is
    missing); auto takes flash-attn only where it imports, on CUDA."""
    config = FocusConfig(mode="hard")
    with fast_path("flash"):
        assert plan(config, CallFacts(queries=640, keys=640, device="cuda", flash_attn=False)).kernel == (
            "decomposed_flash")
    assert plan(config, CallFacts(queries=640, keys=640, device="cuda", flash_attn=False)).kernel == "decomposed_torch"
    assert plan(config, CallFacts(queries=640, keys=640, device="cuda", flash_attn=True)).kernel == "decomposed_flash"
    assert plan(config, CallFacts(queries=640, keys=640, device="cpu", flash_attn=True)).kernel == "decomposed_torch"


@pytest.mark.parametrize("native", [True, False])
def test_what_runs_is_the_plan(native, monkeypatch):
    """generate() through a FocusCache: every call's plan is recorded, and the kernels that ran are counted; each plan's
    kernel ran exactly as often as it was planned, nothing else ran."""
    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding: the native prefill takes it
    apply_focus(model, FocusConfig(num_groups=4, window=4, top_k=2, mode="hard", route_queries="kv_head"),
                calibration_ids=ids[:, :32])
    planned, ran = [], []
    made = focus.attention.function.plan

    def recording(config, facts):
        chosen = made(config, facts)
        planned.append(chosen.kernel)
        return chosen

    def counting(module, name, kernel):
        original = getattr(module, name)

        def counted(*args, **kwargs):
            ran.append(kernel(args, kwargs) if callable(kernel) else kernel)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    monkeypatch.setattr(focus.attention.function, "plan", recording)
    counting(focus.attention.dispatch.kernel_runs, "native_decoding_step", "native_step")
    counting(focus.attention.dispatch.kernel_runs, "masked_decode_attention", "masked_step")
    counting(focus.attention.dispatch.kernel_runs, "sparse_decode_attention", "sparse_step")
    counting(focus.attention.dispatch.kernel_runs, "decomposed_hard_attention",
             lambda args, kwargs: "decomposed_" + (args[8] if len(args) > 8 else kwargs["backend"]))
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6, min_new_tokens=6,
                       past_key_values=FocusCache(model, native=native))
    layers = model.config.num_hidden_layers
    prompt, step = ("decomposed_native", "native_step") if native else ("decomposed_torch", "masked_step")
    assert planned == [prompt] * layers + [step] * 5 * layers
    assert ran == planned


def test_the_kernel_is_the_first_row_that_does_not_decline_and_every_refusal_is_kept(monkeypatch):
    """The plan asks `KERNEL_TABLE` in order: a decoding step is asked of the step rows first, a prompt never is; each
    row before the chosen one says why it declined; a row added to the table is asked like any other."""
    import focus.attention.dispatch.kernel_table as table

    config = FocusConfig(mode="hard", top_k=2, window=256, route_queries="key")
    prompt = plan(config, CallFacts(queries=4096, keys=4096, cache="native"))
    assert prompt.kernel == "decomposed_torch"
    assert prompt.declined == (("decomposed_native", "queries routed by their keys (route_queries='key')"),
                               ("decomposed_flash", "flash-attn runs on CUDA, the call on cpu"))
    assert "\n  not decomposed_native: queries routed by their keys" in str(prompt)
    step = plan(config.replace(num_groups=70), CallFacts(queries=1, keys=4096, cache="native"))
    assert step.kernel == "sparse_step" and [name for name, _ in step.declined] == ["native_step", "masked_step"]
    graded = plan(config, CallFacts(queries=4096, keys=4096, gradients=True))
    assert graded.kernel == "dense_masked" and {why for _, why in graded.declined} == {
        "a gradient flows through the attention"}

    def takes_long_prompts(config, facts):
        return None if facts.keys >= 2048 else "shorter than 2048 keys"

    ran = []

    def run(state, call):
        ran.append(call.query.shape[-2])
        return call.unmodified()

    row = table.Kernel("long_prompts", "a kernel for long prompts", takes_long_prompts, "a long prompt", run)
    monkeypatch.setattr(table, "KERNEL_TABLE", (*table.KERNEL_TABLE[:3], row, *table.KERNEL_TABLE[3:]))
    assert plan(config, CallFacts(queries=4096, keys=4096)).kernel == "long_prompts"
    short = plan(config, CallFacts(queries=1024, keys=1024))
    assert short.kernel == "decomposed_torch" and ("long_prompts", "shorter than 2048 keys") in short.declined
    model = tiny_llama()  # and what the plan chooses is what runs, with the call's state passed in
    apply_focus(model, config.replace(num_groups=4, window=4), calibration_ids=torch.randint(0, 128, (1, 32)))
    monkeypatch.setattr(table, "KERNEL_TABLE", (row, *table.KERNEL_TABLE))
    with torch.no_grad():
        model(torch.randint(0, 128, (1, 2048 + 8)))
    assert ran == [2056] * model.config.num_hidden_layers


def test_the_fast_path_switch_is_a_fact_of_the_call():
    """A call's facts may name the switch (as `explain` and the docs table do); otherwise they take the one in force
    when they are made, and every row reads that one."""
    config = FocusConfig(mode="hard")
    made_before = CallFacts(queries=640, keys=640)
    assert made_before.fast_path == "auto"
    assert plan(config, CallFacts(queries=640, keys=640, fast_path="dense")).kernel == "dense_masked"
    with fast_path("dense"):
        assert plan(config, CallFacts(queries=640, keys=640)).kernel == "dense_masked"
        assert plan(config, CallFacts(queries=640, keys=640, fast_path="auto")).kernel == "decomposed_torch"
        assert plan(config, made_before).kernel == "decomposed_torch"
    assert plan(config, CallFacts(queries=640, keys=640)).kernel == "decomposed_torch"


def test_matrix_units_are_a_row_the_plan_chooses_by_the_calls_dtype_and_the_cpu():
    """A bfloat16 prompt into a native FocusCache takes the matrix-unit row where the CPU has AMX, the vector one
    where it has not or `use_matrix_units(False)` says so; float32 is never asked about it."""
    from focus.attention.dispatch.facts import cpu_matrix_units, use_matrix_units

    config = FocusConfig(mode="hard", top_k=2, window=256, route_queries="kv_head")
    bf16 = dict(queries=4096, keys=4096, cache="native", dtype="bfloat16")
    assert plan(config, CallFacts(**bf16, matrix_units=True)).kernel == "decomposed_native_amx"
    without = plan(config, CallFacts(**bf16, matrix_units=False))
    assert without.kernel == "decomposed_native" and without.declined[0][0] == "decomposed_native_amx"
    assert plan(config, CallFacts(**bf16)).kernel == (
        "decomposed_native_amx" if cpu_matrix_units() else "decomposed_native")
    with use_matrix_units(False):
        assert plan(config, CallFacts(**bf16)).kernel == "decomposed_native"
    assert plan(config, CallFacts(queries=4096, keys=4096, cache="native")).declined == ()


def test_the_indexers_steps_decline_what_they_cannot_compute():
    """The indexer's native step takes a native cache's step on the CPU; the eager step takes the others; a cropped
    cache leaves the step to the prompt kernel (which scores the keys itself), dense heads or a soft-capping model to
    the dense masked kernel."""
    config = FocusConfig(mode="hard", selector="indexer", indexer_rank=8, route_queries="kv_head")
    step = dict(queries=1, keys=4096, native_kernels=True)
    assert plan(config, CallFacts(**step, cache="native")).kernel == "indexer_native_step"
    eager = plan(config, CallFacts(**step, cache="eager"))
    assert eager.kernel == "indexer_step" and eager.declined == (
        ("indexer_native_step", "the cache runs no native kernels (FocusCache(native=False))"),)
    cuda = plan(config, CallFacts(**step, cache="native", device="cuda"))
    assert cuda.kernel == "indexer_step"
    assert dict(cuda.declined)["indexer_native_step"] == "the native kernels run on the CPU, the call on cuda"
    for facts, reason, kernel in (
            (dict(index_current=False), "the key codes are behind the cache", "indexer_native_prompt"),
            (dict(softcap=True), "the model soft-caps its logits", "dense_masked")):
        chosen = plan(config, CallFacts(**step, cache="native", **facts))
        assert chosen.kernel == kernel and dict(chosen.declined)["indexer_native_step"] == reason
    heads = plan(config.replace(dense_heads=["l0h0"]), CallFacts(**step, cache="native"))
    assert dict(heads.declined)["indexer_step"] == "dense heads (FocusConfig.dense_heads)"


def test_the_indexers_prompts_decline_what_they_cannot_compute():
    """The native prompt takes the CPU's prompts where the native kernels build, in a native cache or none; the eager
    prompt takes the others; dense heads, a gradient or a soft-capping model leave it to the dense masked kernel."""
    config = FocusConfig(mode="hard", selector="indexer", indexer_rank=8, route_queries="kv_head")
    prompt = dict(queries=4096, keys=4096, native_kernels=True)
    assert plan(config, CallFacts(**prompt)).kernel == "indexer_native_prompt"
    assert plan(config, CallFacts(**prompt, cache="native")).kernel == "indexer_native_prompt"
    for facts, reason in ((dict(cache="eager"), "the cache runs no native kernels (FocusCache(native=False))"),
                          (dict(device="cuda"), "the native kernels run on the CPU, the call on cuda"),
                          (dict(native_kernels=False), "the native kernels cannot be built here")):
        chosen = plan(config, CallFacts(**{**prompt, **facts}))
        assert chosen.kernel == "indexer_prompt" and chosen.declined == (("indexer_native_prompt", reason),)
    for changes, facts, reason in (({"dense_heads": ["l0h0"]}, {}, "dense heads (FocusConfig.dense_heads)"),
                                   ({}, dict(gradients=True), "a gradient flows through the attention"),
                                   ({}, dict(softcap=True), "the model soft-caps its logits")):
        chosen = plan(config.replace(**changes), CallFacts(**{**prompt, **facts}))
        assert chosen.kernel == "dense_masked" and dict(chosen.declined)["indexer_prompt"] == reason
