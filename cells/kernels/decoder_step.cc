// A pre-norm decoder block over new tokens as one kernel, for generation: a decode step (TransformerBlock.
// construct_cached with `beside`, cells/transformer.py: the caches only read, the step's own key and value rows
// returned for the caller to write) and a prefill (construct_keys: the prompt's tokens attend to each other under
// the causal mask, no cache) for the blocks of Llama, Qwen2 and Gemma: RMSNorms, q/k/v products, optional per-head q
// and k norms (Gemma 3), the rotary rotation, grouped-query attention over the cache beside the step's own key, the
// output product, optional sandwich norms (Gemma 2 / 3), the residuals and a gated MLP (GELU-tanh or SiLU); each
// product's weight float32, int8 or int4 (products.h). Why one kernel: a decode step of Gemma 3 270M ran ~28
// MindSpore kernels a block and MindSpore's runtime spends ~10-13 us between two kernels of a graph, ~40% of the
// step; and each graph node costs MindSpore's compiler ~0.3 MB (the prefill graph's compile set generation's peak
// memory). Inference only: no backward; training and exports keep the standard block.
//
// inputs, in this order (cells/kernels/cpu.py FusedDecodeStep and TransformerBlock.step_tensors build them):
//   x (batch, steps, width); mask (batch, 1, steps, cache_len) over the cache, additive, the steps' own slots
//   blocked; own (batch, 1, steps, steps) additive over the steps' own keys; cos, sin (batch, steps, 1, head_dim);
//   cache_k, cache_v (batch, cache_len, kv_heads * head_dim); settings (kSettings floats, below);
//   norm1 (width); q_norm, k_norm (head_dim) with qk_norm; the q, k, v and out products; post_attn_norm (width) when
//   sandwiched; norm2 (width); the gate, up and down products; post_mlp_norm (width) when sandwiched. A product is
//   W float32 (N, K) | q int8 (N, K), scale (N, G) | q uint8 (N, K / 2), scale, minimum (N, K / 32), then its bias
//   (N) when it has one.
// outputs y (batch, steps, width); k, v (batch, steps, kv_heads * head_dim): the steps' keys (normed, rotated) and
// values.
#include <algorithm>
#include <vector>

#include "common.h"
#include "pool.h"
#include "products.h"

namespace {

// settings: eps, scale, heads, kv_heads, head_dim, qk_norm, sandwich, activation (Activation), then for each of
// the seven products (q, k, v, out, gate, up, down) its kind (mindvl::Weight::Kind) and whether it has a bias
enum Activation { kGeluTanh = 0, kSilu = 1 };
// An additive mask entry at or below cells/masks.py's MASK_VALUE blocks its key: its weight is exactly 0, as
// e^(MASK_VALUE + score - max) is in float32, so the key is not read at all. A query that sees no key (a prompt's
// padding) weighs them all, as the standard softmax does; -inf (the slot a prefill's absent cache stands in) stays 0.
constexpr float kBlocked = -1e4f;

// Within a step the pool spins (Pool::Hot), so a product (or the attention) of this many weights or more is worth
// both threads: Gemma 3 270M's int8 / int4 decode 48-50 / 45-51 -> 56-69 / 52-65 tokens/s (benchmarks/generate.py,
// interleaved rounds on a noisy 2-vCPU host), where with sleeping workers only the LM head took two.
constexpr int64_t kInlineWeights = int64_t{1} << 16;

struct Product {
  mindvl::Weight w;
  const float *bias = nullptr;

  // y (m, n) = x (m, k) W^T + bias
  void apply(const float *x, int64_t m, float *y) const {
    mindvl::multiply(w, x, m, y, kInlineWeights);
    if (bias == nullptr) return;
    for (int64_t i = 0; i < m; ++i) {
#pragma omp simd
      for (int64_t j = 0; j < w.n; ++j) y[i * w.n + j] += bias[j];
    }
  }
};

// The kernel's inputs read in order.
class Inputs {
 public:
  Inputs(void **params, int64_t **shapes, const float *settings)
      : params_(params), shapes_(shapes), settings_(settings) {}

  const float *next() { return static_cast<const float *>(params_[at_++]); }

