#pragma once
// A strict JSON syntax check for the tests (RFC 8259 values; no extensions), and a helper that
// collects the thread-track names of a Chrome trace.
#include <cctype>
#include <cstddef>
#include <regex>
#include <string>
#include <vector>

namespace graphward::testing {

class JsonCheck {
 public:
  explicit JsonCheck(const std::string& text) : s_(text) {}
  // True when the whole text is one JSON value (surrounded by whitespace only).
  bool valid() {
    i_ = 0;
    ws();
    if (!value(0)) return false;
    ws();
    return i_ == s_.size();
  }

 private:
  bool value(int depth) {
    if (depth > 64 || i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return string();
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return number();
    return literal("true") || literal("false") || literal("null");
  }
  bool object(int depth) {
    ++i_;
    ws();
    if (peek('}')) return ++i_, true;
    for (;;) {
      ws();
      if (!string()) return false;
      ws();
      if (!peek(':')) return false;
      ++i_;
      ws();
      if (!value(depth + 1)) return false;
      ws();
      if (peek('}')) return ++i_, true;
      if (!peek(',')) return false;
      ++i_;
    }
  }
  bool array(int depth) {
    ++i_;
    ws();
    if (peek(']')) return ++i_, true;
    for (;;) {
      ws();
      if (!value(depth + 1)) return false;
      ws();
      if (peek(']')) return ++i_, true;
      if (!peek(',')) return false;
      ++i_;
    }
  }
  bool string() {
    if (!peek('"')) return false;
    for (++i_; i_ < s_.size(); ++i_) {
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') return ++i_, true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (++i_ >= s_.size()) return false;
        const char e = s_[i_];
        if (e == 'u') {
          for (int k = 0; k < 4; ++k) {
            if (++i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) return false;
          }
        } else if (std::string("\"\\/bfnrt").find(e) == std::string::npos) {
          return false;
        }
      }
    }
    return false;
  }
  bool number() {
    static const std::regex re(R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)");
    std::smatch m;
    const std::string rest = s_.substr(i_, 64);
    if (!std::regex_search(rest, m, re, std::regex_constants::match_continuous)) return false;
    i_ += static_cast<std::size_t>(m.length(0));
    return true;
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (s_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }
  bool peek(char c) const { return i_ < s_.size() && s_[i_] == c; }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) {
      ++i_;
    }
  }
  const std::string& s_;
  std::size_t i_ = 0;
};

inline bool json_valid(const std::string& text) {
  return JsonCheck(text).valid();
}

// The names of a Chrome trace's thread tracks ("thread_name" metadata events), in file order.
inline std::vector<std::string> trace_track_names(const std::string& text) {
  static const std::regex re(
      R"re("name": "thread_name", "ph": "M", "pid": 1, "tid": [0-9]+, "args": \{"name": "([^"]*)"\})re");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    out.push_back((*it)[1].str());
  }
  return out;
}

// The number of complete ("X") events on thread track `tid`.
inline std::size_t trace_events_on(const std::string& text, int tid) {
  const std::regex re("\"ph\": \"X\", \"pid\": 1, \"tid\": " + std::to_string(tid) + ",");
  return static_cast<std::size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

}  // namespace graphward::testing
