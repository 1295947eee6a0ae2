// Arithmetic shared by Focus's native kernels (native_step.cpp, native_rectangle.cpp, native_route.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace focus_native {

// exp(x) for x <= 0, to about 2 ulp: Cephes' expf polynomial in plain arithmetic, inlined where std::exp is a call.
// Written with branch-free selects and builtins, so that loops calling it vectorize.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;  // below it expf is denormal; a softmax weight of 0 to float32 anyway
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // x - n ln 2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  return p * __builtin_bit_cast(float, bits);
}

// The online softmax's move to a new running maximum `top` (> best): the sum of weights and the weighted values
// summed so far are rescaled to it (nothing is summed yet while best is -inf).
inline void raise_maximum(float top, float& best, float& total, float* acc, int64_t d) {
  const float shrink = best == -__builtin_inff() ? 0.0f : exp_nonpositive(best - top);
  total *= shrink;
#pragma omp simd
  for (int64_t m = 0; m < d; ++m) acc[m] *= shrink;
  best = top;
}

// The top_k largest of row[0..n), best first; ties go to the lower index (as torch.topk's CPU kernel keeps them). One
// pass, each value inserted below the kept ones it does not exceed: after the first few, a value is mostly compared
// with the k-th alone (a predictable branch, where a pass per rank compared each value with the best unpredictably).
constexpr int64_t MAX_TOP_K = 64;  // (callers check it)
inline void top_groups(const float* row, int64_t n, int64_t top_k, int64_t* out) {
  float kept[MAX_TOP_K];
  int64_t filled = 0;
  for (int64_t g = 0; g < n; ++g) {
    const float value = row[g];
    if (filled == top_k && !(value > kept[top_k - 1])) continue;
    int64_t at = filled < top_k ? filled++ : top_k - 1;
    for (; at > 0 && value > kept[at - 1]; --at) {  // strictly greater: an equal, earlier value stays ahead
      kept[at] = kept[at - 1];
      out[at] = out[at - 1];
    }
    kept[at] = value;
    out[at] = g;
  }
}

}  // namespace focus_native
