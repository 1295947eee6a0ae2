// One layer's decoding step of the per-key indexer as one native call (kernel_runs.run_indexer_native_step calls it;
// focus.attention.routers.indexer.indexer_decode_attention is the eager step it replaces).
//
// The eager step's scores, top-k and gathers cost more than the unmodified step's attention over every key at 8K
// (benchmarks/results/routers/bench/indexer_step.md): `topk` sorts what only needs a threshold, and the kept keys are
// copied before they are read. Here each selection scores every key from its cached code (r bfloat16 numbers per key,
// not D: the scoring is bound by reading them), finds the threshold of its top `need` by a histogram and a partial sort
// of one bucket, and its query heads attend over the kept keys read in place (kept_rows.h), the list cut into parts
// over the cores.

#include "kernels.h"

#include "kept_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using focus_native::KEPT_BLOCK;

constexpr int64_t PART = 512;  // kept keys per attention task: every core has work at batch 1

// A selection's query code (r): the mean over its `heads` query heads (q rows `q_step` apart, their weights (D, r)
// one after another) of q W_q[h], so that its score of a key is the mean of its heads' scores.
template <typename scalar_t>
void query_code(const scalar_t* q, int64_t q_step, const float* weights, int64_t heads, int64_t d, int64_t rank,
                float* code) {
  std::fill(code, code + rank, 0.0f);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t m = 0; m < d; ++m) {
      const float x = static_cast<float>(q[h * q_step + m]) / static_cast<float>(heads);
      const float* w = weights + (h * d + m) * rank;
#pragma omp simd
      for (int64_t c = 0; c < rank; ++c) code[c] += x * w[c];
    }
}

// Every key's index score (length): its code (r numbers, float32 or bfloat16, `code_step` apart) against the query's.
template <typename code_t>
void score_keys(const float* code, const code_t* codes, int64_t code_step, int64_t rank, int64_t length, float* out) {
  for (int64_t j = 0; j < length; ++j) {
    const code_t* key_code = codes + j * code_step;
    float score = 0;
#pragma omp simd reduction(+ : score)
    for (int64_t c = 0; c < rank; ++c) score += code[c] * static_cast<float>(key_code[c]);
    out[j] = score;
  }
}

// The `need`-th largest of `values` (0 < need <= its size), exactly: a histogram of BUCKETS equal buckets between
// their least and greatest finds the bucket that holds it, then a partial sort of that bucket's values alone (a
// partial sort of all of them, std::nth_element, took 50 microseconds of an 8K-key step).
float kth_largest(const std::vector<float>& values, int64_t need) {
  constexpr int64_t BUCKETS = 1024;
  float low = std::numeric_limits<float>::infinity(), high = -low;
  for (const float v : values) {
    low = std::min(low, v);
    high = std::max(high, v);
  }
  if (!(high > low)) return high;  // all equal
  const float per_bucket = static_cast<float>(BUCKETS) / (high - low);
  auto bucket_of = [&](float v) { return std::min<int64_t>(static_cast<int64_t>((v - low) * per_bucket), BUCKETS - 1); };
  std::vector<int64_t> counts(BUCKETS, 0);
  for (const float v : values) ++counts[bucket_of(v)];
  int64_t bucket = BUCKETS - 1, above = 0;  // from the top, the bucket where the count reaches `need`
  while (above + counts[bucket] < need) above += counts[bucket--];
  std::vector<float> inside;
  inside.reserve(counts[bucket]);
  for (const float v : values)
    if (bucket_of(v) == bucket) inside.push_back(v);
  const int64_t rank = need - above - 1;
  std::nth_element(inside.begin(), inside.begin() + rank, inside.end(), std::greater<float>());
  return inside[rank];
}

// The keys one selection keeps, in order: its row's first `sink_tokens` real keys before the window, the `need` distant
// keys with the highest index scores (ties at the threshold taken first to last), and the window's real keys.
// scores: the selection's score of every key, overwritten with -inf for the keys that are not distant.
std::vector<int64_t> select_keys(float* scores, const bool* allowed, int64_t mask_step, int64_t length, int64_t window,
                                 int64_t sink_tokens, double budget, int64_t budget_keys) {
  const int64_t start = length - std::min(window, length);
  std::vector<char> sink(start, 0);
  for (int64_t j = 0, found = 0; j < start && found < sink_tokens; ++j) {
    if (allowed && !allowed[j * mask_step]) continue;
    sink[j] = 1;
    ++found;
  }
  std::vector<float> distant;
  distant.reserve(start);
  for (int64_t j = 0; j < start; ++j) {
    if (sink[j] || (allowed && !allowed[j * mask_step]))
      scores[j] = -std::numeric_limits<float>::infinity();
    else
      distant.push_back(scores[j]);
  }
  const int64_t count = static_cast<int64_t>(distant.size());
  const int64_t need = budget_keys > 0 ? std::min(count, budget_keys)
                                       : static_cast<int64_t>(std::ceil(budget * static_cast<double>(count)));
  float threshold = -std::numeric_limits<float>::infinity();
  int64_t at_threshold = count;  // how many keys scored exactly `threshold` are kept
  if (need < count) {
    if (need == 0) {
      threshold = std::numeric_limits<float>::infinity();
      at_threshold = 0;
    } else {
      threshold = kth_largest(distant, need);
      const int64_t above = std::count_if(distant.begin(), distant.end(), [&](float s) { return s > threshold; });
      at_threshold = need - above;
    }
  }
  std::vector<int64_t> kept;
  kept.reserve(std::min(need, count) + window + sink_tokens);
  for (int64_t j = 0; j < start; ++j) {
    const float s = scores[j];
    if (sink[j] || s > threshold || (s == threshold && s != -std::numeric_limits<float>::infinity() &&
                                      at_threshold-- > 0))
      kept.push_back(j);
  }
  for (int64_t j = start; j < length; ++j)
    if (!allowed || allowed[j * mask_step]) kept.push_back(j);
  return kept;
}

}  // namespace

