// The online softmax's arithmetic, shared by the attention kernels (step.cpp, rectangle.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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

#if defined(__AVX512F__)
// exp_nonpositive on 16 lanes (the same polynomial), for loops the compiler does not vectorize.
inline __m512 exp_nonpositive_16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i power = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(power));
}
#endif

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
