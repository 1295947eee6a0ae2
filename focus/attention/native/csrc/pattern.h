// Hard Focus's pattern for the native kernels, stated once (focus/attention/pattern/rule.py states it for PyTorch;
// tests/test_pattern.py holds the two together through `pattern_pairs`, pattern.cpp):
//   kept(i, j) = allowed(i, j) and (0 <= i - j < window  or  j is a sink  or  the groups of i and j meet)
// A token's groups are the bits of one int64 (ids below GROUP_BITS, kernels.h); a sink holds every bit (SINK_BITS).
#pragma once

#include <cstdint>

namespace focus_native {

constexpr int64_t SINK_BITS = -1;

// The bits of a token's `top_k` distinct group ids.
inline int64_t group_bits(const int64_t* groups, int64_t top_k) {
  int64_t bits = 0;
  for (int64_t slot = 0; slot < top_k; ++slot) bits |= int64_t{1} << groups[slot];
  return bits;
}

// Whether a query's and a key's groups share one: one AND.
inline bool groups_meet(int64_t query_bits, int64_t key_bits) { return (query_bits & key_bits) != 0; }

// Whether the key is one of the query's `window` most recent keys, itself included.
inline bool within_window(int64_t query_position, int64_t key_position, int64_t window) {
  const int64_t distance = query_position - key_position;
  return distance >= 0 && distance < window;
}

// The pattern of a causal model: a key not after the query, within its window or sharing a group (a sink's bits
// meet every query's).
inline bool kept(int64_t query_position, int64_t key_position, int64_t window, int64_t query_bits, int64_t key_bits) {
  return query_position >= key_position &&
         (within_window(query_position, key_position, window) || groups_meet(query_bits, key_bits));
}

}  // namespace focus_native
