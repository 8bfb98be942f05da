// An INT8 weight-only Linear's product, y = x (W_int8 * scale[:, None])^T for x (M, K) float32, W (N, K) int8 and
// one float32 scale per output channel (cells/quant.py's Int8Linear). A decode step (few rows) is bound by reading
// the weights: each worker takes a share of W's rows and reads each int8 row once for all of x's rows, widening
// and multiplying in registers (g++ vectorises the loop for the build's -march: AVX-512 or AVX2), so a step reads
// a quarter of the float32 weights' bytes. More rows (a prefill) are bound by arithmetic: each worker widens a
// block of its W rows into a buffer and multiplies it with oneDNN's sgemm, as the float32 product does.
#include <vector>

#include "common.h"
#include "pool.h"

extern "C" int dnnl_sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

namespace {

constexpr int64_t kRowsPerDot = 8;  // x with fewer rows than this: one dot product per (row of x, row of W)
constexpr int64_t kBlock = 64;      // W rows widened at a time for sgemm (64 x K floats stay in L2)

float dot(const float *x, const int8_t *w, int64_t k) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = 0; t < k; ++t) sum += x[t] * static_cast<float>(w[t]);
  return sum;
}

}  // namespace

// inputs x (M, K) float32, weight (N, K) int8, scale (N,) float32; output y (M, N) float32
MINDVL_KERNEL(MindvlInt8MatMul) {
  const float *x = static_cast<const float *>(params[0]);
  const int8_t *w = static_cast<const int8_t *>(params[1]);
  const float *scale = static_cast<const float *>(params[2]);
  float *y = static_cast<float *>(params[3]);
  const int64_t m = shapes[0][0], k = shapes[0][1], n = shapes[1][0];
  mindvl::Pool &pool = mindvl::Pool::instance();
  if (m < kRowsPerDot) {
    pool.parallel_for(n, [&](int64_t begin, int64_t end, int) {
      for (int64_t j = begin; j < end; ++j) {
        for (int64_t i = 0; i < m; ++i) y[i * n + j] = dot(x + i * k, w + j * k, k) * scale[j];
      }
    });
    return 0;
  }
  pool.parallel_for(n, [&](int64_t begin, int64_t end, int) {
    std::vector<float> widened(static_cast<size_t>(std::min(kBlock, end - begin) * k));
    for (int64_t first = begin; first < end; first += kBlock) {
      const int64_t rows = std::min(kBlock, end - first);
      for (int64_t j = 0; j < rows; ++j) {
        const int8_t *row = w + (first + j) * k;
        float *out = widened.data() + j * k;
        const float s = scale[first + j];
#pragma omp simd
        for (int64_t t = 0; t < k; ++t) out[t] = static_cast<float>(row[t]) * s;
      }
      dnnl_sgemm('N', 'T', m, rows, k, 1.0f, x, k, widened.data(), k, 0.0f, y + first, n);
    }
  });
  return 0;
}
