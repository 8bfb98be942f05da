// The attention core, softmax(scale * Q K^T + mask) V per head, forward and backward, reading the heads in
// place from (batch, seq, heads * head_dim) projections: no transposes to (batch, heads, seq, head_dim) and
// back, no separate scale, mask and softmax kernels. (batch, head) pairs run in parallel (pool.h); the
// products are oneDNN's sgemm from the libdnnl MindSpore ships and has already loaded, one thread each.
#include <vector>

#include "common.h"
#include "pool.h"
#include "softmax.h"

extern "C" int dnnl_sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

namespace {

struct Layout {
  int64_t batch, queries, keys, heads, head_dim, width;  // width = heads * head_dim, the projections' row

  Layout(const int64_t *q_shape, const int64_t *k_shape, const int64_t *heads_shape)
      : batch(q_shape[0]), queries(q_shape[1]), keys(k_shape[1]), heads(heads_shape[0]),
        head_dim(q_shape[2] / heads_shape[0]), width(q_shape[2]) {}

  // first element of head h of batch b in a (batch, seq, width) tensor of `seq` rows
  int64_t offset(int64_t b, int64_t h, int64_t seq) const { return b * seq * width + h * head_dim; }
};

// softmax in place over each row of probs (queries x keys), after adding the mask rows of (b, h)
void softmax_rows(float *probs, const Layout &l, const mindvl::BroadcastMask &mask, int64_t b, int64_t h) {
  for (int64_t q = 0; q < l.queries; ++q) {
    float *p = probs + q * l.keys;
    if (mask.data != nullptr) {
      const float *m = mask.row(b, h, q);
      const int64_t step = mask.key_stride();
#pragma omp simd
      for (int64_t k = 0; k < l.keys; ++k) p[k] += m[k * step];
    }
    mindvl::softmax_in_place(p, l.keys);
  }
}

// inputs q (B, Q, W), k (B, K, W), v (B, K, W), [mask], scale (), heads (H,) (only its length is read);
// outputs out (B, Q, W), probs (B, H, Q, K) (kept for the backward pass)
int attention_forward(bool masked, void **params, int *ndims, int64_t **shapes) {
  const int base = masked ? 4 : 3;
  const float *q = static_cast<const float *>(params[0]);
  const float *k = static_cast<const float *>(params[1]);
  const float *v = static_cast<const float *>(params[2]);
  const float scale = *static_cast<const float *>(params[base]);
  float *out = static_cast<float *>(params[base + 2]);
  float *probs = static_cast<float *>(params[base + 3]);
  const Layout l(shapes[0], shapes[1], shapes[base + 1]);
  const mindvl::BroadcastMask mask(masked ? static_cast<const float *>(params[3]) : nullptr, masked ? ndims[3] : 0,
                                   masked ? shapes[3] : nullptr);
  mindvl::parallel_rows(l.batch * l.heads, [&](int64_t pair) {
    const int64_t b = pair / l.heads, h = pair % l.heads;
    float *p = probs + pair * l.queries * l.keys;
    dnnl_sgemm('N', 'T', l.queries, l.keys, l.head_dim, scale, q + l.offset(b, h, l.queries), l.width,
               k + l.offset(b, h, l.keys), l.width, 0.0f, p, l.keys);
    softmax_rows(p, l, mask, b, h);
    dnnl_sgemm('N', 'N', l.queries, l.head_dim, l.keys, 1.0f, p, l.keys, v + l.offset(b, h, l.keys), l.width, 0.0f,
               out + l.offset(b, h, l.queries), l.width);
  });
  return 0;
}

}  // namespace

// Two entry points: MindSpore keys a custom operator's shape inference by its function.
MINDVL_KERNEL(MindvlAttentionForward) { return attention_forward(false, params, ndims, shapes); }
MINDVL_KERNEL(MindvlMaskedAttentionForward) { return attention_forward(true, params, ndims, shapes); }

// inputs q, k, v, probs (B, H, Q, K), dout (B, Q, W), scale (), heads (H,); outputs dq, dk, dv
MINDVL_KERNEL(MindvlAttentionBackward) {
  const float *q = static_cast<const float *>(params[0]);
  const float *k = static_cast<const float *>(params[1]);
  const float *v = static_cast<const float *>(params[2]);
  const float *probs = static_cast<const float *>(params[3]);
  const float *dout = static_cast<const float *>(params[4]);
  const float scale = *static_cast<const float *>(params[5]);
  float *dq = static_cast<float *>(params[7]);
  float *dk = static_cast<float *>(params[8]);
  float *dv = static_cast<float *>(params[9]);
  const Layout l(shapes[0], shapes[1], shapes[6]);
  mindvl::Pool &pool = mindvl::Pool::instance();
  std::vector<float> scratch(pool.size() * l.queries * l.keys);  // each worker's dscores
  pool.parallel_for(l.batch * l.heads, [&](int64_t begin, int64_t end, int worker) {
    float *ds = scratch.data() + worker * l.queries * l.keys;
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / l.heads, h = pair % l.heads;
      const float *p = probs + pair * l.queries * l.keys;
      const float *qh = q + l.offset(b, h, l.queries), *kh = k + l.offset(b, h, l.keys);
      const float *vh = v + l.offset(b, h, l.keys), *doh = dout + l.offset(b, h, l.queries);
      // dprobs = dout V^T, then dscores = scale * p * (dprobs - sum(dprobs * p)) row by row
      dnnl_sgemm('N', 'T', l.queries, l.keys, l.head_dim, 1.0f, doh, l.width, vh, l.width, 0.0f, ds, l.keys);
      for (int64_t row = 0; row < l.queries; ++row) {
        const float *pr = p + row * l.keys;
        float *dr = ds + row * l.keys;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < l.keys; ++c) dot += dr[c] * pr[c];
#pragma omp simd
        for (int64_t c = 0; c < l.keys; ++c) dr[c] = scale * pr[c] * (dr[c] - dot);
      }
      dnnl_sgemm('N', 'N', l.queries, l.head_dim, l.keys, 1.0f, ds, l.keys, kh, l.width, 0.0f,
                 dq + l.offset(b, h, l.queries), l.width);
      dnnl_sgemm('T', 'N', l.keys, l.head_dim, l.queries, 1.0f, ds, l.keys, qh, l.width, 0.0f,
                 dk + l.offset(b, h, l.keys), l.width);
      dnnl_sgemm('T', 'N', l.keys, l.head_dim, l.queries, 1.0f, p, l.keys, doh, l.width, 0.0f,
                 dv + l.offset(b, h, l.keys), l.width);
    }
  });
  return 0;
}
