// The query-routed prefill's segments as one native call (focus.attention.native.native_routed_prefill): every query row and key
// row of `rectangle.rectangle_entries(once=True)`, and each query row's run of keys, in two counting passes.
//
// The eager form sorts every row by (segment, position) and finds each query's keys by binary search: a third of
// the rectangles' own time in sorts, searches and small tensor ops. Here the segments are single groups (each kept pair once), so a counting sort per (batch,
// query head) is the whole job: rows come out in position order within each group by walking the positions once.

#include "kernels.h"

#include "pattern.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

struct Sizes {
  int64_t batch, q_heads, k_heads, length, top_k, groups;
};

// Rows of one (batch, query head): its query rows and the key rows of the segments they read, per group.
struct Counts {
  std::vector<int64_t> queries, keys;  // per group
  int64_t query_total = 0, key_total = 0;
};

Counts count_rows(const Sizes& s, int64_t bh, const int64_t* gq, const int64_t* gk, const bool* valid,
                  const bool* sinks) {
  const int64_t b = bh / s.q_heads, kh = bh % s.q_heads * s.k_heads / s.q_heads;
  const int64_t* q_groups = gq + bh * s.length * s.top_k;
  const int64_t* k_groups = gk + (b * s.k_heads + kh) * s.length * s.top_k;
  Counts c{std::vector<int64_t>(s.groups, 0), std::vector<int64_t>(s.groups, 0)};
  int64_t sink_count = 0;
  for (int64_t pos = 0; pos < s.length; ++pos) {
    if (!valid[b * s.length + pos]) continue;
    for (int64_t slot = 0; slot < s.top_k; ++slot) ++c.queries[q_groups[pos * s.top_k + slot]];
    if (sinks[b * s.length + pos]) {
      ++sink_count;
      continue;
    }
    for (int64_t slot = 0; slot < s.top_k; ++slot) ++c.keys[k_groups[pos * s.top_k + slot]];
  }
  for (int64_t g = 0; g < s.groups; ++g) {
    if (c.queries[g] == 0) c.keys[g] = 0;  // a segment without queries is never read
    else c.keys[g] += sink_count;  // sink keys join every segment that has a query
    c.query_total += c.queries[g];
    c.key_total += c.keys[g];
  }
  return c;
}


}  // namespace

