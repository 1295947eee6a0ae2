// The pattern of pattern.h over a grid of queries and keys, for tests/test_pattern.py: the rule the kernels apply,
// evaluated by the same inline functions, against focus.attention.pattern.rule.

#include "kernels.h"

#include "pattern.h"

at::Tensor pattern_pairs(const at::Tensor& query_groups, const at::Tensor& key_groups, const at::Tensor& sinks,
                         int64_t window, int64_t first_position) {
  TORCH_CHECK(query_groups.scalar_type() == at::kLong && key_groups.scalar_type() == at::kLong &&
                  query_groups.dim() == 2 && key_groups.dim() == 2 && query_groups.size(1) == key_groups.size(1),
              "pattern_pairs: int64 groups (Q, k) and (L, k)");
  TORCH_CHECK(sinks.scalar_type() == at::kBool && sinks.dim() == 1 && sinks.size(0) == key_groups.size(0),
              "pattern_pairs: a bool (L,) of the sink keys");
  const auto q_groups = query_groups.contiguous(), k_groups = key_groups.contiguous(), sink = sinks.contiguous();
  const int64_t queries = q_groups.size(0), keys = k_groups.size(0), top_k = q_groups.size(1);
  auto out = at::zeros({queries, keys}, sinks.options());
  bool* pairs = out.data_ptr<bool>();
  const int64_t* qg = q_groups.data_ptr<int64_t>();
  const int64_t* kg = k_groups.data_ptr<int64_t>();
  const bool* is_sink = sink.data_ptr<bool>();
  for (int64_t i = 0; i < queries; ++i) {
    const int64_t query_bits = focus_native::group_bits(qg + i * top_k, top_k);
    for (int64_t j = 0; j < keys; ++j) {
      const int64_t key_bits = is_sink[j] ? focus_native::SINK_BITS : focus_native::group_bits(kg + j * top_k, top_k);
      pairs[i * keys + j] = focus_native::kept(first_position + i, j, window, query_bits, key_bits);
    }
  }
  return out;
}