at::Tensor indexer_step(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& codes,
                        const at::Tensor& query_weights, const c10::optional<at::Tensor>& base_mask, int64_t window,
                        int64_t sink_tokens, double budget, int64_t budget_keys, bool shared,
                        c10::optional<double> scaling) {
  const int64_t b_size = query.size(0), heads = query.size(1), d = query.size(3);
  const int64_t k_heads = key.size(1), length = key.size(2), r = heads / k_heads, rank = codes.size(3);
  TORCH_CHECK(query.device().is_cpu() && query.size(2) == 1, "indexer_step: one CPU query token per row");
  TORCH_CHECK(r <= 62, "indexer_step: at most 62 query heads per key/value head");  // a bit per head in kept_by
  TORCH_CHECK((codes.scalar_type() == at::kFloat || codes.scalar_type() == at::kBFloat16) && codes.size(0) == b_size && codes.size(1) == k_heads &&
                  codes.size(2) == length && codes.stride(3) == 1,
              "indexer_step: float32 or bfloat16 key codes (B, K, L, r), one per cached key");
  TORCH_CHECK(query_weights.scalar_type() == at::kFloat && query_weights.is_contiguous() &&
                  query_weights.size(0) == heads && query_weights.size(1) == d && query_weights.size(2) == rank,
              "indexer_step: the indexer's contiguous float32 query weights (H, D, r)");
  TORCH_CHECK(query.stride(3) == 1 && key.stride(3) == 1 && value.stride(3) == 1,
              "indexer_step: rows must be contiguous along the head dimension");
  TORCH_CHECK(!base_mask || (base_mask->scalar_type() == at::kBool && base_mask->size(-1) >= length),
              "indexer_step: a boolean mask (B, 1, 1, L) of the keys the model allows");
  const int64_t per_selection = shared ? r : 1, selections_per_head = shared ? 1 : r;
  const int64_t selections = b_size * k_heads * selections_per_head;
  const bool* mask_data = base_mask ? base_mask->data_ptr<bool>() : nullptr;
  const int64_t mask_step = base_mask ? base_mask->stride(3) : 0, mask_batch = base_mask ? base_mask->stride(0) : 0;
  const float* weights = query_weights.data_ptr<float>();
  const int64_t code_batch = codes.stride(0), code_head = codes.stride(1), code_step = codes.stride(2);
  const int64_t q_batch = query.stride(0), q_head = query.stride(1);
  std::vector<std::vector<int64_t>> kept(selections);
  auto out = at::empty({b_size, heads, 1, d}, query.options());
  const double scale = scaling ? *scaling : 1.0 / std::sqrt(static_cast<double>(d));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "indexer_step", [&] {
    const scalar_t* q_data = query.data_ptr<scalar_t>();
    // Each selection's kept keys: its query code, every key's index score, the top ones (select_keys).
    at::parallel_for(0, selections, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> code(rank), index_scores(length);
      for (int64_t s = begin; s < end; ++s) {
        const int64_t b = s / (k_heads * selections_per_head), k = s / selections_per_head % k_heads;
        const int64_t first_head = k * r + (shared ? 0 : s % selections_per_head);
        query_code(q_data + b * q_batch + first_head * q_head, q_head, weights + first_head * d * rank,
                   per_selection, d, rank, code.data());
        if (codes.scalar_type() == at::kBFloat16)
          score_keys(code.data(), codes.data_ptr<at::BFloat16>() + b * code_batch + k * code_head, code_step, rank,
                     length, index_scores.data());
        else
          score_keys(code.data(), codes.data_ptr<float>() + b * code_batch + k * code_head, code_step, rank, length,
                     index_scores.data());
        kept[s] = select_keys(index_scores.data(), mask_data ? mask_data + b * mask_batch : nullptr, mask_step,
                              length, window, sink_tokens, budget, budget_keys);
      }
    });
    // Each selection's list cut into parts of PART keys: the attention's tasks.
    std::vector<int64_t> first_part(selections + 1, 0);
    for (int64_t s = 0; s < selections; ++s)
      first_part[s + 1] = first_part[s] + std::max<int64_t>(1, (static_cast<int64_t>(kept[s].size()) + PART - 1) / PART);
    const int64_t parts = first_part[selections];
    std::vector<float> best(parts * per_selection, -std::numeric_limits<float>::infinity());
    std::vector<float> total(parts * per_selection), acc(parts * per_selection * d);
    const scalar_t* k_data = key.data_ptr<scalar_t>();
    const scalar_t* v_data = value.data_ptr<scalar_t>();
    const int64_t key_step = key.stride(2), value_step = value.stride(2);
    const int64_t k_batch = key.stride(0), k_head = key.stride(1), v_batch = value.stride(0), v_head = value.stride(1);
    at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> q(per_selection * d), scores(per_selection * KEPT_BLOCK);
      const std::vector<int64_t> everyone(PART, (int64_t{1} << per_selection) - 1);  // each head weighs each key
      for (int64_t task = begin; task < end; ++task) {
        const int64_t s = std::upper_bound(first_part.begin(), first_part.end(), task) - first_part.begin() - 1;
        const int64_t b = s / (k_heads * selections_per_head), k = s / selections_per_head % k_heads;
        const int64_t first_head = k * r + (shared ? 0 : s % selections_per_head);
        for (int64_t i = 0; i < per_selection; ++i) {
          const scalar_t* q_row = q_data + b * q_batch + (first_head + i) * q_head;
          for (int64_t m = 0; m < d; ++m) q[i * d + m] = static_cast<float>(q_row[m]) * static_cast<float>(scale);
        }
        const int64_t from = (task - first_part[s]) * PART;
        const int64_t n = std::max<int64_t>(0, std::min<int64_t>(PART, static_cast<int64_t>(kept[s].size()) - from));
        auto attend = [&](auto head_size) {
          focus_native::attend_rows<scalar_t, decltype(head_size)::value, true>(
              q.data(), per_selection, d, k_data + b * k_batch + k * k_head, v_data + b * v_batch + k * v_head,
              key_step, value_step, kept[s].data() + from, everyone.data(), n, &best[task * per_selection],
              &total[task * per_selection], &acc[task * per_selection * d], scores.data());
        };
        if (d == 64) attend(std::integral_constant<int64_t, 64>());
        else if (d == 128) attend(std::integral_constant<int64_t, 128>());
        else attend(std::integral_constant<int64_t, 0>());
      }
    });
    scalar_t* o_data = out.data_ptr<scalar_t>();
    std::vector<float> merged(d);
    for (int64_t s = 0; s < selections; ++s) {  // each head's parts, merged at their common maximum
      const int64_t b = s / (k_heads * selections_per_head), k = s / selections_per_head % k_heads;
      const int64_t first_head = k * r + (shared ? 0 : s % selections_per_head), p = first_part[s];
      for (int64_t i = 0; i < per_selection; ++i)
        focus_native::merge_parts_of_head(&best[p * per_selection + i], &total[p * per_selection + i],
                                          &acc[(p * per_selection + i) * d], first_part[s + 1] - p, per_selection, d,
                                          merged.data(), o_data + (b * heads + first_head + i) * d);
    }
  });
  return out;
}

