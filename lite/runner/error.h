// The runner's two error types: a message a user can act on. main() prints it and exits with 2 for a
// RunnerError (arguments, package files, inputs) and 1 for a RuntimeFailure (the Lite runtime failed).
#pragma once

#include <stdexcept>
#include <string>

namespace mvl {

struct RunnerError : std::runtime_error {
  explicit RunnerError(const std::string &message) : std::runtime_error(message) {}
};

struct RuntimeFailure : std::runtime_error {  // exit code 1, not 2: the inputs were fine
  explicit RuntimeFailure(const std::string &message) : std::runtime_error(message) {}
};

}  // namespace mvl
