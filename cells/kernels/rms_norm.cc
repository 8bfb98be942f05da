// RMSNorm over the last axis (Llama, Qwen2, Gemma: x / sqrt(mean(x^2) + eps) * weight), forward and
// backward, for MindSpore's AOT custom operators on CPU.
//
// The standard cell is five MindSpore kernels forward (square, mean, add, rsqrt, two multiplies) and more
// backward, each a pass over the tensor; here one pass for the statistic and one for the output, rows in
// parallel (pool.h). eps arrives as a 0-d float32 tensor so one build serves every norm.
#include <cmath>

#include "common.h"
#include "pool.h"

// inputs x (..., C), weight (C), eps (); output y (..., C)
MINDVL_KERNEL(MindvlRmsNormForward) {
  const float *x = static_cast<const float *>(params[0]);
  const float *weight = static_cast<const float *>(params[1]);
  const float eps = *static_cast<const float *>(params[2]);
  float *y = static_cast<float *>(params[3]);
  const mindvl::Rows r = mindvl::rows_of(ndims[0], shapes[0]);
  mindvl::parallel_rows(r.rows,
                        [&](int64_t row) { mindvl::rms_row(x + row * r.cols, weight, y + row * r.cols, r.cols, eps); });
  return 0;
}

// inputs x (..., C), weight (C), eps (), dy (..., C); outputs dx (..., C), dweight (C)
//   g = dy * weight, dx = inv * (g - xhat * mean(g * xhat)) with xhat = x * inv, dweight = sum(dy * xhat)
MINDVL_KERNEL(MindvlRmsNormBackward) {
  const float *x = static_cast<const float *>(params[0]);
  const float *weight = static_cast<const float *>(params[1]);
  const float eps = *static_cast<const float *>(params[2]);
  const float *dy = static_cast<const float *>(params[3]);
  float *dx = static_cast<float *>(params[4]);
  float *dweight = static_cast<float *>(params[5]);
  const mindvl::Rows r = mindvl::rows_of(ndims[0], shapes[0]);
  mindvl::Pool &pool = mindvl::Pool::instance();
  mindvl::PartialSums dw(pool.size(), r.cols);
  pool.parallel_for(r.rows, [&](int64_t begin, int64_t end, int worker) {
    float *dwp = dw.of(worker);
    for (int64_t row = begin; row < end; ++row) {
      const float *xr = x + row * r.cols, *dyr = dy + row * r.cols;
      float *dxr = dx + row * r.cols;
      const float inv = mindvl::inverse_rms(xr, r.cols, eps);
      float sum_g_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_g_xhat)
      for (int64_t c = 0; c < r.cols; ++c) {
        const float xhat = xr[c] * inv;
        sum_g_xhat += dyr[c] * weight[c] * xhat;
        dwp[c] += dyr[c] * xhat;
      }
      const float mean_g_xhat = sum_g_xhat / r.cols;
#pragma omp simd
      for (int64_t c = 0; c < r.cols; ++c) dxr[c] = inv * (dyr[c] * weight[c] - xr[c] * inv * mean_g_xhat);
    }
  });
  dw.total(dweight);
  return 0;
}
