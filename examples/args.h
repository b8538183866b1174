#pragma once
// The examples' command line: "--flag value" and "--flag=value" alike; a number is parsed whole
// (a malformed or out-of-range one is refused, naming the flag); "--help" (or "-h") asks for the
// program's list of flags. Errors are graphward::Error, printed by the program's main.
// An integer flag is at most INT_MAX: every count fits the int it is kept in, and any two sizes
// multiply within int64 (a product of more is formed by shape_numel, which refuses what does not
// fit).
#include <cfloat>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <system_error>

#include "graphward/base/error.h"

namespace graphward::examples {

class ArgReader {
 public:
  ArgReader(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // Moves to the next argument; false after the last.
  bool next() {
    if (++i_ >= argc_) return false;
    const std::string a = argv_[i_];
    const std::size_t eq = a.find('=');
    has_inline_ = a.rfind("--", 0) == 0 && eq != std::string::npos;
    name_ = has_inline_ ? a.substr(0, eq) : a;
    inline_ = has_inline_ ? a.substr(eq + 1) : std::string();
    return true;
  }
  const std::string& name() const { return name_; }
  bool is(const char* flag) const { return name_ == flag; }
  bool wants_help() const { return name_ == "--help" || name_ == "-h"; }
  // The flag's value: after its '=', or the next argument.
  std::string value() {
    if (has_inline_) return inline_;
    if (i_ + 1 >= argc_) throw Error(name_ + " needs a value (" + name_ + " V or " + name_ + "=V)");
    return argv_[++i_];
  }
  // A switch takes no value.
  void no_value() const {
    if (has_inline_) throw Error(name_ + " takes no value; got " + name_ + "=" + inline_);
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string name_, inline_;
  bool has_inline_ = false;
};

// `text` as a whole integer from `min` to `max`, or an Error naming `flag`.
inline std::int64_t parse_int(const std::string& flag, const std::string& text,
                              std::int64_t min = 1, std::int64_t max = INT_MAX) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) {
    throw Error(flag + " is " + text + "; expected an integer from " + std::to_string(min) +
                " to " + std::to_string(max));
  }
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw Error(flag + " is '" + text + "'; expected an integer");
  }
  if (v < min) throw Error(flag + " is " + text + "; expected at least " + std::to_string(min));
  if (v > max) throw Error(flag + " is " + text + "; expected at most " + std::to_string(max));
  return v;
}

// parse_int for a flag kept in an int.
inline int parse_count(const std::string& flag, const std::string& text, int min = 1) {
  return static_cast<int>(parse_int(flag, text, min, INT_MAX));
}

// `text` as a whole finite number greater than `above` and at most `max`, or an Error naming
// `flag` (the default `max`: what a float32 holds, as every learning rate and scale is read).
inline double parse_number(const std::string& flag, const std::string& text, double above,
                           double max = FLT_MAX) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || !std::isfinite(v)) {
    throw Error(flag + " is '" + text + "'; expected a number");
  }
  if (!(v > above)) {
    throw Error(flag + " is " + text + "; expected a number above " + std::to_string(above));
  }
  if (v > max) {
    std::string m(32, '\0');
    m.resize(static_cast<std::size_t>(std::snprintf(m.data(), m.size(), "%g", max)));
    throw Error(flag + " is " + text + "; expected a number of at most " + m);
  }
  return v;
}

}  // namespace graphward::examples
