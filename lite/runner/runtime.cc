#include "runtime.h"

#include "error.h"
#include "include/api/context.h"

namespace mvl {

std::unique_ptr<mindspore::Model> build_model(const std::string &path, int threads) {
  auto context = std::make_shared<mindspore::Context>();
  context->SetThreadNum(threads);
  context->MutableDeviceInfo().push_back(std::make_shared<mindspore::CPUDeviceInfo>());
  auto model = std::make_unique<mindspore::Model>();
  mindspore::Status status = model->Build(path, mindspore::kMindIR, context);
  if (status != mindspore::kSuccess) throw RuntimeFailure(path + ": Lite could not build it: " + status.ToString());
  return model;
}

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace mvl