  // the product with settings index `index` taking k inputs
  Product product(int index, int64_t k) {
    Product p;
    p.w.kind = static_cast<mindvl::Weight::Kind>(static_cast<int>(settings_[8 + 2 * index]));
    p.w.data = params_[at_];
    p.w.n = shapes_[at_][0];
    p.w.k = k;
    ++at_;
    if (p.w.kind != mindvl::Weight::kFloat) {
      p.w.groups = shapes_[at_][1];
      p.w.scale = next();
      if (p.w.kind == mindvl::Weight::kInt4) p.w.minimum = next();
    }
    if (settings_[9 + 2 * index] != 0.0f) p.bias = next();
    return p;
  }

 private:
  void **params_;
  int64_t **shapes_;
  const float *settings_;
  int at_ = 8;  // after x, mask, own, cos, sin, cache_k, cache_v, settings
};

// RMSNorm over rows of `cols` (in place is fine)
void rms_rows(const float *x, const float *weight, float *y, int64_t rows, int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; ++r) mindvl::rms_row(x + r * cols, weight, y + r * cols, cols, eps);
}

inline float gelu_tanh(float x) {  // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), tanh from e^(-2|z|)
  const float z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const float e = mindvl::fast_exp(-2.0f * std::fabs(z));
  const float t = (1.0f - e) / (1.0f + e);
  return 0.5f * x * (1.0f + (z < 0.0f ? -t : t));
}

inline float silu(float x) {  // x sigmoid(x), from e^(-|x|)
  const float e = mindvl::fast_exp(-std::fabs(x));
  return x >= 0.0f ? x / (1.0f + e) : x * e / (1.0f + e);
}

struct Attention {
  int64_t heads, kv_heads, dim, cache_len, steps;
  float scale;

  // out (dim) = softmax over the cache's slots and the steps' own keys of scale q.k + their masks, times the values;
  // keys blocked by their mask are not read, unless every key is (a padding query: then, as the standard softmax,
  // all of them); scores: cache_len + steps floats of scratch
  void head(const float *q, const float *keys, const float *values, const float *own_k, const float *own_v,
            const float *mask, const float *own_mask, float *out, float *scores) const {
    const int64_t stride = kv_heads * dim;
    bool any = false;
    for (int64_t s = 0; s < cache_len && !any; ++s) any = mask[s] > kBlocked;
    for (int64_t j = 0; j < steps && !any; ++j) any = own_mask[j] > kBlocked;
    const auto read = [&](float m) { return !any || m > kBlocked; };
    float top = -3.0e38f;
    for (int64_t s = 0; s < cache_len; ++s) {
      if (!read(mask[s])) continue;
      scores[s] = scale * mindvl::float_dot(q, keys + s * stride, dim) + mask[s];
      top = std::max(top, scores[s]);
    }
    for (int64_t j = 0; j < steps; ++j) {
      if (!read(own_mask[j])) continue;
      scores[cache_len + j] = scale * mindvl::float_dot(q, own_k + j * stride, dim) + own_mask[j];
      top = std::max(top, scores[cache_len + j]);
    }
    float total = 0.0f;
    std::fill(out, out + dim, 0.0f);
    for (int64_t s = 0; s < cache_len + steps; ++s) {
      if (!read(s < cache_len ? mask[s] : own_mask[s - cache_len])) continue;
      const float weight = mindvl::fast_exp(scores[s] - top);
      total += weight;
      const float *v = s < cache_len ? values + s * stride : own_v + (s - cache_len) * stride;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) out[d] += weight * v[d];
    }
    const float inverse = 1.0f / total;
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d) out[d] *= inverse;
  }
};

}  // namespace

