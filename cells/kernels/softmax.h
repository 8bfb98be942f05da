// What the softmax kernel and the attention core share: an additive mask broadcast to (batch, heads,
// queries, keys), and a softmax over one row in place.
#pragma once
#include <algorithm>
#include <cstdint>

#include "common.h"

namespace mindvl {

// A mask of rank <= 4 broadcast to (batch, heads, queries, keys) as numpy would: element strides per
// axis, 0 where the mask has size 1 (or lacks the axis).
struct BroadcastMask {
  const float *data = nullptr;
  int64_t strides[4] = {0, 0, 0, 0};

  BroadcastMask(const float *mask, int rank, const int64_t *shape) : data(mask) {
    int64_t stride = 1;
    for (int axis = 3; axis >= 0 && mask != nullptr; --axis) {
      const int source = axis - (4 - rank);
      const int64_t size = source >= 0 ? shape[source] : 1;
      strides[axis] = size == 1 ? 0 : stride;
      stride *= size;
    }
  }

  // row[k * key_stride()] is the mask of key k for query q of head h of batch b
  const float *row(int64_t b, int64_t h, int64_t q) const {
    return data + b * strides[0] + h * strides[1] + q * strides[2];
  }
  int64_t key_stride() const { return strides[3]; }
};

// p <- softmax(p) over n entries, the maximum subtracted first
inline void softmax_in_place(float *p, int64_t n) {
  float peak = p[0];
#pragma omp simd reduction(max : peak)  // without it the loop stays scalar (a float max is not associative)
  for (int64_t k = 1; k < n; ++k) peak = std::max(peak, p[k]);
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t k = 0; k < n; ++k) {
    p[k] = fast_exp(p[k] - peak);
    total += p[k];
  }
  const float inverse = 1.0f / total;
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) p[k] *= inverse;
}

}  // namespace mindvl
