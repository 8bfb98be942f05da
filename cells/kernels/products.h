// Products of float32 activations with a weight W (N, K) stored as float32 or weight-only quantised in groups of
// K / G consecutive inputs per output row (cells/quant.py), y = x W^T, shared by the quantised Linear kernels
// (quantized_matmul.cc) and the decode step of a decoder block (decoder_step.cc):
//   int8  W[j, t] = q[j, t] * scale[j, g]                 q int8 (N, K), scale (N, G); G = 1 is per channel
//   int4  W[j, t] = q[j, t] * scale[j, g] + minimum[j, g]  q in 0..15, two per byte (N, K / 2): in each group of
//         32 inputs, byte b holds input b in its low nibble and input b + 16 in its high one; scale, minimum (N, G)
// Few rows of x (a decode step, a batch of streams: fewer than kRowsPerDot) are bound by reading the weights: each
// worker takes a share of W's rows and reads each row once for all of x's rows. Widening the weights to
// float32 in registers made the products compute-bound (0.12 ns a weight for int8, 0.15 for int4 on one Zen 4
// core: the int4 LM head 19 ms a step), so, as llama.cpp does, each row of x is itself quantised to int8 per group
// of 32 inputs (scale max|x| / 127) and a group's 32 products are summed exactly in integers (AVX2's maddubs, or
// AVX-512 VNNI's dpbusd where the build's -march has it), then scaled in float32 into 8 running lanes: no
// horizontal sum per group. The error this adds is at most sum_g (x's scale_g / 2) sum_t |W[j, t]| per output
// (tests/cells/test_kernels.py checks that bound); the integer sums are exact, so the AVX2 and the AVX-512 builds
// give the same bits. A row of K not in groups of 32 keeps float32 activations. More rows (a prefill) are bound by
// arithmetic: each worker widens a block of its W rows and multiplies it with oneDNN's sgemm in float32, as the
// float32 product does.
#pragma once
#include <algorithm>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MINDVL_INTEGER_DOTS 1
#endif

#include "common.h"
#include "pool.h"

extern "C" int dnnl_sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

namespace mindvl {

constexpr int64_t kRowsPerDot = 32;  // x with fewer rows than this: dot products per (row of x, row of W)
constexpr int64_t kBlock = 64;      // W rows widened at a time for sgemm (64 x K floats stay in L2)
constexpr int64_t kInt4Group = 32;
// A decode product of fewer weights runs on the calling thread alone: waking a worker cost more than it saved
// (a 2048 x 640 int8 product 64 us on two threads, 40 on one; the 262,144-row LM head halves on two)
constexpr int64_t kInlineWeights = int64_t{1} << 21;

inline float dot(const float *x, const int8_t *w, int64_t k) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = 0; t < k; ++t) sum += x[t] * static_cast<float>(w[t]);
  return sum;
}

// The rows of x quantised to int8 per group of 32 inputs: q (M, K), scale and the float32 sums of x (M, K / 32).
// `paired` orders q as the int4 weights' bytes read two groups at once: for groups g, g + 1 (g even), inputs 0-15
// of g then of g + 1, then inputs 16-31 of g then of g + 1, so a 32-byte load of low nibbles (or of high ones)
// meets its inputs in place.
struct Activations {
  std::vector<int8_t> q;
  std::vector<float> scale, sum;
  int64_t k = 0, groups = 0;

  Activations(const float *x, int64_t m, int64_t width, bool paired = false)
      : k(width), groups(width / kInt4Group) {
    q.resize(static_cast<size_t>(m * k));
    scale.resize(static_cast<size_t>(m * groups));
    sum.resize(static_cast<size_t>(m * groups));
    constexpr int64_t kHalf = kInt4Group / 2;
    for (int64_t r = 0; r < m * groups; ++r) {
      const float *xg = x + r * kInt4Group;
      float peak = 0.0f, total_x = 0.0f;
      for (int64_t t = 0; t < kInt4Group; ++t) {
        peak = std::max(peak, std::fabs(xg[t]));
        total_x += xg[t];
      }
      const float d = peak / 127.0f, inverse = peak > 0.0f ? 127.0f / peak : 0.0f;
      const int64_t g = r % groups, pair_start = (r - g) * kInt4Group + (g & ~int64_t{1}) * kInt4Group;
      const bool in_pair = paired && (g | 1) < groups;
      for (int64_t t = 0; t < kInt4Group; ++t) {
        const int64_t at = in_pair ? pair_start + (t / kHalf) * kInt4Group + (g & 1) * kHalf + t % kHalf
                                   : r * kInt4Group + t;
        q[at] = static_cast<int8_t>(std::nearbyint(xg[t] * inverse));
      }
      scale[r] = d;
      sum[r] = total_x;
    }
  }
  const int8_t *row(int64_t i) const { return q.data() + i * k; }
  const float *row_scale(int64_t i) const { return scale.data() + i * groups; }
  const float *row_sum(int64_t i) const { return sum.data() + i * groups; }
};

