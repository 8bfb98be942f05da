// A C face for the MindSpore Lite 2.0 C++ API (mindspore::Model), so Python can reach it with ctypes.
//
// The registry wheel mindspore-lite==2.0.0 ships headers and libraries but its Python module only loads
// in Python 3.7, and it has no C API. mindvl compiles this file against the wheel's own headers with
// the old string ABI (-D_GLIBCXX_USE_CXX11_ABI=0, the wheel was built with GCC 7.3); see lite/lite2_runtime.py.
// Every function returns 0 on success or -1 with a message in the caller's `error` buffer.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "include/api/context.h"
#include "include/api/model.h"
#include "include/api/types.h"

namespace {

struct Handle {
  mindspore::Model model;
  std::vector<mindspore::MSTensor> outputs;
};

int fail(char *error, size_t size, const std::string &message) {
  if (error != nullptr && size > 0) std::snprintf(error, size, "%s", message.c_str());
  return -1;
}

// name, dtype (mindspore::DataType), shape of one tensor, into caller-owned buffers
int describe(const mindspore::MSTensor &tensor, char *name, size_t name_size, int *dtype, int64_t *shape,
             int *rank, int max_rank) {
  const std::vector<int64_t> &dims = tensor.Shape();
  if (static_cast<int>(dims.size()) > max_rank) return -1;
  std::snprintf(name, name_size, "%s", tensor.Name().c_str());
  *dtype = static_cast<int>(tensor.DataType());
  *rank = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) shape[i] = dims[i];
  return 0;
}

}  // namespace

extern "C" {

void *mvl_build(const char *path, int threads, char *error, size_t error_size) {
  auto context = std::make_shared<mindspore::Context>();
  context->SetThreadNum(threads);
  context->MutableDeviceInfo().push_back(std::make_shared<mindspore::CPUDeviceInfo>());
  auto handle = std::make_unique<Handle>();
  mindspore::Status status = handle->model.Build(std::string(path), mindspore::kMindIR, context);
  if (status != mindspore::kSuccess) {
    fail(error, error_size, status.ToString());
    return nullptr;
  }
  return handle.release();
}

void mvl_free(void *handle) { delete static_cast<Handle *>(handle); }

int mvl_count(void *handle, int outputs) {
  auto *h = static_cast<Handle *>(handle);
  return static_cast<int>(outputs ? h->model.GetOutputs().size() : h->model.GetInputs().size());
}

int mvl_describe(void *handle, int outputs, int index, char *name, size_t name_size, int *dtype, int64_t *shape,
                 int *rank, int max_rank) {
  auto *h = static_cast<Handle *>(handle);
  std::vector<mindspore::MSTensor> tensors = outputs ? h->model.GetOutputs() : h->model.GetInputs();
  if (index < 0 || index >= static_cast<int>(tensors.size())) return -1;
  return describe(tensors[index], name, name_size, dtype, shape, rank, max_rank);
}

// shapes: the new shape of every input, concatenated; ranks: each input's rank
int mvl_resize(void *handle, const int64_t *shapes, const int *ranks, int count, char *error, size_t error_size) {
  auto *h = static_cast<Handle *>(handle);
  std::vector<mindspore::MSTensor> inputs = h->model.GetInputs();
  if (count != static_cast<int>(inputs.size())) return fail(error, error_size, "wrong number of input shapes");
  std::vector<std::vector<int64_t>> dims;
  for (int i = 0; i < count; ++i) {
    dims.emplace_back(shapes, shapes + ranks[i]);
    shapes += ranks[i];
  }
  mindspore::Status status = h->model.Resize(inputs, dims);
  return status == mindspore::kSuccess ? 0 : fail(error, error_size, status.ToString());
}

// data[i]: the bytes of input i (sizes[i] must equal the input's byte size after any resize)
int mvl_predict(void *handle, const void *const *data, const size_t *sizes, int count, char *error,
                size_t error_size) {
  auto *h = static_cast<Handle *>(handle);
  std::vector<mindspore::MSTensor> inputs = h->model.GetInputs();
  if (count != static_cast<int>(inputs.size())) return fail(error, error_size, "wrong number of inputs");
  for (int i = 0; i < count; ++i) {
    if (sizes[i] != inputs[i].DataSize()) {
      return fail(error, error_size, "input " + inputs[i].Name() + ": " + std::to_string(sizes[i]) +
                                         " bytes given, the model expects " + std::to_string(inputs[i].DataSize()));
    }
    std::memcpy(inputs[i].MutableData(), data[i], sizes[i]);
  }
  h->outputs.clear();
  mindspore::Status status = h->model.Predict(inputs, &h->outputs);
  return status == mindspore::kSuccess ? 0 : fail(error, error_size, status.ToString());
}

// after mvl_predict: output `index` of the last prediction
int mvl_result(void *handle, int index, char *name, size_t name_size, int *dtype, int64_t *shape, int *rank,
               int max_rank) {
  auto *h = static_cast<Handle *>(handle);
  if (index < 0 || index >= static_cast<int>(h->outputs.size())) return -1;
  return describe(h->outputs[index], name, name_size, dtype, shape, rank, max_rank);
}

int mvl_result_copy(void *handle, int index, void *destination, size_t size) {
  auto *h = static_cast<Handle *>(handle);
  if (index < 0 || index >= static_cast<int>(h->outputs.size())) return -1;
  mindspore::MSTensor &tensor = h->outputs[index];
  if (size != tensor.DataSize()) return -1;
  std::memcpy(destination, tensor.MutableData(), size);
  return 0;
}

}  // extern "C"
