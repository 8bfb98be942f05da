// Weight-only quantised Linear products, y = x W^T for x (..., K) float32 and W (N, K) stored as int8 or int4
// (cells/quant.py's layouts; how the products run: products.h).
#include "common.h"
#include "products.h"

// inputs x (..., K) float32, q (N, K) int8, scale (N, G) float32; output y (..., N) float32
MINDVL_KERNEL(MindvlInt8MatMul) {
  const mindvl::Rows x = mindvl::rows_of(ndims[0], shapes[0]);  // x (..., K): its leading axes are rows
  const mindvl::Weight w{mindvl::Weight::kInt8, params[1], static_cast<const float *>(params[2]), nullptr,
                         shapes[1][0], x.cols, shapes[2][1]};
  mindvl::multiply(w, static_cast<const float *>(params[0]), x.rows, static_cast<float *>(params[3]));
  return 0;
}

// inputs x (..., K) float32, q (N, K / 2) uint8, scale (N, K / 32) float32, minimum (N, K / 32) float32;
// output y (..., N) float32
MINDVL_KERNEL(MindvlInt4MatMul) {
  const mindvl::Rows x = mindvl::rows_of(ndims[0], shapes[0]);
  const mindvl::Weight w{mindvl::Weight::kInt4, params[1], static_cast<const float *>(params[2]),
                         static_cast<const float *>(params[3]), shapes[1][0], x.cols, x.cols / mindvl::kInt4Group};
  mindvl::multiply(w, static_cast<const float *>(params[0]), x.rows, static_cast<float *>(params[4]));
  return 0;
}