#ifdef MINDVL_INTEGER_DOTS
// 8 int32 lanes, lane l = sum of u[4l..4l+3] * s[4l..4l+3] (u unsigned, s signed bytes)
inline __m256i dot_bytes(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));  // pairs <= 2 * 127 * 127: no saturation
#endif
}

inline float lanes_total(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  return _mm_cvtss_f32(_mm_add_ss(sum, _mm_movehdup_ps(sum)));
}

// 32 signed weight bytes against 32 activation bytes: |w| times x with w's sign
inline __m256i signed_dot(const int8_t *w, const int8_t *x) {
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x));
  return dot_bytes(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
}
#endif

// One row of an int8 W against activations row i: per channel (groups 1), or in groups of 32 or 16 inputs.
inline float int8_dot(const Activations &a, int64_t i, const int8_t *w, const float *scale, int64_t groups) {
  const int8_t *xq = a.row(i);
  const float *dx = a.row_scale(i);
  const int64_t size = a.k / groups;
#ifdef MINDVL_INTEGER_DOTS
  __m256 acc = _mm256_setzero_ps();
  for (int64_t g = 0; g < a.groups; ++g) {
    const __m256 sums = _mm256_cvtepi32_ps(signed_dot(w + g * kInt4Group, xq + g * kInt4Group));
    __m256 factor;
    if (groups == 1) {
      factor = _mm256_set1_ps(dx[g]);
    } else if (size == kInt4Group) {
      factor = _mm256_set1_ps(dx[g] * scale[g]);
    } else {  // groups of 16: lanes 0-3 hold inputs 0-15, lanes 4-7 inputs 16-31
      factor = _mm256_set_m128(_mm_set1_ps(dx[g] * scale[2 * g + 1]), _mm_set1_ps(dx[g] * scale[2 * g]));
    }
    acc = _mm256_fmadd_ps(sums, factor, acc);
  }
  return lanes_total(acc) * (groups == 1 ? scale[0] : 1.0f);
#else
  float total_y = 0.0f;
  for (int64_t t = 0; t < a.k; ++t) {
    const float s = groups == 1 ? scale[0] : scale[t / size];
    total_y += static_cast<float>(static_cast<int32_t>(xq[t]) * w[t]) * dx[t / kInt4Group] * s;
  }
  return total_y;
#endif
}

// One row of an int4 W against activations row i: sum_g scale_g * dx_g * sum_t xq_t q_t + minimum_g * sum_t x_t.
inline float int4_dot(const Activations &a, int64_t i, const uint8_t *q, const float *scale, const float *minimum) {
  const int8_t *xq = a.row(i);
  const float *dx = a.row_scale(i), *x_sums = a.row_sum(i);
  float offset = 0.0f;
  for (int64_t g = 0; g < a.groups; ++g) offset += minimum[g] * x_sums[g];
  constexpr int64_t kHalf = kInt4Group / 2;
  int64_t g = 0;
#ifdef MINDVL_INTEGER_DOTS
  const __m256i nibble = _mm256_set1_epi8(15);
  __m256 acc = _mm256_setzero_ps();
  for (; g + 1 < a.groups; g += 2) {  // two groups a step: lanes 0-3 sum group g, lanes 4-7 group g + 1
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + g * kHalf));
    const __m256i low = _mm256_and_si256(bytes, nibble), high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
    const int8_t *x_pair = xq + g * kInt4Group;  // paired order (Activations)
    const __m256i sums = _mm256_add_epi32(
        dot_bytes(low, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x_pair))),
        dot_bytes(high, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x_pair + kInt4Group))));
    const __m256 factor = _mm256_set_m128(_mm_set1_ps(dx[g + 1] * scale[g + 1]), _mm_set1_ps(dx[g] * scale[g]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), factor, acc);
  }
  offset += lanes_total(acc);
#else
  for (; g + 1 < a.groups; g += 2) {
    for (int64_t half = 0; half < 2; ++half) {
      int32_t sum = 0;
      for (int64_t b = 0; b < kHalf; ++b) {
        const uint8_t byte = q[(g + half) * kHalf + b];
        sum += (byte & 15) * xq[g * kInt4Group + half * kHalf + b] +
               (byte >> 4) * xq[g * kInt4Group + kInt4Group + half * kHalf + b];
      }
      offset += static_cast<float>(sum) * dx[g + half] * scale[g + half];
    }
  }
#endif
  for (; g < a.groups; ++g) {  // an odd last group, in plain order
    int32_t sum = 0;
    for (int64_t b = 0; b < kHalf; ++b) {
      const uint8_t byte = q[g * kHalf + b];
      sum += (byte & 15) * xq[g * kInt4Group + b] + (byte >> 4) * xq[g * kInt4Group + b + kHalf];
    }
    offset += static_cast<float>(sum) * dx[g] * scale[g];
  }
  return offset;
}

// Row j of an int8 W as float32.
struct Int8Rows {
  const int8_t *q;
  const float *scale;
  int64_t k, groups;

  void widen(int64_t j, float *out) const {
    const int64_t size = k / groups;
    const int8_t *row = q + j * k;
    for (int64_t g = 0; g < groups; ++g) {
      const float s = scale[j * groups + g];
#pragma omp simd
      for (int64_t t = 0; t < size; ++t) out[g * size + t] = static_cast<float>(row[g * size + t]) * s;
    }
  }
};

