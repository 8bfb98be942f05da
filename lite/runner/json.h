// The runner prints one JSON line; these write its values (no JSON library on the device).
#pragma once

#include <string>

namespace mvl {

std::string json_string(const std::string &text);  // quoted, with " \ and control characters escaped
std::string json_number(double value);  // enough digits to give a float32 back exactly; null for NaN / inf

}  // namespace mvl
