// Shared by the kernels: the AOT calling convention, rows of a tensor, and exp / erf written so that
// g++ -O3 vectorises loops calling them (libm's expf / erff are scalar calls).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

// An AOT kernel: inputs then outputs in `params`, their ranks and shapes alongside; returns 0.
#define MINDVL_KERNEL(name)                                                                                  \
  extern "C" int name(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, \
                      void *extra)

namespace mindvl {

struct Rows {
  int64_t rows, cols;
};

// A tensor as rows of its last axis.
inline Rows rows_of(int rank, const int64_t *shape) {
  Rows r{1, rank > 0 ? shape[rank - 1] : 1};
  for (int i = 0; i < rank - 1; ++i) r.rows *= shape[i];
  return r;
}

inline int64_t elements(int rank, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

// e^x for x <= 0 (every caller's argument: a softmax's score less its row maximum, -x^2): x = n ln2 + r with
// |r| <= ln2 / 2, e^r by its Taylor series to r^7 (relative error < 3e-9 before rounding), 2^n built in the
// exponent bits. Below -87, where float's normal range ends, the result is exactly 0: a masked score's
// weight must be 0, not ~1e-38, whose products are denormals that slow every later multiply by them (the
// attention core's sgemm ran 4-5x slower). One-sided (no upper clamp, nothing above 0 arrives), which
// keeps the loop short on AVX2; a NaN stays NaN.
inline float fast_exp(float x) {
  const bool underflows = x < -87.0f;
  x = underflows ? -87.0f : x;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;  // ln2 in two parts
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return underflows ? 0.0f : p * scale;
}

// erf(x) by Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7 (the formula cells/portable.py exports for ONNX),
// from e = e^(-x^2), which a caller that needs that exponential too computes once (GELU's gradient)
inline float erf_with(float x, float e) {
  const float a = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  const float series =
      ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  const float y = 1.0f - series * e;
  return x < 0.0f ? -y : y;
}

inline float fast_erf(float x) { return erf_with(x, fast_exp(-x * x)); }

// 1 / sqrt(mean(x^2) + eps) of one row (RMSNorm's statistic)
inline float inverse_rms(const float *x, int64_t cols, float eps) {
  float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
  for (int64_t c = 0; c < cols; ++c) squares += x[c] * x[c];
  return 1.0f / std::sqrt(squares / cols + eps);
}

// y = x / rms(x) * weight over one row of `cols` (in place is fine)
inline void rms_row(const float *x, const float *weight, float *y, int64_t cols, float eps) {
  const float inv = inverse_rms(x, cols, eps);
#pragma omp simd
  for (int64_t c = 0; c < cols; ++c) y[c] = x[c] * inv * weight[c];
}

// One head of `dim` rotated by the rotary embedding ("rotate half": dimension i pairs with i + dim / 2):
// y1 = x1 cos1 - x2 sin1, y2 = x2 cos2 + x1 sin2. In place is fine (each pair is read before it is written).
inline void rotate_half(const float *x, const float *cos, const float *sin, float *y, int64_t dim) {
  const int64_t half = dim / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float first = x[i], second = x[i + half];
    y[i] = first * cos[i] - second * sin[i];
    y[i + half] = second * cos[i + half] + first * sin[i + half];
  }
}

}  // namespace mindvl
