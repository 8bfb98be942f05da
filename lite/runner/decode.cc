// PNG (libpng) and JPEG (libjpeg) decoding to RGB, matching what Pillow's convert("RGB") gives.
//
// Both libraries report errors by longjmp. Everything they touch lives in a heap-allocated state object
// created before setjmp, so a jump loses nothing and the state's destructor frees the library's memory.
#include <csetjmp>
#include <cstdio>  // before jpeglib.h, which needs FILE and size_t
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include "error.h"
#include "image.h"

namespace mvl {
namespace {

// Pillow refuses images above twice Image.MAX_IMAGE_PIXELS (a decompression bomb); so do we
const uint64_t kMaxPixels = 2ull * 89478485ull;

void check_size(uint64_t width, uint64_t height, const std::string &path) {
  if (width == 0 || height == 0 || width * height > kMaxPixels) {
    throw RunnerError(path + ": " + std::to_string(width) + "x" + std::to_string(height) +
                      " pixels is not a usable image size (at most " + std::to_string(kMaxPixels) + " pixels)");
  }
}

// ----------------------------------------------------------------------------- PNG

struct PngState {
  const std::vector<uint8_t> *data = nullptr;
  size_t offset = 0;
  std::string error;
  png_structp png = nullptr;
  png_infop info = nullptr;
  RgbImage image;
  std::vector<uint8_t> raw;  // 16-bit grey rows, clipped below
  std::vector<png_bytep> rows;
  ~PngState() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

void png_fail(png_structp png, png_const_charp message) {
  static_cast<PngState *>(png_get_error_ptr(png))->error = message;
  longjmp(png_jmpbuf(png), 1);
}

void png_quiet(png_structp, png_const_charp) {}  // warnings (say, an odd colour profile) do not stop Pillow

void png_read_memory(png_structp png, png_bytep out, png_size_t size) {
  auto *state = static_cast<PngState *>(png_get_io_ptr(png));
  if (state->data->size() - state->offset < size) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, state->data->data() + state->offset, size);
  state->offset += size;
}

// false with state->error set when libpng gives up; `path` only names the file in size errors
bool read_png(PngState *state, const std::string &path) {
  state->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, state, png_fail, png_quiet);
  if (state->png != nullptr) state->info = png_create_info_struct(state->png);
  if (state->info == nullptr) {
    state->error = "out of memory";
    return false;
  }
  if (setjmp(png_jmpbuf(state->png))) return false;
  png_set_read_fn(state->png, state, png_read_memory);
  png_read_info(state->png, state->info);
  png_uint_32 width = 0, height = 0;
  int depth = 0, color = 0;
  png_get_IHDR(state->png, state->info, &width, &height, &depth, &color, nullptr, nullptr, nullptr);
  check_size(width, height, path);
  // Pillow keeps the high byte of 16-bit RGB and grey+alpha samples, but clips 16-bit grey ("I;16") to 255
  const bool grey16 = color == PNG_COLOR_TYPE_GRAY && depth == 16;
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(state->png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(state->png);
  if (!grey16) {
    png_set_strip_16(state->png);
    png_set_gray_to_rgb(state->png);
  }
  png_set_strip_alpha(state->png);  // convert("RGB") drops alpha and tRNS transparency
  png_set_interlace_handling(state->png);
  png_read_update_info(state->png, state->info);
  const size_t row_bytes = png_get_rowbytes(state->png, state->info);
  if (row_bytes != static_cast<size_t>(width) * (grey16 ? 2 : 3)) png_error(state->png, "unexpected row layout");
  std::vector<uint8_t> &target = grey16 ? state->raw : state->image.pixels;
  target.resize(row_bytes * height);
  state->rows.resize(height);
  for (png_uint_32 y = 0; y < height; ++y) state->rows[y] = target.data() + y * row_bytes;
  png_read_image(state->png, state->rows.data());
  state->image.width = static_cast<int>(width);
  state->image.height = static_cast<int>(height);
  if (grey16) {
    state->image.pixels.resize(static_cast<size_t>(width) * height * 3);
    for (size_t i = 0; i < static_cast<size_t>(width) * height; ++i) {
      int value = (state->raw[2 * i] << 8) | state->raw[2 * i + 1];  // big-endian samples
      std::memset(&state->image.pixels[3 * i], value > 255 ? 255 : value, 3);
    }
  }
  return true;
}

// ----------------------------------------------------------------------------- JPEG

struct JpegState {
  jpeg_decompress_struct info{};
  jpeg_error_mgr errors{};
  jmp_buf jump{};
  char message[JMSG_LENGTH_MAX] = {0};
  bool created = false;
  RgbImage image;
  ~JpegState() {
    if (created) jpeg_destroy_decompress(&info);
  }
};

void jpeg_fail(j_common_ptr info) {
  auto *state = static_cast<JpegState *>(info->client_data);
  info->err->format_message(info, state->message);
  longjmp(state->jump, 1);
}

// libjpeg only warns when the data ends early (and fills the rest with grey); Pillow calls that an error.
// Other warnings (extraneous bytes, say) Pillow ignores too.
void jpeg_warn(j_common_ptr info, int level) {
  if (level < 0 && info->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(info);
}

bool read_jpeg(JpegState *state, const std::vector<uint8_t> &data, const std::string &path) {
  state->info.err = jpeg_std_error(&state->errors);
  state->errors.error_exit = jpeg_fail;
  state->errors.emit_message = jpeg_warn;
  state->info.client_data = state;
  if (setjmp(state->jump)) return false;
  jpeg_create_decompress(&state->info);
  state->created = true;
  jpeg_mem_src(&state->info, data.data(), static_cast<unsigned long>(data.size()));
  jpeg_read_header(&state->info, TRUE);
  if (state->info.jpeg_color_space == JCS_CMYK || state->info.jpeg_color_space == JCS_YCCK) {
    std::snprintf(state->message, sizeof state->message, "a CMYK JPEG; save it as an RGB JPEG or PNG");
    return false;
  }
  check_size(state->info.image_width, state->info.image_height, path);
  state->info.out_color_space = JCS_RGB;  // greyscale is replicated, as convert("RGB") does
  jpeg_start_decompress(&state->info);
  const size_t stride = static_cast<size_t>(state->info.output_width) * 3;
  state->image.width = static_cast<int>(state->info.output_width);
  state->image.height = static_cast<int>(state->info.output_height);
  state->image.pixels.resize(stride * state->info.output_height);
  while (state->info.output_scanline < state->info.output_height) {
    JSAMPROW row = state->image.pixels.data() + state->info.output_scanline * stride;
    jpeg_read_scanlines(&state->info, &row, 1);
  }
  jpeg_finish_decompress(&state->info);
  return true;
}

}  // namespace

RgbImage decode_image(const std::string &path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw RunnerError(path + ": no such image file or not readable");
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (data.size() >= 8 && std::memcmp(data.data(), kPng, 8) == 0) {
    auto state = std::make_unique<PngState>();
    state->data = &data;
    if (!read_png(state.get(), path)) throw RunnerError(path + ": cannot decode the PNG (" + state->error + ")");
    return std::move(state->image);
  }
  if (data.size() >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
    auto state = std::make_unique<JpegState>();
    if (!read_jpeg(state.get(), data, path)) {
      throw RunnerError(path + ": cannot decode the JPEG (" + std::string(state->message) + ")");
    }
    return std::move(state->image);
  }
  throw RunnerError(path + (data.empty() ? ": the file is empty" : ": not a PNG or JPEG file") +
                    "; pass a valid PNG or JPEG image");
}

}  // namespace mvl
