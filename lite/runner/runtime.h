// The Lite runtime calls both modes of the runner make: build a model on N CPU threads, time a stage.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "include/api/model.h"

namespace mvl {

// Builds the MindIR file `path` on the CPU with `threads` threads; throws RuntimeFailure with Lite's status.
std::unique_ptr<mindspore::Model> build_model(const std::string &path, int threads);

double elapsed_ms(std::chrono::steady_clock::time_point since);

}  // namespace mvl
