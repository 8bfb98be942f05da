// LayerNorm over the last axis, forward and backward, for MindSpore's AOT custom operators on CPU.
//
// MindSpore 2.10's CPU LayerNorm and its gradient are several times slower than their arithmetic needs;
// these loops make two vectorised passes over a row for the statistics (mean, then the centred squares)
// and one for the output, rows in parallel (pool.h). eps arrives as a 0-d float32 tensor so one build
// serves every norm (1e-6, 1e-5, 1e-12).
#include <cmath>

#include "common.h"
#include "pool.h"

namespace {

// mean and 1 / sqrt(variance + eps) of one row
inline void statistics(const float *x, int64_t cols, float eps, float *mean, float *inv) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < cols; ++c) sum += x[c];
  const float m = sum / cols;
  float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
  for (int64_t c = 0; c < cols; ++c) squares += (x[c] - m) * (x[c] - m);
  *mean = m;
  *inv = 1.0f / std::sqrt(squares / cols + eps);
}

}  // namespace

// inputs x (..., C), weight (C), bias (C), eps (); output y (..., C)
MINDVL_KERNEL(MindvlLayerNormForward) {
  const float *x = static_cast<const float *>(params[0]);
  const float *weight = static_cast<const float *>(params[1]);
  const float *bias = static_cast<const float *>(params[2]);
  const float eps = *static_cast<const float *>(params[3]);
  float *y = static_cast<float *>(params[4]);
  const mindvl::Rows r = mindvl::rows_of(ndims[0], shapes[0]);
  mindvl::parallel_rows(r.rows, [&](int64_t row) {
    const float *xr = x + row * r.cols;
    float *yr = y + row * r.cols;
    float mean, inv;
    statistics(xr, r.cols, eps, &mean, &inv);
#pragma omp simd
    for (int64_t c = 0; c < r.cols; ++c) yr[c] = (xr[c] - mean) * inv * weight[c] + bias[c];
  });
  return 0;
}

// inputs x (..., C), weight (C), eps (), dy (..., C); outputs dx (..., C), dweight (C), dbias (C)
MINDVL_KERNEL(MindvlLayerNormBackward) {
  const float *x = static_cast<const float *>(params[0]);
  const float *weight = static_cast<const float *>(params[1]);
  const float eps = *static_cast<const float *>(params[2]);
  const float *dy = static_cast<const float *>(params[3]);
  float *dx = static_cast<float *>(params[4]);
  float *dweight = static_cast<float *>(params[5]);
  float *dbias = static_cast<float *>(params[6]);
  const mindvl::Rows r = mindvl::rows_of(ndims[0], shapes[0]);
  mindvl::Pool &pool = mindvl::Pool::instance();
  mindvl::PartialSums dw(pool.size(), r.cols), db(pool.size(), r.cols);
  pool.parallel_for(r.rows, [&](int64_t begin, int64_t end, int worker) {
    float *dwp = dw.of(worker), *dbp = db.of(worker);
    for (int64_t row = begin; row < end; ++row) {
      const float *xr = x + row * r.cols, *dyr = dy + row * r.cols;
      float *dxr = dx + row * r.cols;
      float mean, inv;
      statistics(xr, r.cols, eps, &mean, &inv);
      float sum_g = 0.0f, sum_g_xhat = 0.0f;  // g = dy * weight: the gradient reaching the normalised x
#pragma omp simd reduction(+ : sum_g, sum_g_xhat)
      for (int64_t c = 0; c < r.cols; ++c) {
        const float xhat = (xr[c] - mean) * inv, g = dyr[c] * weight[c];
        sum_g += g;
        sum_g_xhat += g * xhat;
        dwp[c] += dyr[c] * xhat;
        dbp[c] += dyr[c];
      }
      const float mean_g = sum_g / r.cols, mean_g_xhat = sum_g_xhat / r.cols;
#pragma omp simd
      for (int64_t c = 0; c < r.cols; ++c) {
        const float xhat = (xr[c] - mean) * inv;
        dxr[c] = inv * (dyr[c] * weight[c] - mean_g - xhat * mean_g_xhat);
      }
    }
  });
  dw.total(dweight);
  db.total(dbias);
  return 0;
}
