// Image file -> the model's image tensor, as mindvl.preprocess.decode_image makes it with Pillow:
// decode to RGB (decode.cc), bicubic resize to (S, S) unless already that size, /255, (x - mean) / std,
// channels first (image.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "assets.h"

namespace mvl {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // (height, width, 3), row-major
};

// A PNG or JPEG file as 8-bit RGB, the way PIL's Image.open(...).convert("RGB") reads it (alpha dropped,
// not composited; palette and grey expanded). Throws RunnerError naming the file when it is missing,
// corrupt, truncated or of another format.
RgbImage decode_image(const std::string &path);

// PIL's Image.resize((width, height), Image.BICUBIC) for RGB images, bit for bit: the same fixed-point
// kernels, horizontal pass then vertical pass, each rounded and clipped to uint8.
RgbImage resize_bicubic(const RgbImage &image, int width, int height);

// float32 (3, S, S): resize to S = pre.image_size if needed, x / 255, then (x - mean) / std.
std::vector<float> image_tensor(const std::string &path, const Preprocess &pre);

}  // namespace mvl
