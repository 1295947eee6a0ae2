"""Hard Focus's pattern stated once (`focus.attention.pattern.rule`, and `native/csrc/pattern.h` for the C++): the two
agree pair for pair, the dense reference is built from it, and no other module restates the group-bits rule."""

import re
from pathlib import Path

import pytest
import torch

from focus.attention.pattern.reference import hard_allowed
from focus.attention.pattern.rule import GROUP_BITS, SINK_BITS, group_bits, groups_meet, kept, within_window

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")


def random_groups(count, top_k, num_groups, generator):
    return torch.stack([torch.randperm(num_groups, generator=generator)[:top_k] for _ in range(count)])


@pytest.mark.parametrize(("top_k", "num_groups", "window", "first"), [(1, 4, 3, 0), (2, 16, 5, 7), (3, 63, 1, 20)])
def test_the_native_pattern_is_the_python_pattern(top_k, num_groups, window, first):
    """pattern.h's rule (group bits, their AND, the window, causality, sinks with every bit) over every pair of 24
    queries after `first` keys against 24 + first keys = pattern.py's."""
    from focus.attention.native import kernels

    gen = torch.Generator().manual_seed(top_k * 100 + num_groups)
    keys = 24 + first
    query_groups, key_groups = random_groups(24, top_k, num_groups, gen), random_groups(keys, top_k, num_groups, gen)
    sinks = torch.zeros(keys, dtype=torch.bool)
    sinks[:2] = True
    key_bits = group_bits(key_groups).masked_fill(sinks, SINK_BITS)
    query_position, key_position = torch.arange(first, keys)[:, None], torch.arange(keys)[None, :]
    expected = kept(query_position, key_position, window, groups_meet(group_bits(query_groups)[:, None], key_bits))
    got = kernels().pattern_pairs(query_groups, key_groups, sinks, window, first)
    assert torch.equal(got, expected)
    assert expected.any() and not expected.all()


def test_the_reference_keeps_the_patterns_pairs():
    """`hard_allowed` (groups compared by membership) = `kept` over group bits, with a padding mask and sinks."""
    gen = torch.Generator().manual_seed(3)
    length, top_k, num_groups = 20, 2, 8
    groups = random_groups(length, top_k, num_groups, gen).view(1, 1, length, top_k)
    base = torch.ones(1, 1, length, length, dtype=torch.bool).tril()
    base[..., :3] = False  # left padding
    sinks = torch.zeros(1, length, dtype=torch.bool)
    sinks[0, 3] = True
    got = hard_allowed(groups, groups, num_groups, 4, base, sinks)
    bits = group_bits(groups[0, 0])
    positions = torch.arange(length)
    expected = kept(positions[:, None], positions[None, :], 4, groups_meet(bits[:, None], bits[None, :]), base[0, 0],
                    sinks[0][None, :])
    assert torch.equal(got[0, 0], expected)


def test_the_small_rules():
    assert group_bits(torch.tensor([[0, 3], [62, 1]])).tolist() == [0b1001, (1 << 62) | 0b10]
    assert groups_meet(torch.tensor(SINK_BITS), torch.tensor(1 << (GROUP_BITS - 1))).item()
    assert within_window(torch.tensor(9), torch.arange(12), 3).nonzero().flatten().tolist() == [7, 8, 9]


def test_the_group_bits_rule_is_written_once():
    """`1 << groups` summed into bits is pattern.py's `group_bits` (and pattern.h's); no other module restates it."""
    rule = re.compile(r"\(1 << [\w.()]+\)\.sum\(|<< groups?\[|bits \|= int64_t\{1\} <<")
    found = sorted(str(path.relative_to(ROOT)) for folder in ("focus", "benchmarks")
                   for path in (ROOT / folder).rglob("*") if path.suffix in (".py", ".cpp", ".h")
                   and rule.search(path.read_text()))
    assert found == ["focus/attention/native/csrc/pattern.h", "focus/attention/pattern/rule.py"]
