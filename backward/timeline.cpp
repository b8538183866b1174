#include "backward/timeline.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace graphward {

namespace {
std::string json_string(const std::string& s) {
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

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
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
  const std::string text = chrome_trace(steps, stream_names, title);
  std::ofstream f(path, std::ios::binary);
  GW_CHECK(f.good(), "write_chrome_trace: cannot open ", path, " for writing");
  f << text;
  f.close();
  GW_CHECK(f.good(), "write_chrome_trace: writing ", path, " failed");
}

}  // namespace graphward
