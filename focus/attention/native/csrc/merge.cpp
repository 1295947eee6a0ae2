// The query-routed prefill's merge as one native call (the last of focus.attention.native.native_routed_prefill):
// each query's band part and the signed parts of its segments summed at their common maximum (decomposed._merge).
//
// The eager merge gathers, scatters and rescales whole (parts, heads, D) tensors through half a dozen ops and their
// copies. Here each part is read once: the maxima in one pass, the
// weighted sums in a second, in float32.

#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

// local_out (B, K, R, L, D) float32, any strides but unit along D; local_lse (B, K, R, L) float32 (-inf: no band
// pair); part_out (M, R, D) and part_lse (M, R) float32, contiguous; part_row (M,) int64: each part's query as
// (batch * K + head) * L + position; part_sign (M,) int64, +1 or -1; valid (B, L) bool. Returns (B, K, R, L, D)
// float32: the merged attention, zero for padding queries.
at::Tensor merge_parts(const at::Tensor& local_out, const at::Tensor& local_lse, const at::Tensor& part_out,
                          const at::Tensor& part_lse, const at::Tensor& part_row, const at::Tensor& part_sign,
                          const at::Tensor& valid) {
  TORCH_CHECK(local_out.dim() == 5 && local_out.scalar_type() == at::kFloat && local_out.stride(4) == 1 &&
                  local_lse.dim() == 4 && local_lse.scalar_type() == at::kFloat,
              "merge_parts: float32 local_out (B, K, R, L, D) and local_lse (B, K, R, L)");
  TORCH_CHECK(part_out.scalar_type() == at::kFloat && part_lse.scalar_type() == at::kFloat &&
                  part_out.is_contiguous() && part_lse.is_contiguous() && part_row.scalar_type() == at::kLong &&
                  part_sign.scalar_type() == at::kLong && part_row.is_contiguous() && part_sign.is_contiguous() &&
                  valid.scalar_type() == at::kBool && valid.is_contiguous(),
              "merge_parts: contiguous float32 parts, int64 rows and signs, bool valid");
  const int64_t b_size = local_out.size(0), k_heads = local_out.size(1), r = local_out.size(2);
  const int64_t length = local_out.size(3), d = local_out.size(4), m_size = part_row.numel();
  const int64_t rows = b_size * k_heads * length;
  const float* l_out = local_out.data_ptr<float>();
  const float* l_lse = local_lse.data_ptr<float>();
  const float* p_out = part_out.data_ptr<float>();
  const float* p_lse = part_lse.data_ptr<float>();
  const int64_t* p_row = part_row.data_ptr<int64_t>();
  const int64_t* p_sign = part_sign.data_ptr<int64_t>();
  const bool* is_valid = valid.data_ptr<bool>();
  const int64_t o_b = local_out.stride(0), o_k = local_out.stride(1), o_r = local_out.stride(2), o_l = local_out.stride(3);
  const int64_t s_b = local_lse.stride(0), s_k = local_lse.stride(1), s_r = local_lse.stride(2), s_l = local_lse.stride(3);
  constexpr float none = -std::numeric_limits<float>::infinity();

  // Per query row (batch, head, position) and query head: the largest log-sum-exp of its parts, band included.
  std::vector<float> peak(rows * r);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / (k_heads * length), k = row / length % k_heads, l = row % length;
    for (int64_t i = 0; i < r; ++i) peak[row * r + i] = l_lse[b * s_b + k * s_k + i * s_r + l * s_l];
  }
  for (int64_t m = 0; m < m_size; ++m)
    for (int64_t i = 0; i < r; ++i) peak[p_row[m] * r + i] = std::max(peak[p_row[m] * r + i], p_lse[m * r + i]);

  // Sums of the weighted parts; the band's first, then every segment part with its sign.
  auto out = at::zeros({b_size, k_heads, r, length, d}, local_out.options().memory_format(at::MemoryFormat::Contiguous));
  float* o = out.data_ptr<float>();
  std::vector<float> weight(rows * r, 0.0f);
  auto at_row = [&](int64_t row, int64_t i) {  // the output row of (query row, query head)
    const int64_t b = row / (k_heads * length), k = row / length % k_heads, l = row % length;
    return o + (((b * k_heads + k) * r + i) * length + l) * d;
  };
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (k_heads * length), k = row / length % k_heads, l = row % length;
      for (int64_t i = 0; i < r; ++i) {
        const float lse = l_lse[b * s_b + k * s_k + i * s_r + l * s_l];
        if (lse == none) continue;
        const float w = std::exp(lse - peak[row * r + i]);
        weight[row * r + i] = w;
        const float* src = l_out + b * o_b + k * o_k + i * o_r + l * o_l;
        float* dst = at_row(row, i);
        for (int64_t x = 0; x < d; ++x) dst[x] = w * src[x];
      }
    }
  });
  // Parts of one query row may sit anywhere in its head's run of parts (sorted by head, then segment): the heads'
  // runs are summed in parallel where the parts come sorted by head (the native rectangles' do), else serially.
  auto add_parts = [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const int64_t row = p_row[m];
      for (int64_t i = 0; i < r; ++i) {
        const float lse = p_lse[m * r + i];
        if (lse == none) continue;
        const float w = static_cast<float>(p_sign[m]) * std::exp(lse - peak[row * r + i]);
        weight[row * r + i] += w;
        const float* src = p_out + (m * r + i) * d;
        float* dst = at_row(row, i);
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) dst[x] += w * src[x];
      }
    }
  };
  std::vector<int64_t> head_start{0};  // where each head's run of parts begins, while they are sorted by head
  for (int64_t m = 1; m < m_size && head_start.front() >= 0; ++m) {
    const int64_t head = p_row[m] / length, before = p_row[m - 1] / length;
    if (head < before) head_start.front() = -1;
    else if (head > before) head_start.push_back(m);
  }
  if (head_start.front() < 0) {
    add_parts(0, m_size);
  } else {
    head_start.push_back(m_size);
    at::parallel_for(0, static_cast<int64_t>(head_start.size()) - 1, 1, [&](int64_t begin, int64_t end) {
      for (int64_t run = begin; run < end; ++run) add_parts(head_start[run], head_start[run + 1]);
    });
  }
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const bool real = is_valid[row / (k_heads * length) * length + row % length];
      for (int64_t i = 0; i < r; ++i) {
        const float scale = real ? 1.0f / std::max(weight[row * r + i], std::numeric_limits<float>::min()) : 0.0f;
        float* dst = at_row(row, i);
        for (int64_t x = 0; x < d; ++x) dst[x] *= scale;
      }
    }
  });
  return out;
}
