// The online softmax's arithmetic, shared by the attention kernels (step.cpp, rectangle.cpp).
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

}  // namespace focus_native
