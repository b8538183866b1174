#include "graphward/base/env.h"

#include <cctype>
#include <cstdlib>
#include <string>

#include "graphward/base/error.h"

namespace graphward::detail {

std::optional<bool> parse_env_switch(const char* name, std::string_view value) {
  if (value.empty()) return std::nullopt;
  std::string v(value);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  GW_CHECK(false, "the environment variable ", name, " is '", std::string(value),
           "'; expected 1, true, on or yes (on) or 0, false, off or no (off), or unset");
  return std::nullopt;
}

bool env_switch(const char* name, bool fallback) {
  const char* env = std::getenv(name);
  const std::optional<bool> v = env ? parse_env_switch(name, env) : std::nullopt;
  return v.value_or(fallback);
}

}  // namespace graphward::detail