// Row j of an int4 W as float32.
struct Int4Rows {
  const uint8_t *q;
  const float *scale, *minimum;
  int64_t k, groups;

  void widen(int64_t j, float *out) const {
    const uint8_t *row = q + j * (k / 2);
    for (int64_t g = 0; g < groups; ++g) {
      const float s = scale[j * groups + g], m = minimum[j * groups + g];
      const uint8_t *bytes = row + g * (kInt4Group / 2);
      float *low = out + g * kInt4Group, *high = low + kInt4Group / 2;
#pragma omp simd
      for (int64_t b = 0; b < kInt4Group / 2; ++b) {
        low[b] = static_cast<float>(bytes[b] & 15) * s + m;
        high[b] = static_cast<float>(bytes[b] >> 4) * s + m;
      }
    }
  }
};

// y (m, n) = x (m, k) W^T: `dot(i, j)` x's row i against W's row j at decode, W's rows widened by `rows` into sgemm
// otherwise.
template <class Rows, class Dot>
void product(const float *x, const Rows &rows, const Dot &dot_row, float *y, int64_t m, int64_t n, int64_t k,
             int64_t inline_weights = kInlineWeights) {
  Pool &pool = Pool::instance();
  if (m < kRowsPerDot) {
    const auto rows_of_w = [&](int64_t begin, int64_t end, int) {
      for (int64_t j = begin; j < end; ++j) {
        for (int64_t i = 0; i < m; ++i) y[i * n + j] = dot_row(i, j);
      }
    };
    if (n * k < inline_weights) {
      rows_of_w(0, n, 0);
    } else {
      pool.parallel_for(n, rows_of_w);
    }
    return;
  }
  pool.parallel_for(n, [&](int64_t begin, int64_t end, int) {
    std::vector<float> widened(static_cast<size_t>(std::min(kBlock, end - begin) * k));
    for (int64_t first = begin; first < end; first += kBlock) {
      const int64_t count = std::min(kBlock, end - first);
      for (int64_t j = 0; j < count; ++j) rows.widen(first + j, widened.data() + j * k);
      dnnl_sgemm('N', 'T', m, count, k, 1.0f, x, k, widened.data(), k, 0.0f, y + first, n);
    }
  });
}

inline float float_dot(const float *x, const float *w, int64_t k) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = 0; t < k; ++t) sum += x[t] * w[t];
  return sum;
}

// Row j of a float32 W as it is.
struct FloatRows {
  const float *w;
  int64_t k;

  void widen(int64_t j, float *out) const { std::memcpy(out, w + j * k, static_cast<size_t>(k) * sizeof(float)); }
};

// One product's weight as a kernel receives it: float32 (N, K), or a quantised layout above.
struct Weight {
  enum Kind { kFloat, kInt8, kInt4 } kind = kFloat;
  const void *data = nullptr;  // W, q
  const float *scale = nullptr, *minimum = nullptr;
  int64_t n = 0, k = 0, groups = 1;
};

// y (m, n) = x (m, k) W^T; a decode product of fewer than `inline_weights` weights runs on the calling thread alone
inline void multiply(const Weight &w, const float *x, int64_t m, float *y, int64_t inline_weights = kInlineWeights) {
  const int64_t n = w.n, k = w.k, groups = w.groups;
  if (w.kind == Weight::kFloat) {
    const float *weights = static_cast<const float *>(w.data);
    product(x, FloatRows{weights, k}, [&](int64_t i, int64_t j) { return float_dot(x + i * k, weights + j * k, k); },
            y, m, n, k, inline_weights);
    return;
  }
  if (w.kind == Weight::kInt4) {
    const Int4Rows rows{static_cast<const uint8_t *>(w.data), w.scale, w.minimum, k, groups};
    const Activations a(x, m < kRowsPerDot ? m : 0, k, true);
    product(x, rows, [&](int64_t i, int64_t j) {
      return int4_dot(a, i, rows.q + j * (k / 2), rows.scale + j * groups, rows.minimum + j * groups);
    }, y, m, n, k, inline_weights);
    return;
  }
  const int8_t *q = static_cast<const int8_t *>(w.data);
  const Int8Rows rows{q, w.scale, k, groups};
  const int64_t size = k / groups;
  const bool integer = m < kRowsPerDot && k % kInt4Group == 0 && (groups == 1 || size == 32 || size == 16);
  if (!integer) {  // float32 activations: a row of K not in groups of 32, or another group size
    product(x, rows, [&](int64_t i, int64_t j) {
      float sum = 0.0f;
      for (int64_t g = 0; g < groups; ++g) sum += dot(x + i * k + g * size, q + j * k + g * size, size) * w.scale[j * groups + g];
      return sum;
    }, y, m, n, k, inline_weights);
    return;
  }
  const Activations a(x, m, k);
  product(x, rows, [&](int64_t i, int64_t j) { return int8_dot(a, i, q + j * k, w.scale + j * groups, groups); }, y, m, n, k, inline_weights);
}

}  // namespace mindvl
