#include "graphward/engine/backward/timeline.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "graphward/base/error.h"

namespace graphward {

namespace {
// The length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong forms, no
// surrogates, nothing past U+10FFFF), or 0.
std::size_t utf8_length(const std::string& s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](std::size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // a surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

// A JSON string of `s`: escaped, and any byte that is not part of well-formed UTF-8 replaced by
// U+FFFD (a label is a node's name or the caller's title, any bytes at all).
std::string json_string(const std::string& raw) {
  std::string s;
  for (std::size_t i = 0; i < raw.size();) {
    const std::size_t n = utf8_length(raw, i);
    if (n == 0) {
      s += "\xEF\xBF\xBD";
      ++i;
    } else {
      s.append(raw, i, n);
      i += n;
    }
  }
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// A JSON number (null where there is none: NaN and infinities are no JSON), whole at any size:
// three decimals, or an exponent past 1e15.
std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, std::abs(v) < 1e15 ? "%.3f" : "%.17g", v);
  return buf;
}
}  // namespace

std::vector<std::string> stream_names(const BackwardPlan& plan, bool reductions) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < plan.streams.size(); ++i) {
    const int serves = i < plan.side_of.size() ? plan.side_of[i] : -1;
    std::string name = "stream " + std::to_string(i);
    if (i == 0) {
      name += " (caller)";
    } else if (serves >= 0) {
      name += " (side of stream " + std::to_string(serves) + ")";
    } else {
      name += " (forward)";
    }
    names.push_back(std::move(name));
  }
  if (reductions) names.push_back("reductions (all-reduce of gradient buckets)");
  return names;
}

std::string chrome_trace(const std::vector<StepTiming>& steps,
                         const std::vector<std::string>& stream_names, const std::string& title) {
  std::ostringstream o;
  o << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  o << "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": "
    << json_string(title) << "}}";
  for (std::size_t i = 0; i < stream_names.size(); ++i) {
    o << ",\n  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": " << i
      << ", \"args\": {\"name\": " << json_string(stream_names[i]) << "}}";
    o << ",\n  {\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 1, \"tid\": " << i
      << ", \"args\": {\"sort_index\": " << i << "}}";
  }
  auto event = [&](const std::string& name, int tid, float start_ms, float end_ms, int step,
                   double host_us) {
    o << ",\n  {\"name\": " << json_string(name)
      << ", \"cat\": \"backward\", \"ph\": \"X\", \"pid\": 1, \"tid\": " << tid
      << ", \"ts\": " << number(1e3 * start_ms)
      << ", \"dur\": " << number(1e3 * (end_ms > start_ms ? end_ms - start_ms : 0.f))
      << ", \"args\": {\"step\": " << step << ", \"host_us\": " << number(host_us) << "}}";
  };
  for (const StepTiming& t : steps) {
    GW_CHECK(t.stream >= 0 && static_cast<std::size_t>(t.stream) < stream_names.size(),
             "chrome_trace: step ", t.step, " is on stream ", t.stream, "; expected one of the ",
             stream_names.size(), " named streams");
    event(t.label, t.stream, t.start_ms, t.end_ms, t.step, t.host_us);
    if (t.side_stream >= 0) {
      GW_CHECK(static_cast<std::size_t>(t.side_stream) < stream_names.size(), "chrome_trace: step ",
               t.step, "'s side part is on stream ", t.side_stream, "; expected one of the ",
               stream_names.size(), " named streams");
      event(t.label + " (weight grads)", t.side_stream, t.side_start_ms, t.side_end_ms, t.step, 0);
    }
  }
  o << "\n]}\n";
  return o.str();
}

void write_chrome_trace(const std::string& path, const std::vector<StepTiming>& steps,
                        const std::vector<std::string>& stream_names, const std::string& title) {
  detail::check_output_path("write_chrome_trace", path);
  const std::string text = chrome_trace(steps, stream_names, title);
  std::ofstream f(path, std::ios::binary);
  GW_CHECK(f.good(), "write_chrome_trace: cannot open ", path, " for writing");
  f << text;
  f.close();
  GW_CHECK(f.good(), "write_chrome_trace: writing ", path, " failed");
}

}  // namespace graphward
