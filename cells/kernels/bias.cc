// A Linear's bias, y = x + bias over the rows of x, and its gradient, the column sums of dy: MindSpore 2.10
// runs the broadcast Add at a few GB/s on the CPU and the gradient as a separate ReduceSum.
#include "common.h"
#include "pool.h"

// inputs x (..., C), bias (C); output y (..., C)
MINDVL_KERNEL(MindvlBiasAdd) {
  const float *x = static_cast<const float *>(params[0]);
  const float *bias = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  const mindvl::Rows r = mindvl::rows_of(ndims[0], shapes[0]);
  mindvl::bias_rows(x, bias, y, r.rows, r.cols, [](float v) { return v; });
  return 0;
}

// input dy (..., C); output the column sums (C)
MINDVL_KERNEL(MindvlColumnSum) {
  const float *dy = static_cast<const float *>(params[0]);
  float *sums = static_cast<float *>(params[1]);
  const mindvl::Rows r = mindvl::rows_of(ndims[0], shapes[0]);
  mindvl::Pool &pool = mindvl::Pool::instance();
  mindvl::PartialSums partial(pool.size(), r.cols);
  pool.parallel_for(r.rows, [&](int64_t begin, int64_t end, int worker) {
    float *mine = partial.of(worker);
    for (int64_t row = begin; row < end; ++row) {
      const float *dyr = dy + row * r.cols;
#pragma omp simd
      for (int64_t c = 0; c < r.cols; ++c) mine[c] += dyr[c];
    }
  });
  partial.total(sums);
  return 0;
}