at::Tensor indexer_thresholds(const at::Tensor& scores, const at::Tensor& need) {
  TORCH_CHECK(scores.device().is_cpu() && scores.scalar_type() == at::kFloat && scores.dim() == 2 &&
                  scores.stride(1) == 1,
              "indexer_thresholds: CPU float32 scores (N, L), contiguous along L");
  TORCH_CHECK(need.scalar_type() == at::kLong && need.dim() == 1 && need.size(0) == scores.size(0),
              "indexer_thresholds: an int64 count (N,) per row");
  const int64_t rows = scores.size(0), length = scores.size(1), row_step = scores.stride(0);
  const auto need_c = need.contiguous();
  const float* data = scores.data_ptr<float>();
  const int64_t* counts = need_c.data_ptr<int64_t>();
  auto out = at::empty({rows}, scores.options());
  float* thresholds = out.data_ptr<float>();
  constexpr float inf = std::numeric_limits<float>::infinity();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> candidates;
    candidates.reserve(length);
    for (int64_t i = begin; i < end; ++i) {
      candidates.clear();
      const float* row = data + i * row_step;
      for (int64_t j = 0; j < length; ++j)
        if (row[j] != -inf) candidates.push_back(row[j]);
      const int64_t keep = std::min<int64_t>(counts[i], static_cast<int64_t>(candidates.size()));
      thresholds[i] = keep <= 0 ? inf : kth_largest(candidates, keep);
    }
  });
  return out;
}
