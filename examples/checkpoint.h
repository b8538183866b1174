#pragma once
// Checkpoints: named tensors (any dtype, on any device) and named 64-bit integers in one file,
// for examples/train_gpt2 (its parameters, optimizer state, step and data position).
//
// save_checkpoint writes the file whole or not at all (examples/atomic_file.h): a failed or
// interrupted save leaves an earlier checkpoint as it was. load_checkpoint reads the file whole and checks all of it — the magic, the version,
// every record, the checksum at its end (a truncated or altered file fails it), and that it
// holds exactly the tensors asked for, each with the asked dtype and shape — before it writes
// anything; then it copies each tensor into its destination in place (copy_: the addresses a
// captured step reads are kept) and returns the integers. A refusal names the file and what was
// wrong, and leaves every destination as it was.
//
// Layout (little-endian): "graphwardckpt" + version (u32, 1) + tensor count (u32) + integer count
// (u32); each tensor: name length (u32), name, dtype (u8), rank (u8), dimensions (i64 each),
// byte count (u64), bytes; each integer: name length (u32), name, value (i64); then the FNV-1a
// 64-bit hash (u64) of everything before it.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "examples/atomic_file.h"
#include "graphward/graphward.h"

namespace graphward::examples {

inline constexpr char kCheckpointMagic[] = "graphwardckpt";  // 13 bytes, no terminator written
inline constexpr std::uint32_t kCheckpointVersion = 1;

namespace checkpoint_detail {

inline std::uint64_t fnv1a(const char* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Reads from a file's bytes, each read checked against its end.
class Reader {
 public:
  Reader(const std::string& path, const std::string& bytes, std::size_t end)
      : path_(path), bytes_(bytes), end_(end) {}
  template <class T>
  T get(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  const char* take(std::size_t n, const char* what) {
    GW_CHECK(n <= end_ - at_, "checkpoint '", path_, "': cut short in ", what, " (at byte ", at_,
             " of ", end_, ", ", n, " more wanted); expected a complete checkpoint");
    const char* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }
  std::size_t at() const { return at_; }

 private:
  const std::string& path_;
  const std::string& bytes_;
  std::size_t end_;
  std::size_t at_ = 0;
};

}  // namespace checkpoint_detail

inline void save_checkpoint(const std::string& path,
                            const std::vector<std::pair<std::string, Tensor>>& tensors,
                            const std::vector<std::pair<std::string, std::int64_t>>& integers) {
  namespace d = checkpoint_detail;
  std::string out(kCheckpointMagic, sizeof(kCheckpointMagic) - 1);
  d::put<std::uint32_t>(out, kCheckpointVersion);
  d::put<std::uint32_t>(out, static_cast<std::uint32_t>(tensors.size()));
  d::put<std::uint32_t>(out, static_cast<std::uint32_t>(integers.size()));
  for (const auto& [name, t] : tensors) {
    GW_CHECK(t.defined(), "save_checkpoint: tensor '", name, "' is undefined");
    const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());  // waits for its writers
    d::put<std::uint32_t>(out, static_cast<std::uint32_t>(name.size()));
    out += name;
    d::put<std::uint8_t>(out, static_cast<std::uint8_t>(t.dtype()));
    d::put<std::uint8_t>(out, static_cast<std::uint8_t>(t.dim()));
    for (std::int64_t s : t.shape()) d::put<std::int64_t>(out, s);
    d::put<std::uint64_t>(out, host.nbytes());
    out.append(static_cast<const char*>(host.raw_data()), host.nbytes());
  }
  for (const auto& [name, v] : integers) {
    d::put<std::uint32_t>(out, static_cast<std::uint32_t>(name.size()));
    out += name;
    d::put<std::int64_t>(out, v);
  }
  d::put<std::uint64_t>(out, d::fnv1a(out.data(), out.size()));
  write_file_atomically("save_checkpoint", path, {{out.data(), out.size()}});
}

// Restores `tensors` (each name once) from `path` and returns its integers, which must be
// exactly `integer_names`.
inline std::map<std::string, std::int64_t> load_checkpoint(
    const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::vector<std::string>& integer_names) {
  namespace d = checkpoint_detail;
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary);
    GW_CHECK(f.good(), "checkpoint '", path, "': cannot open it for reading");
    bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  const std::size_t magic = sizeof(kCheckpointMagic) - 1;
  GW_CHECK(bytes.size() >= magic && bytes.compare(0, magic, kCheckpointMagic) == 0,
           "checkpoint '", path, "': no checkpoint's magic at its start (", bytes.size(),
           " bytes); expected a file save_checkpoint wrote");
  GW_CHECK(bytes.size() >= magic + 12 + 8, "checkpoint '", path, "': ", bytes.size(),
           " bytes, too short for a checkpoint; expected a complete one");
  const std::size_t body = bytes.size() - 8;
  std::uint64_t stored;
  std::memcpy(&stored, bytes.data() + body, 8);
  d::Reader r(path, bytes, body);
  (void)r.take(magic, "the magic");
  const auto version = r.get<std::uint32_t>("the version");
  GW_CHECK(version == kCheckpointVersion, "checkpoint '", path, "': version ", version,
           "; expected ", kCheckpointVersion);
  GW_CHECK(d::fnv1a(bytes.data(), body) == stored, "checkpoint '", path,
           "': its checksum does not match its contents (cut short or altered); expected the "
           "file as save_checkpoint wrote it");
  const auto n_tensors = r.get<std::uint32_t>("the tensor count");
  const auto n_integers = r.get<std::uint32_t>("the integer count");
  std::map<std::string, std::size_t> wanted;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    GW_CHECK(wanted.emplace(tensors[i].first, i).second, "load_checkpoint: tensor '",
             tensors[i].first, "' asked for twice");
  }
  struct Found {
    const char* data;
    std::size_t n;
  };
  std::vector<Found> found(tensors.size(), Found{nullptr, 0});
  for (std::uint32_t k = 0; k < n_tensors; ++k) {
    const auto len = r.get<std::uint32_t>("a tensor's name");
    const std::string name(r.take(len, "a tensor's name"), len);
    const auto code = r.get<std::uint8_t>("a tensor's dtype");
    GW_CHECK(code <= static_cast<std::uint8_t>(DType::kBFloat16), "checkpoint '", path,
             "': tensor '", name, "' has dtype code ", int{code}, "; expected one graphward knows");
    const auto dtype = static_cast<DType>(code);
    const auto rank = r.get<std::uint8_t>("a tensor's rank");
    std::vector<std::int64_t> dims;
    for (int i = 0; i < rank; ++i) dims.push_back(r.get<std::int64_t>("a tensor's shape"));
    const Shape shape(dims);
    const auto n = r.get<std::uint64_t>("a tensor's byte count");
    const char* data = r.take(n, "a tensor's bytes");
    const auto w = wanted.find(name);
    GW_CHECK(w != wanted.end(), "checkpoint '", path, "': holds tensor '", name,
             "', which is not asked for; expected a checkpoint of this model and optimizer");
    const Tensor& dst = tensors[w->second].second;
    GW_CHECK(found[w->second].data == nullptr, "checkpoint '", path, "': tensor '", name,
             "' twice");
    GW_CHECK(dtype == dst.dtype() && shape == dst.shape() && n == dst.nbytes(), "checkpoint '",
             path, "': tensor '", name, "' is ", dtype_name(dtype), " ", shape_str(shape),
             "; expected ", dtype_name(dst.dtype()), " ", shape_str(dst.shape()));
    found[w->second] = {data, n};
  }
  std::map<std::string, std::int64_t> integers;
  for (std::uint32_t k = 0; k < n_integers; ++k) {
    const auto len = r.get<std::uint32_t>("an integer's name");
    const std::string name(r.take(len, "an integer's name"), len);
    integers[name] = r.get<std::int64_t>("an integer");
  }
  GW_CHECK(r.at() == body, "checkpoint '", path, "': ", body - r.at(),
           " bytes after its last record; expected none");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    GW_CHECK(found[i].data != nullptr, "checkpoint '", path, "': no tensor '", tensors[i].first,
             "'; expected a checkpoint of this model and optimizer");
  }
  for (const std::string& name : integer_names) {
    GW_CHECK(integers.count(name) == 1, "checkpoint '", path, "': no integer '", name, "'");
  }
  GW_CHECK(integers.size() == integer_names.size(), "checkpoint '", path, "': ", integers.size(),
           " integers; expected ", integer_names.size());
  // Everything checked: now the copies.
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& dst = tensors[i].second;
    Tensor host = Tensor::empty(dst.shape(), {dst.dtype(), Device::cpu()});
    std::memcpy(host.raw_data(), found[i].data, found[i].n);
    NoGradGuard no_grad;
    copy_(dst, dst.device().is_cpu() ? host : host.to(dst.device()));
  }
  return integers;
}

}  // namespace graphward::examples
