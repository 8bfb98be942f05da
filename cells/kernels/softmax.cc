// The attention softmax with its scale and additive mask folded in, softmax(scale * scores + mask) over the
// last axis, forward and backward: one pass per row instead of MindSpore's Mul, Add and Softmax kernels
// (and their gradients).
#include <algorithm>

#include "common.h"
#include "pool.h"

namespace {

// Offset of the mask row for score row (b, h, q): a rank-4 mask broadcasts over any axis of size 1.
struct MaskRows {
  const float *data = nullptr;
  int64_t dims[4] = {1, 1, 1, 1};
  int64_t strides[4] = {0, 0, 0, 0};
  int64_t column_stride = 0;

  MaskRows(const float *mask, int rank, const int64_t *shape) : data(mask) {
    if (mask == nullptr) return;
    int64_t stride = 1;
    for (int axis = 3; axis >= 0; --axis) {  // a lower rank aligns with the last axes, as broadcasting does
      const int source = axis - (4 - rank);
      dims[axis] = source >= 0 ? shape[source] : 1;
      strides[axis] = dims[axis] == 1 ? 0 : stride;
      stride *= dims[axis];
    }
    column_stride = strides[3];
  }

  const float *row(int64_t b, int64_t h, int64_t q) const {
    return data + b * strides[0] + h * strides[1] + q * strides[2];
  }
};

// inputs scores (B, H, Q, K), [mask broadcastable to (B, H, Q, K)], scale (); output probs (B, H, Q, K)
int softmax_forward(bool masked, void **params, int *ndims, int64_t **shapes) {
  const float *scores = static_cast<const float *>(params[0]);
  const float scale = *static_cast<const float *>(params[masked ? 2 : 1]);
  float *probs = static_cast<float *>(params[masked ? 3 : 2]);
  const int64_t *shape = shapes[0];
  const int64_t heads = shape[1], queries = shape[2], keys = shape[3];
  const int64_t rows = shape[0] * heads * queries;
  const MaskRows mask(masked ? static_cast<const float *>(params[1]) : nullptr, masked ? ndims[1] : 0,
                      masked ? shapes[1] : nullptr);
  mindvl::parallel_rows(rows, [&](int64_t row) {
    const float *s = scores + row * keys;
    float *p = probs + row * keys;
    if (masked) {
      const float *m = mask.row(row / (heads * queries), (row / queries) % heads, row % queries);
      const int64_t step = mask.column_stride;
#pragma omp simd
      for (int64_t k = 0; k < keys; ++k) p[k] = s[k] * scale + m[k * step];
    } else {
#pragma omp simd
      for (int64_t k = 0; k < keys; ++k) p[k] = s[k] * scale;
    }
    float peak = p[0];
    for (int64_t k = 1; k < keys; ++k) peak = std::max(peak, p[k]);
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t k = 0; k < keys; ++k) {
      p[k] = mindvl::fast_exp(p[k] - peak);
      total += p[k];
    }
    const float inverse = 1.0f / total;
#pragma omp simd
    for (int64_t k = 0; k < keys; ++k) p[k] *= inverse;
  });
  return 0;
}

}  // namespace

// Two entry points: MindSpore keys a custom operator's shape inference by its function.
MINDVL_KERNEL(MindvlMaskedSoftmaxForward) { return softmax_forward(true, params, ndims, shapes); }
MINDVL_KERNEL(MindvlSoftmaxForward) { return softmax_forward(false, params, ndims, shapes); }

// inputs probs (B, H, Q, K), dprobs (B, H, Q, K), scale (); output dscores = scale * p * (dp - sum(dp * p))
MINDVL_KERNEL(MindvlSoftmaxBackward) {
  const float *probs = static_cast<const float *>(params[0]);
  const float *dprobs = static_cast<const float *>(params[1]);
  const float scale = *static_cast<const float *>(params[2]);
  float *dscores = static_cast<float *>(params[3]);
  const mindvl::Rows r = mindvl::rows_of(ndims[0], shapes[0]);
  mindvl::parallel_rows(r.rows, [&](int64_t row) {
    const float *p = probs + row * r.cols, *dp = dprobs + row * r.cols;
    float *ds = dscores + row * r.cols;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t k = 0; k < r.cols; ++k) dot += dp[k] * p[k];
#pragma omp simd
    for (int64_t k = 0; k < r.cols; ++k) ds[k] = scale * p[k] * (dp[k] - dot);
  });
  return 0;
}
