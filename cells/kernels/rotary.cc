// The rotary embedding's "rotate half" (cells/rotary.py RotateHalf), forward and backward, for MindSpore's
// AOT custom operators on CPU: y = x * cos + (-x2, x1) * sin per head, x1 and x2 a head's two halves.
//
// The standard cell is split, negate, concatenate, two multiplies and an add, each a pass (and a copy)
// over the queries or keys; here one pass reads x once. cos and sin (batch, seq, 1, head_dim) are shared by
// the heads of a position.
#include "common.h"
#include "pool.h"

namespace {

struct Layout {
  int64_t positions, heads, dim;  // x (batch, seq, heads, head_dim) as positions x heads x dim
};

inline Layout layout_of(int rank, const int64_t *shape) {
  const mindvl::Rows r = mindvl::rows_of(rank, shape);
  const int64_t heads = rank >= 2 ? shape[rank - 2] : 1;
  return Layout{r.rows / heads, heads, r.cols};
}

// forward: y1 = x1 cos1 - x2 sin1, y2 = x2 cos2 + x1 sin2; backward (x is dy): dx1 = dy1 cos1 + dy2 sin2,
// dx2 = dy2 cos2 - dy1 sin1 (the transpose; with Rotary's equal halves, the rotation by -angle)
template <bool Backward>
void rotate(const float *x, const float *cos, const float *sin, float *y, const Layout &l) {
  const int64_t half = l.dim / 2;
  mindvl::parallel_rows(l.positions, [&](int64_t p) {
    const float *c = cos + p * l.dim, *s = sin + p * l.dim;
    for (int64_t h = 0; h < l.heads; ++h) {
      const float *xr = x + (p * l.heads + h) * l.dim;
      float *yr = y + (p * l.heads + h) * l.dim;
      if (!Backward) {
        mindvl::rotate_half(xr, c, s, yr, l.dim);
        continue;
      }
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float first = xr[i], second = xr[i + half];
        yr[i] = first * c[i] + second * s[i + half];
        yr[i + half] = second * c[i + half] - first * s[i];
      }
    }
  });
}

}  // namespace

// inputs x (..., heads, D), cos (..., 1, D), sin (..., 1, D); output y like x
MINDVL_KERNEL(MindvlRotateForward) {
  rotate<false>(static_cast<const float *>(params[0]), static_cast<const float *>(params[1]),
                static_cast<const float *>(params[2]), static_cast<float *>(params[3]), layout_of(ndims[0], shapes[0]));
  return 0;
}

// inputs dy (..., heads, D), cos, sin; output dx like dy
MINDVL_KERNEL(MindvlRotateBackward) {
  rotate<true>(static_cast<const float *>(params[0]), static_cast<const float *>(params[1]),
               static_cast<const float *>(params[2]), static_cast<float *>(params[3]), layout_of(ndims[0], shapes[0]));
  return 0;
}
