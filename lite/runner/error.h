// The one error type of the runner: a message a user can act on. main() prints it and exits with 2.
#pragma once

#include <stdexcept>
#include <string>

namespace mvl {

struct RunnerError : std::runtime_error {
  explicit RunnerError(const std::string &message) : std::runtime_error(message) {}
};

}  // namespace mvl
