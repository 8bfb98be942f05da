// The kernels' own worker threads. Not OpenMP: MindSpore loads libgomp at import with its default wait
// policy, under which idle OpenMP threads spin after every parallel region and starve MindSpore's own
// kernel threads on the same cores (a train step ran 2x slower with OpenMP kernels than with none). These
// workers sleep on a condition variable between calls, except while a Pool::Hot is alive (and kHotGrace after):
// then workers and caller spin, as a decoder block's fused step calls the pool a dozen times within a few hundred
// microseconds and a sleeping thread took ~20-40 us to wake on a shared 2-vCPU host.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mindvl {

class Pool {
 public:
  // body(begin, end, worker) over [0, n) in `size()` contiguous chunks, worker in [0, size()); the caller
  // runs chunk 0. A call that finds the pool busy (another kernel running concurrently) runs inline.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)> &body) {
    const int chunks = static_cast<int>(std::min<int64_t>(size(), n));
    std::unique_lock<std::mutex> dispatch(dispatch_, std::try_to_lock);
    if (chunks <= 1 || !dispatch.owns_lock()) {
      body(0, n, 0);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      body_ = &body;
      total_ = n;
      chunks_ = chunks;
      pending_ = chunks - 1;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    body(0, chunk_end(0), 0);
    while (spinning() && pending_.load(std::memory_order_acquire) != 0) pause();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // While one lives (and kHotGrace after the last ends), the pool's threads spin between calls instead of sleeping.
  class Hot {
   public:
    Hot() : pool_(instance()) { pool_.hot_.fetch_add(1, std::memory_order_acq_rel); }
    ~Hot() {
      pool_.cool_at_.store(now_ns() + kHotGrace, std::memory_order_release);
      pool_.hot_.fetch_sub(1, std::memory_order_acq_rel);
    }
    Hot(const Hot &) = delete;
    Hot &operator=(const Hot &) = delete;

   private:
    Pool &pool_;
  };

  static Pool &instance() {
    static Pool pool;
    return pool;
  }

 private:
  Pool() {
    int threads = static_cast<int>(std::thread::hardware_concurrency());
    if (const char *wanted = std::getenv("MINDVL_KERNEL_THREADS")) threads = std::atoi(wanted);
    for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, i] { work(i); });
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto &worker : workers_) worker.join();
  }

  // the gap a Hot leaves for the next one: the MindSpore kernels between two fused steps of a decode graph
  static constexpr int64_t kHotGrace = 300000;  // ns

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  bool spinning() const {
    return hot_.load(std::memory_order_acquire) > 0 || now_ns() < cool_at_.load(std::memory_order_acquire);
  }

  int64_t chunk_end(int chunk) const { return total_ * (chunk + 1) / chunks_; }

  void work(int index) {
    uint64_t seen = 0;
    for (;;) {
      while (!stopping_.load(std::memory_order_acquire) && generation_.load(std::memory_order_acquire) == seen &&
             spinning()) {
        pause();
      }
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (index >= chunks_) continue;
      const auto *body = body_;
      const int64_t begin = total_ * index / chunks_, end = chunk_end(index);
      lock.unlock();
      (*body)(begin, end, index);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex dispatch_, mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t, int)> *body_ = nullptr;
  int64_t total_ = 0;
  int chunks_ = 0;
  std::atomic<int> pending_{0}, hot_{0};
  std::atomic<int64_t> cool_at_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
};

// Each worker's partial sums of `width` floats (parameter and bias gradients), added up in worker order at
// the end, so a result does not depend on timing.
class PartialSums {
 public:
  PartialSums(int workers, int64_t width) : workers_(workers), width_(width), sums_(workers * width, 0.0f) {}

  float *of(int worker) { return sums_.data() + worker * width_; }

  void total(float *out) const {
    for (int64_t c = 0; c < width_; ++c) {
      float sum = 0.0f;
      for (int worker = 0; worker < workers_; ++worker) sum += sums_[worker * width_ + c];
      out[c] = sum;
    }
  }

 private:
  int workers_;
  int64_t width_;
  std::vector<float> sums_;
};

// for (i in [0, n)) body(i), spread over the pool
template <class Body>
void parallel_rows(int64_t n, Body &&body) {
  Pool::instance().parallel_for(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) body(i);
  });
}

// y = activation(x + bias) over the rows of x (..., C), rows spread over the pool
template <class Activation>
void bias_rows(const float *x, const float *bias, float *y, int64_t rows, int64_t cols, Activation activation) {
  parallel_rows(rows, [&](int64_t row) {
    const float *xr = x + row * cols;
    float *yr = y + row * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) yr[c] = activation(xr[c] + bias[c]);
  });
}

}  // namespace mindvl
