#pragma once
// A file written whole or not at all: the bytes go to a temporary file beside `path`, which is
// renamed over `path` once written and flushed; a write that fails leaves an earlier file at
// `path` as it was. For the examples' token shards and checkpoints.
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>

#include "graphward/base/error.h"

namespace graphward::examples {

// `chunks`: (pointer, byte count) pairs written in order. `what` names the caller in errors.
inline void write_file_atomically(const char* what, const std::string& path,
                                  std::initializer_list<std::pair<const void*, std::size_t>> chunks) {
  const std::string tmp = path + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    GW_CHECK(out.good(), what, ": cannot open '", tmp, "' for writing; '", path,
             "' left as it was");
    for (const auto& [data, bytes] : chunks) {
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    }
    out.flush();
    if (!out.good()) {
      out.close();
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw Error(std::string(what) + ": writing '" + tmp + "' failed (disk full?); '" + path +
                  "' left as it was");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  GW_CHECK(!ec, what, ": cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

}  // namespace graphward::examples
