// LayerNorm over the last axis, forward and backward, for MindSpore's AOT custom operators on CPU.
//
// MindSpore 2.10's CPU LayerNorm and its gradient are several times slower than their arithmetic needs;
// these loops do one pass for the statistics and one for the output per row, rows in parallel (OpenMP).
// Signature of an AOT kernel: inputs then outputs in `params`, their ranks and shapes alongside; returns 0.
// eps arrives as a 0-d float32 tensor so one build serves every norm (1e-6, 1e-5, 1e-12).
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

struct Rows {
  int64_t rows, cols;
};

Rows rows_of(int rank, const int64_t *shape) {
  Rows r{1, shape[rank - 1]};
  for (int i = 0; i < rank - 1; ++i) r.rows *= shape[i];
  return r;
}

// mean and 1 / sqrt(variance + eps) of one row, accumulated in double
void statistics(const float *x, int64_t cols, float eps, float *mean, float *inv) {
  double sum = 0.0;
  for (int64_t c = 0; c < cols; ++c) sum += x[c];
  const double m = sum / cols;
  double squares = 0.0;
  for (int64_t c = 0; c < cols; ++c) squares += (x[c] - m) * (x[c] - m);
  *mean = static_cast<float>(m);
  *inv = static_cast<float>(1.0 / std::sqrt(squares / cols + eps));
}

}  // namespace

// inputs x (..., C), weight (C), bias (C), eps (); output y (..., C)
extern "C" int MindvlLayerNormForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                      void *stream, void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  const float *weight = static_cast<const float *>(params[1]);
  const float *bias = static_cast<const float *>(params[2]);
  const float eps = *static_cast<const float *>(params[3]);
  float *y = static_cast<float *>(params[4]);
  const Rows r = rows_of(ndims[0], shapes[0]);
#pragma omp parallel for
  for (int64_t row = 0; row < r.rows; ++row) {
    const float *xr = x + row * r.cols;
    float *yr = y + row * r.cols;
    float mean, inv;
    statistics(xr, r.cols, eps, &mean, &inv);
    for (int64_t c = 0; c < r.cols; ++c) yr[c] = (xr[c] - mean) * inv * weight[c] + bias[c];
  }
  return 0;
}

// inputs x (..., C), weight (C), eps (), dy (..., C); outputs dx (..., C), dweight (C), dbias (C)
extern "C" int MindvlLayerNormBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                       void *stream, void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  const float *weight = static_cast<const float *>(params[1]);
  const float eps = *static_cast<const float *>(params[2]);
  const float *dy = static_cast<const float *>(params[3]);
  float *dx = static_cast<float *>(params[4]);
  float *dweight = static_cast<float *>(params[5]);
  float *dbias = static_cast<float *>(params[6]);
  const Rows r = rows_of(ndims[0], shapes[0]);
  for (int64_t c = 0; c < r.cols; ++c) dweight[c] = dbias[c] = 0.0f;
#pragma omp parallel
  {
    std::vector<double> dw(r.cols, 0.0), db(r.cols, 0.0);  // this thread's share of the parameter gradients
#pragma omp for
    for (int64_t row = 0; row < r.rows; ++row) {
      const float *xr = x + row * r.cols, *dyr = dy + row * r.cols;
      float *dxr = dx + row * r.cols;
      float mean, inv;
      statistics(xr, r.cols, eps, &mean, &inv);
      double sum_g = 0.0, sum_g_xhat = 0.0;  // g = dy * weight: the gradient reaching the normalised x
      for (int64_t c = 0; c < r.cols; ++c) {
        const float xhat = (xr[c] - mean) * inv, g = dyr[c] * weight[c];
        sum_g += g;
        sum_g_xhat += g * xhat;
        dw[c] += dyr[c] * xhat;
        db[c] += dyr[c];
      }
      const float mean_g = static_cast<float>(sum_g / r.cols), mean_g_xhat = static_cast<float>(sum_g_xhat / r.cols);
      for (int64_t c = 0; c < r.cols; ++c) {
        const float xhat = (xr[c] - mean) * inv;
        dxr[c] = inv * (dyr[c] * weight[c] - mean_g - xhat * mean_g_xhat);
      }
    }
#pragma omp critical
    for (int64_t c = 0; c < r.cols; ++c) {
      dweight[c] += static_cast<float>(dw[c]);
      dbias[c] += static_cast<float>(db[c]);
    }
  }
  return 0;
}
