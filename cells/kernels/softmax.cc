// The attention softmax with its scale and additive mask folded in, softmax(scale * scores + mask) over the
// last axis, forward and backward: one pass per row instead of MindSpore's Mul, Add and Softmax kernels
// (and their gradients). Used where an attention core keeps its dropout (the fused core covers the rest).
#include "common.h"
#include "pool.h"
#include "softmax.h"

namespace {

// inputs scores (B, H, Q, K), [mask broadcastable to (B, H, Q, K)], scale (); output probs (B, H, Q, K)
int softmax_forward(bool masked, void **params, int *ndims, int64_t **shapes) {
  const float *scores = static_cast<const float *>(params[0]);
  const float scale = *static_cast<const float *>(params[masked ? 2 : 1]);
  float *probs = static_cast<float *>(params[masked ? 3 : 2]);
  const int64_t *shape = shapes[0];
  const int64_t heads = shape[1], queries = shape[2], keys = shape[3];
  const mindvl::BroadcastMask mask(masked ? static_cast<const float *>(params[1]) : nullptr, masked ? ndims[1] : 0,
                                   masked ? shapes[1] : nullptr);
  mindvl::parallel_rows(shape[0] * heads * queries, [&](int64_t row) {
    const float *s = scores + row * keys;
    float *p = probs + row * keys;
    if (masked) {
      const float *m = mask.row(row / (heads * queries), (row / queries) % heads, row % queries);
      const int64_t step = mask.key_stride();
#pragma omp simd
      for (int64_t k = 0; k < keys; ++k) p[k] = s[k] * scale + m[k * step];
    } else {
#pragma omp simd
      for (int64_t k = 0; k < keys; ++k) p[k] = s[k] * scale;
    }
    mindvl::softmax_in_place(p, keys);
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
