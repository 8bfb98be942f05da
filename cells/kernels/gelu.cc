// Exact GELU, 0.5 x (1 + erf(x / sqrt 2)), and GELU of (x + bias) for the MLP's first projection, forward
// and backward. MindSpore 2.10 runs the erf formulation as five CPU kernels forward and more backward;
// these are one pass each, vectorised, rows in parallel (pool.h). The bias variant also returns the bias gradient
// (the column sums of the incoming gradient), which otherwise costs a separate ReduceSum.
#include "common.h"
#include "pool.h"

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

inline float gelu(float x) { return 0.5f * x * (1.0f + mindvl::fast_erf(x * kInvSqrt2)); }

// d gelu / dx = Phi(x) + x phi(x); erf(x / sqrt 2) and the density phi share e^(-x^2 / 2)
inline float gelu_slope(float x) {
  const float e = mindvl::fast_exp(-0.5f * x * x);
  return 0.5f * (1.0f + mindvl::erf_with(x * kInvSqrt2, e)) + x * kInvSqrt2Pi * e;
}

}  // namespace

// inputs x; output y
MINDVL_KERNEL(MindvlGeluForward) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  const int64_t n = mindvl::elements(ndims[0], shapes[0]);
  mindvl::Pool::instance().parallel_for(n, [&](int64_t begin, int64_t end, int) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) y[i] = gelu(x[i]);
  });
  return 0;
}

// inputs x, dy; output dx
MINDVL_KERNEL(MindvlGeluBackward) {
  const float *x = static_cast<const float *>(params[0]);
  const float *dy = static_cast<const float *>(params[1]);
  float *dx = static_cast<float *>(params[2]);
  const int64_t n = mindvl::elements(ndims[0], shapes[0]);
  mindvl::Pool::instance().parallel_for(n, [&](int64_t begin, int64_t end, int) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) dx[i] = dy[i] * gelu_slope(x[i]);
  });
  return 0;
}

// inputs x (..., C), bias (C); output y = gelu(x + bias)
MINDVL_KERNEL(MindvlBiasGeluForward) {
  const float *x = static_cast<const float *>(params[0]);
  const float *bias = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  const mindvl::Rows r = mindvl::rows_of(ndims[0], shapes[0]);
  // a lambda, not the function: a function pointer would be called per element and keep the loop scalar
  mindvl::bias_rows(x, bias, y, r.rows, r.cols, [](float v) { return gelu(v); });
  return 0;
}

// inputs x (..., C), bias (C), dy (..., C); outputs dx (..., C), dbias (C)
MINDVL_KERNEL(MindvlBiasGeluBackward) {
  const float *x = static_cast<const float *>(params[0]);
  const float *bias = static_cast<const float *>(params[1]);
  const float *dy = static_cast<const float *>(params[2]);
  float *dx = static_cast<float *>(params[3]);
  float *dbias = static_cast<float *>(params[4]);
  const mindvl::Rows r = mindvl::rows_of(ndims[0], shapes[0]);
  mindvl::Pool &pool = mindvl::Pool::instance();
  mindvl::PartialSums sums(pool.size(), r.cols);
  pool.parallel_for(r.rows, [&](int64_t begin, int64_t end, int worker) {
    float *partial = sums.of(worker);
    for (int64_t row = begin; row < end; ++row) {
      const float *xr = x + row * r.cols, *dyr = dy + row * r.cols;
      float *dxr = dx + row * r.cols;
#pragma omp simd
      for (int64_t c = 0; c < r.cols; ++c) {
        const float g = dyr[c] * gelu_slope(xr[c] + bias[c]);
        dxr[c] = g;
        partial[c] += g;
      }
    }
  });
  sums.total(dbias);
  return 0;
}
