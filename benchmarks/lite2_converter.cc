// A command around the MindSpore Lite 2.0 wheel's converter library (libmindspore_converter.so), for
// benchmarks/lite2_dynamic_quant.py: `lite2_converter MODEL OUTPUT [CONFIG]` writes OUTPUT.mindir. The wheel
// ships the library but not its header, so the class is declared here as the library exports it (constructor,
// SetConfigFile, SetSaveType, Convert; its one member, the settings, is a shared pointer). Compiled like
// lite/bridge.cc (the old string ABI, the wheel's headers); a process of its own, as loading the converter
// beside MindSpore 2.10 in one process fails on a symbol (mindspore::ops::PoolGrad).
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "include/api/status.h"
#include "include/api/types.h"
#include "include/registry/converter_context.h"

namespace mindspore {
class Converter {
 public:
  Converter(converter::FmkType fmk_type, const std::vector<char> &model_file, const std::vector<char> &output_file,
            const std::vector<char> &weight_file);
  void SetConfigFile(const std::vector<char> &config_file);
  void SetSaveType(ModelType save_type);
  Status Convert();

 private:
  std::shared_ptr<void> data_;
};
}  // namespace mindspore

namespace {
std::vector<char> chars(const char *text) { return std::vector<char>(text, text + std::string(text).size()); }
}  // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: lite2_converter MODEL OUTPUT [CONFIG]\n");
    return 2;
  }
  alignas(64) static char storage[1024];  // room beyond the declared size, never destroyed: a one-shot command
  auto *converter = new (storage) mindspore::Converter(mindspore::converter::kFmkTypeMs, chars(argv[1]),
                                                       chars(argv[2]), chars(""));
  if (argc > 3) converter->SetConfigFile(chars(argv[3]));
  converter->SetSaveType(mindspore::kMindIR);
  mindspore::Status status = converter->Convert();
  if (status == mindspore::kSuccess) return 0;
  std::fprintf(stderr, "%s\n", status.ToString().c_str());
  return 1;
}
