// Resize and normalise, mirroring Pillow (libImaging/Resample.c) and mindvl.preprocess.image_to_array.
#include <algorithm>
#include <cmath>

#include "image.h"

namespace mvl {
namespace {

const int kPrecisionBits = 32 - 8 - 2;  // Pillow's fixed point for 8-bit images: 22 fraction bits

// Keys' cubic with a = -0.5, Pillow's BICUBIC filter (support 2)
double bicubic(double x) {
  const double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// For each output position along one axis: the first input index, how many inputs, and their weights.
struct Kernel {
  int size = 0;  // weights per output position (some trailing ones unused)
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // (outputs, size), fixed point
};

// Pillow's precompute_coeffs + normalize_coeffs_8bpc: when shrinking, the filter is stretched by the
// scale, so every input pixel contributes (an antialiased downscale).
Kernel make_kernel(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 2.0 * filter_scale;
  Kernel kernel;
  kernel.size = static_cast<int>(std::ceil(support)) * 2 + 1;
  kernel.first.resize(out_size);
  kernel.count.resize(out_size);
  kernel.weights.assign(static_cast<size_t>(out_size) * kernel.size, 0);
  std::vector<double> weights(kernel.size);
  for (int out = 0; out < out_size; ++out) {
    const double center = (out + 0.5) * scale;
    int first = static_cast<int>(center - support + 0.5);  // truncation toward zero, as Pillow's (int) cast
    int last = static_cast<int>(center + support + 0.5);
    first = std::max(first, 0);
    last = std::min(last, in_size);
    const int count = last - first;
    const double shrink = 1.0 / filter_scale;  // multiplied, not divided: the same doubles as Pillow
    double total = 0.0;
    for (int i = 0; i < count; ++i) {
      weights[i] = bicubic((i + first - center + 0.5) * shrink);
      total += weights[i];
    }
    for (int i = 0; i < count; ++i) {
      const double w = total != 0.0 ? weights[i] / total : weights[i];
      const double fixed = w * (1 << kPrecisionBits);
      kernel.weights[static_cast<size_t>(out) * kernel.size + i] = static_cast<int32_t>(w < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    kernel.first[out] = first;
    kernel.count[out] = count;
  }
  return kernel;
}

uint8_t clip8(int32_t value) {
  if (value >= (1 << kPrecisionBits << 8)) return 255;
  if (value <= 0) return 0;
  return static_cast<uint8_t>(value >> kPrecisionBits);
}

// One pass along x (horizontal) or y: `step` is the distance in bytes between neighbouring input samples.
RgbImage resample(const RgbImage &in, int width, int height, bool horizontal) {
  const Kernel kernel = make_kernel(horizontal ? in.width : in.height, horizontal ? width : height);
  RgbImage out;
  out.width = width;
  out.height = height;
  out.pixels.resize(static_cast<size_t>(width) * height * 3);
  const size_t step = horizontal ? 3 : static_cast<size_t>(in.width) * 3;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const int position = horizontal ? x : y;
      const int32_t *k = &kernel.weights[static_cast<size_t>(position) * kernel.size];
      const size_t start = horizontal ? (static_cast<size_t>(y) * in.width + kernel.first[position]) * 3
                                      : (static_cast<size_t>(kernel.first[position]) * in.width + x) * 3;
      for (int c = 0; c < 3; ++c) {
        int32_t sum = 1 << (kPrecisionBits - 1);  // rounds the final shift
        const uint8_t *sample = &in.pixels[start + c];
        for (int i = 0; i < kernel.count[position]; ++i) sum += sample[i * step] * k[i];
        out.pixels[(static_cast<size_t>(y) * width + x) * 3 + c] = clip8(sum);
      }
    }
  }
  return out;
}

}  // namespace

RgbImage resize_bicubic(const RgbImage &image, int width, int height) {
  // Pillow skips a pass whose axis keeps its size
  RgbImage wide = image.width != width ? resample(image, width, image.height, true) : image;
  return wide.height != height ? resample(wide, width, height, false) : wide;
}

std::vector<float> image_tensor(const std::string &path, const Preprocess &pre) {
  const int size = pre.image_size;
  RgbImage image = decode_image(path);
  if (image.width != size || image.height != size) image = resize_bicubic(image, size, size);
  const size_t plane = static_cast<size_t>(size) * size;
  std::vector<float> tensor(3 * plane);  // (3, S, S)
  const float inverse = static_cast<float>(1.0 / 255.0);  // numpy multiplies float32 pixels by float32(1/255)
  for (size_t i = 0; i < plane; ++i) {
    for (int c = 0; c < 3; ++c) {
      const float value = static_cast<float>(image.pixels[i * 3 + c]) * inverse;
      tensor[c * plane + i] = (value - pre.image_mean[c]) / pre.image_std[c];
    }
  }
  return tensor;
}

}  // namespace mvl