// groups_q (B, Hq, L, k) int64: each query head's groups (Hq = H, or K when the query heads of a key/value head share
// them); groups_k (B, K, L, k) int64, the keys'; ids in [0, GROUP_BITS), distinct per token. valid, sinks (B, L) bool (sinks
// among the valid tokens). Returns, query rows in (batch, query head, group, position) order and key rows in (batch,
// query head, group, position) order:
//   query_rows (N,): (batch * Hq + head) * L + position;  key_first, key_count (N,): each query row's keys, the
//   keys of its group at least `window` before it;  query_skip (N,): the row's group bits below its segment's group;
//   key_rows (Nk,): (batch * K + key head) * L + position;  key_bits (Nk,): the key's group bits (a sink's all set).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> segment_rows(
    const at::Tensor& groups_q, const at::Tensor& groups_k, const at::Tensor& valid, const at::Tensor& sinks,
    int64_t window) {
  TORCH_CHECK(groups_q.dim() == 4 && groups_k.dim() == 4 && groups_q.scalar_type() == at::kLong &&
                  groups_k.scalar_type() == at::kLong && groups_q.is_contiguous() && groups_k.is_contiguous(),
              "segment_rows: contiguous int64 groups (B, Hq, L, k) and (B, K, L, k)");
  TORCH_CHECK(valid.scalar_type() == at::kBool && sinks.scalar_type() == at::kBool && valid.is_contiguous() &&
                  sinks.is_contiguous() && valid.sizes() == sinks.sizes() && valid.dim() == 2,
              "segment_rows: contiguous bool valid and sinks (B, L)");
  const Sizes s{groups_q.size(0), groups_q.size(1), groups_k.size(1), groups_q.size(2), groups_q.size(3),
                focus_native::GROUP_BITS};
  TORCH_CHECK(groups_k.size(0) == s.batch && groups_k.size(2) == s.length && groups_k.size(3) == s.top_k &&
                  s.q_heads % s.k_heads == 0 && valid.size(0) == s.batch && valid.size(1) == s.length,
              "segment_rows: groups_q, groups_k, valid of one batch, length and top-k");
  const int64_t* gq = groups_q.data_ptr<int64_t>();
  const int64_t* gk = groups_k.data_ptr<int64_t>();
  const bool* is_valid = valid.data_ptr<bool>();
  const bool* is_sink = sinks.data_ptr<bool>();
  for (const at::Tensor* groups : {&groups_q, &groups_k}) {  // padding's ids are never read: checked where valid
    const int64_t* g = groups->data_ptr<int64_t>();
    const int64_t per_batch = groups->numel() / std::max<int64_t>(s.batch, 1);
    for (int64_t i = 0; i < groups->numel(); ++i) {
      const int64_t pos = i / s.top_k % s.length, b = i / per_batch;
      TORCH_CHECK(!is_valid[b * s.length + pos] || (g[i] >= 0 && g[i] < s.groups),
                  "segment_rows: group ids of valid tokens in [0, ", s.groups, ")");
    }
  }

  const int64_t heads = s.batch * s.q_heads;
  std::vector<Counts> counts(heads);
  at::parallel_for(0, heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) counts[bh] = count_rows(s, bh, gq, gk, is_valid, is_sink);
  });
  std::vector<int64_t> q_start(heads + 1, 0), k_start(heads + 1, 0);
  for (int64_t bh = 0; bh < heads; ++bh) {
    q_start[bh + 1] = q_start[bh] + counts[bh].query_total;
    k_start[bh + 1] = k_start[bh] + counts[bh].key_total;
  }
  const auto options = groups_q.options();
  auto query_rows = at::empty({q_start[heads]}, options), key_first = at::empty({q_start[heads]}, options);
  auto key_count = at::empty({q_start[heads]}, options), query_skip = at::empty({q_start[heads]}, options);
  auto key_rows = at::empty({k_start[heads]}, options), key_bits = at::empty({k_start[heads]}, options);
  int64_t* q_rows = query_rows.data_ptr<int64_t>();
  int64_t* first = key_first.data_ptr<int64_t>();
  int64_t* count = key_count.data_ptr<int64_t>();
  int64_t* skip = query_skip.data_ptr<int64_t>();
  int64_t* k_rows = key_rows.data_ptr<int64_t>();
  int64_t* k_bits = key_bits.data_ptr<int64_t>();

  at::parallel_for(0, heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> q_next(s.groups), k_begin(s.groups), k_next(s.groups), seen(s.groups);
    for (int64_t bh = begin; bh < end; ++bh) {
      const Counts& c = counts[bh];
      const int64_t b = bh / s.q_heads, kh = bh % s.q_heads * s.k_heads / s.q_heads;
      const int64_t* q_groups = gq + bh * s.length * s.top_k;
      const int64_t* k_groups = gk + (b * s.k_heads + kh) * s.length * s.top_k;
      for (int64_t g = 0, q_at = q_start[bh], k_at = k_start[bh]; g < s.groups; ++g) {
        q_next[g] = q_at;
        k_begin[g] = k_next[g] = seen[g] = k_at;
        q_at += c.queries[g];
        k_at += c.keys[g];
      }
      // Keys first, in position order: each into its groups' segments (a sink into every segment read).
      for (int64_t pos = 0; pos < s.length; ++pos) {
        if (!is_valid[b * s.length + pos]) continue;
        const int64_t row = (b * s.k_heads + kh) * s.length + pos;
        if (is_sink[b * s.length + pos]) {
          for (int64_t g = 0; g < s.groups; ++g) {
            if (c.queries[g] == 0) continue;
            k_rows[k_next[g]] = row;
            k_bits[k_next[g]++] = focus_native::SINK_BITS;
          }
          continue;
        }
        const int64_t* mine = k_groups + pos * s.top_k;
        const int64_t bits = focus_native::group_bits(mine, s.top_k);
        for (int64_t slot = 0; slot < s.top_k; ++slot) {
          const int64_t g = mine[slot];
          if (c.queries[g] == 0) continue;
          k_rows[k_next[g]] = row;
          k_bits[k_next[g]++] = bits;
        }
      }
      // Then the queries, in position order: each sees its segment's keys up to `window` before it.
      for (int64_t pos = 0; pos < s.length; ++pos) {
        if (!is_valid[b * s.length + pos]) continue;
        const int64_t* mine = q_groups + pos * s.top_k;
        const int64_t bits = focus_native::group_bits(mine, s.top_k);
        for (int64_t slot = 0; slot < s.top_k; ++slot) {
          const int64_t g = mine[slot];
          while (seen[g] < k_next[g] && k_rows[seen[g]] % s.length <= pos - window) ++seen[g];
          const int64_t at = q_next[g]++;
          q_rows[at] = bh * s.length + pos;
          first[at] = k_begin[g];
          count[at] = seen[g] - k_begin[g];
          skip[at] = bits & ((int64_t{1} << g) - 1);
        }
      }
    }
  });
  return {query_rows, key_first, key_count, query_skip, key_rows, key_bits};
}