MINDVL_KERNEL(MindvlDecoderStep) {
  const float *x = static_cast<const float *>(params[0]);
  const float *mask = static_cast<const float *>(params[1]);
  const float *own_mask = static_cast<const float *>(params[2]);
  const float *cos = static_cast<const float *>(params[3]);
  const float *sin = static_cast<const float *>(params[4]);
  const float *cache_k = static_cast<const float *>(params[5]);
  const float *cache_v = static_cast<const float *>(params[6]);
  const float *settings = static_cast<const float *>(params[7]);
  const int64_t batch = shapes[0][0], steps = shapes[0][1], width = shapes[0][2], m = batch * steps;
  const float eps = settings[0];
  const Attention attention{static_cast<int64_t>(settings[2]), static_cast<int64_t>(settings[3]),
                            static_cast<int64_t>(settings[4]), shapes[1][3], steps, settings[1]};
  const bool qk_norm = settings[5] != 0.0f, sandwich = settings[6] != 0.0f;
  const int activation = static_cast<int>(settings[7]);
  const int64_t dim = attention.dim, inner = attention.heads * dim, kv_width = attention.kv_heads * dim;
  const int64_t group = attention.heads / attention.kv_heads;

  const mindvl::Pool::Hot hot;
  Inputs in(params, shapes, settings);
  const float *norm1 = in.next();
  const float *q_norm = qk_norm ? in.next() : nullptr;
  const float *k_norm = qk_norm ? in.next() : nullptr;
  const Product q_proj = in.product(0, width), k_proj = in.product(1, width), v_proj = in.product(2, width);
  const Product out_proj = in.product(3, inner);
  const float *post_attn_norm = sandwich ? in.next() : nullptr;
  const float *norm2 = in.next();
  const Product gate = in.product(4, width), up = in.product(5, width);
  const int64_t hidden = gate.w.n;
  const Product down = in.product(6, hidden);
  const float *post_mlp_norm = sandwich ? in.next() : nullptr;
  float *y = static_cast<float *>(params[nparam - 3]);
  float *k = static_cast<float *>(params[nparam - 2]);
  float *v = static_cast<float *>(params[nparam - 1]);

  // attention
  std::vector<float> h(m * width), q(m * inner), attended(m * inner), branch(m * std::max(width, hidden));
  rms_rows(x, norm1, h.data(), m, width, eps);
  q_proj.apply(h.data(), m, q.data());
  k_proj.apply(h.data(), m, k);
  v_proj.apply(h.data(), m, v);
  if (qk_norm) {
    rms_rows(q.data(), q_norm, q.data(), m * attention.heads, dim, eps);
    rms_rows(k, k_norm, k, m * attention.kv_heads, dim, eps);
  }
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t head = 0; head < attention.heads; ++head) mindvl::rotate_half(
        q.data() + r * inner + head * dim, cos + r * dim, sin + r * dim, q.data() + r * inner + head * dim, dim);
    for (int64_t head = 0; head < attention.kv_heads; ++head) mindvl::rotate_half(
        k + r * kv_width + head * dim, cos + r * dim, sin + r * dim, k + r * kv_width + head * dim, dim);
  }
  mindvl::Pool &pool = mindvl::Pool::instance();
  const int64_t cache_len = attention.cache_len;
  const auto heads_of_rows = [&](int64_t begin, int64_t end, int) {
    std::vector<float> scores(cache_len + steps);
    for (int64_t item = begin; item < end; ++item) {  // item: row r (batch b, step i), query head
      const int64_t r = item / attention.heads, head = item % attention.heads, kv = head / group;
      const int64_t b = r / steps;
      const int64_t cached = b * cache_len * kv_width + kv * dim, own = b * steps * kv_width + kv * dim;
      attention.head(q.data() + r * inner + head * dim, cache_k + cached, cache_v + cached, k + own, v + own,
                     mask + r * cache_len, own_mask + r * steps, attended.data() + r * inner + head * dim,
                     scores.data());
    }
  };
  // a few heads over a short cache run on this thread alone, as a small product does
  if (m * attention.heads * (cache_len + steps) * dim < kInlineWeights) {
    heads_of_rows(0, m * attention.heads, 0);
  } else {
    pool.parallel_for(m * attention.heads, heads_of_rows);
  }
  float *residual = h.data();  // x + the attention's branch (h is not read again)
  out_proj.apply(attended.data(), m, branch.data());
  if (sandwich) rms_rows(branch.data(), post_attn_norm, branch.data(), m, width, eps);
  for (int64_t i = 0; i < m * width; ++i) residual[i] = x[i] + branch[i];

  // MLP: down(act(gate(norm2(residual))) * up(...))
  std::vector<float> normed(m * width), gated(m * hidden), upped(m * hidden);
  rms_rows(residual, norm2, normed.data(), m, width, eps);
  gate.apply(normed.data(), m, gated.data());
  up.apply(normed.data(), m, upped.data());
  if (activation == kSilu) {
#pragma omp simd
    for (int64_t i = 0; i < m * hidden; ++i) gated[i] = silu(gated[i]) * upped[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < m * hidden; ++i) gated[i] = gelu_tanh(gated[i]) * upped[i];
  }
  down.apply(gated.data(), m, branch.data());
  if (sandwich) rms_rows(branch.data(), post_mlp_norm, branch.data(), m, width, eps);
  for (int64_t i = 0; i < m * width; ++i) y[i] = residual[i] + branch[i];
  return 0;
}
