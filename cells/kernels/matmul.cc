// A Linear's product, y = x W^T for x (M, K) and W (N, K), and its gradients dx = dy W and dW = dy^T x,
// with oneDNN's sgemm (the libdnnl MindSpore ships and has loaded), one call per worker of the pool
// (pool.h) on its share of the rows (of W when x has fewer rows than there are workers). MindSpore 2.10's CPU MatMul runs the same sgemm but alternates between
// about one and about two cores' worth from call to call on a 2-vCPU machine (its median 1.2-1.9x its best,
// issue 22); one single-threaded call per worker keeps every core busy on every call.
#include "common.h"
#include "pool.h"

extern "C" int dnnl_sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

// inputs x (M, K), weight (N, K); output y (M, N)
MINDVL_KERNEL(MindvlMatMul) {
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  const int64_t m = shapes[0][0], k = shapes[0][1], n = shapes[1][0];
  mindvl::Pool &pool = mindvl::Pool::instance();
  if (m < pool.size()) {  // fewer rows than workers (a decode step): each worker takes a share of W's rows
    pool.parallel_for(n, [&](int64_t begin, int64_t end, int) {
      dnnl_sgemm('N', 'T', m, end - begin, k, 1.0f, x, k, w + begin * k, k, 0.0f, y + begin, n);
    });
    return 0;
  }
  pool.parallel_for(m, [&](int64_t begin, int64_t end, int) {
    dnnl_sgemm('N', 'T', end - begin, n, k, 1.0f, x + begin * k, k, w, k, 0.0f, y + begin * n, n);
  });
  return 0;
}

// inputs x (M, K), weight (N, K), dy (M, N); outputs dx (M, K) over the rows of x, dweight (N, K) over the
// rows of the weight
MINDVL_KERNEL(MindvlMatMulBackward) {
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float *dy = static_cast<const float *>(params[2]);
  float *dx = static_cast<float *>(params[3]);
  float *dw = static_cast<float *>(params[4]);
  const int64_t m = shapes[0][0], k = shapes[0][1], n = shapes[1][0];
  mindvl::Pool &pool = mindvl::Pool::instance();
  pool.parallel_for(m, [&](int64_t begin, int64_t end, int) {
    dnnl_sgemm('N', 'N', end - begin, k, n, 1.0f, dy + begin * n, n, w, k, 0.0f, dx + begin * k, k);
  });
  pool.parallel_for(n, [&](int64_t begin, int64_t end, int) {
    dnnl_sgemm('T', 'N', end - begin, k, m, 1.0f, dy + begin, n, x, k, 0.0f, dw + begin * k, k);
  });
  return 0;
}
