#pragma once
// Token shards as llm.c writes them (its dev/data scripts): a header of 256 little-endian int32 —
// [0] the magic 20240520, [1] the version 1, [2] the number of tokens — then that many uint16
// tokens. examples/train_gpt2.cpp reads them; write_token_shard writes one (a synthetic shard for
// the tests and benchmarks: nothing is downloaded).
//
// TokenShards reads a list of shards as one stream of batches, as llm.c's DataLoader does: a batch
// is batch · seq + 1 consecutive tokens of one shard (inputs the first batch · seq, targets the
// same shifted by one); rank r of `world` takes the r-th such window of each step, and the
// position moves on by world · batch · seq tokens; a shard with no room left for the next window
// gives way to the next shard, the last to the first. A position (shard, offset) can be read and
// restored, for checkpoints.
//
// Every shard's header and size (against its token count) are checked when the reader is made, and
// its tokens (every one below the vocabulary) when it is opened, before any is used: a bad shard
// is refused with an error naming the file and what was wrong, and the reader stays where it was.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "graphward/base/error.h"
#include "examples/atomic_file.h"

namespace graphward::examples {

inline constexpr std::int32_t kShardMagic = 20240520;
inline constexpr std::int32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderInts = 256;

// Writes `tokens` as a shard at `path`, whole or not at all (examples/atomic_file.h: a failed
// write leaves any earlier file at `path` as it was).
inline void write_token_shard(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  GW_CHECK(tokens.size() <= static_cast<std::size_t>(INT32_MAX), "write_token_shard: ",
           tokens.size(), " tokens; a shard holds at most ", INT32_MAX);
  std::vector<std::int32_t> header(kShardHeaderInts, 0);
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<std::int32_t>(tokens.size());
  write_file_atomically("write_token_shard", path,
                        {{header.data(), header.size() * sizeof(std::int32_t)},
                         {tokens.data(), tokens.size() * sizeof(std::uint16_t)}});
}

// A synthetic shard's tokens: `count` tokens below `vocab` from a fixed-seed generator, with
// structure a model can learn (each token most often the one before it plus one, modulo vocab,
// else drawn at random from the first kSyntheticJumpIds ids), so that the loss goes down from
// ln(vocab) in a few hundred steps even at GPT-2's vocabulary: what follows a token is one rule,
// and the ids a run starts from are few enough for every one of them to be seen early (drawn
// from all of GPT-2's 50,257 ids, most ids were seen about once in 200 steps of 256 tokens, and
// the loss did not move).
inline constexpr std::uint64_t kSyntheticJumpIds = 1024;
inline std::vector<std::uint16_t> synthetic_tokens(std::int64_t count, std::int64_t vocab,
                                                   std::uint64_t seed) {
  GW_CHECK(count >= 1, "synthetic_tokens: count is ", count, "; expected at least 1");
  GW_CHECK(vocab >= 2 && vocab <= 65536, "synthetic_tokens: vocab is ", vocab,
           "; expected 2 to 65536 (tokens are uint16)");
  std::vector<std::uint16_t> t(static_cast<std::size_t>(count));
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&s] {  // splitmix64
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const auto v = static_cast<std::uint64_t>(vocab);
  const std::uint64_t jump_ids = std::min(v, kSyntheticJumpIds);
  std::uint64_t prev = next() % jump_ids;
  for (auto& x : t) {
    const std::uint64_t r = next();
    prev = (r & 3) != 0 ? (prev + 1) % v : (r >> 8) % jump_ids;  // 3 in 4: the successor
    x = static_cast<std::uint16_t>(prev);
  }
  return t;
}

// Where a reader stands: the shard and the token offset in it of rank 0's next window.
struct ShardPosition {
  std::int64_t shard = 0;
  std::int64_t offset = 0;
  bool operator==(const ShardPosition&) const = default;
};

class TokenShards {
 public:
  // paths: the shards in order (at least one); batch, seq: a window's shape; vocab: every token
  // must be below it; rank of world: this process's window of each step.
  TokenShards(std::vector<std::string> paths, std::int64_t batch, std::int64_t seq,
              std::int64_t vocab, int rank = 0, int world = 1)
      : paths_(std::move(paths)), batch_(batch), seq_(seq), vocab_(vocab), rank_(rank),
        world_(world) {
    GW_CHECK(!paths_.empty(), "TokenShards: no shard given; expected at least one file");
    GW_CHECK(batch >= 1 && seq >= 1, "TokenShards: batch ", batch, " and seq ", seq,
             "; expected both at least 1");
    GW_CHECK(batch <= (std::int64_t{1} << 40) / seq, "TokenShards: batch ", batch, " x seq ", seq,
             " tokens a window; expected at most 2^40");
    GW_CHECK(vocab >= 1 && vocab <= 65536, "TokenShards: vocab is ", vocab,
             "; expected 1 to 65536 (tokens are uint16)");
    GW_CHECK(world >= 1 && rank >= 0 && rank < world, "TokenShards: rank ", rank, " of ", world,
             "; expected 0 <= rank < world");
    // Every shard's header and size checked at once (a bad one refused by name); a shard's
    // tokens when it is opened, before any is used.
    for (const std::string& p : paths_) check(p);
    open(0);
  }

  std::int64_t batch() const { return batch_; }
  std::int64_t seq() const { return seq_; }
  std::size_t shards() const { return paths_.size(); }
  // Tokens in the current shard.
  std::int64_t shard_tokens() const { return static_cast<std::int64_t>(tokens_.size()); }

  // The next window of this rank: x [batch · seq] inputs, y [batch · seq] targets (x shifted by
  // one), as int32 row-major [batch, seq]; then moves on by world · batch · seq tokens.
  void next(std::vector<std::int32_t>& x, std::vector<std::int32_t>& y) {
    const std::int64_t n = batch_ * seq_;
    if (pos_.offset + window_end() > shard_tokens()) advance_shard();
    const std::int64_t start = pos_.offset + static_cast<std::int64_t>(rank_) * n;
    x.resize(static_cast<std::size_t>(n));
    y.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      x[static_cast<std::size_t>(i)] = tokens_[static_cast<std::size_t>(start + i)];
      y[static_cast<std::size_t>(i)] = tokens_[static_cast<std::size_t>(start + i + 1)];
    }
    pos_.offset += static_cast<std::int64_t>(world_) * n;
  }

  ShardPosition position() const { return pos_; }
  // Restores a position read by position() of a reader over the same shards and shapes.
  void seek(const ShardPosition& p) {
    GW_CHECK(p.shard >= 0 && p.shard < static_cast<std::int64_t>(paths_.size()),
             "TokenShards::seek: shard ", p.shard, " of ", paths_.size(),
             "; expected a shard of this reader");
    const std::string& path = paths_[static_cast<std::size_t>(p.shard)];
    const std::int64_t count = p.shard == pos_.shard ? shard_tokens() : read_header(path);
    GW_CHECK(p.offset >= 0 && p.offset <= count, "TokenShards::seek: offset ", p.offset, " in '",
             path, "' of ", count, " tokens; expected 0 to ", count);
    if (p.shard != pos_.shard) open(p.shard);
    pos_.offset = p.offset;
  }

  // A shard's token count from its header, checked against the file's size.
  static std::int64_t read_header(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return read_header(in, path);
  }
  // A shard's tokens, checked: the header, the size, every token below vocab.
  static std::vector<std::uint16_t> read(const std::string& path, std::int64_t vocab) {
    std::ifstream in(path, std::ios::binary);
    const std::int64_t count = read_header(in, path);
    std::vector<std::uint16_t> tokens(static_cast<std::size_t>(count));
    in.read(reinterpret_cast<char*>(tokens.data()), count * 2);
    GW_CHECK(in.good() || count == 0, "token shard '", path, "': reading its tokens failed");
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      GW_CHECK(tokens[i] < vocab, "token shard '", path, "': token ", i, " is ", tokens[i],
               "; expected below the vocabulary's ", vocab);
    }
    return tokens;
  }

 private:
  static std::int64_t read_header(std::ifstream& in, const std::string& path) {
    GW_CHECK(in.good(), "token shard '", path, "': cannot open it for reading");
    in.seekg(0, std::ios::end);
    const std::int64_t bytes = static_cast<std::int64_t>(in.tellg());
    in.seekg(0, std::ios::beg);
    const auto header_bytes = static_cast<std::int64_t>(kShardHeaderInts * sizeof(std::int32_t));
    GW_CHECK(bytes >= header_bytes, "token shard '", path, "': ", bytes,
             " bytes, shorter than the header's ", header_bytes,
             "; expected a header of 256 int32 then uint16 tokens (llm.c's format)");
    std::vector<std::int32_t> header(kShardHeaderInts);
    in.read(reinterpret_cast<char*>(header.data()), header_bytes);
    GW_CHECK(in.good(), "token shard '", path, "': reading its header failed");
    GW_CHECK(header[0] == kShardMagic, "token shard '", path, "': magic number ", header[0],
             "; expected ", kShardMagic, " (llm.c's token shard)");
    GW_CHECK(header[1] == kShardVersion, "token shard '", path, "': version ", header[1],
             "; expected ", kShardVersion);
    const std::int64_t count = header[2];
    GW_CHECK(count >= 0, "token shard '", path, "': a token count of ", count,
             "; expected at least 0");
    const std::int64_t expected = header_bytes + count * 2;
    GW_CHECK(bytes == expected, "token shard '", path, "': ", bytes, " bytes; its header says ",
             count, " tokens, expected ", expected, " bytes (",
             bytes < expected ? "the file is cut short" : "bytes after the last token", ")");
    return count;
  }
  // Tokens one step's windows span from pos_.offset (every rank's, and the last target).
  std::int64_t window_end() const {
    return static_cast<std::int64_t>(world_) * batch_ * seq_ + 1;
  }
  // The header and size of a shard, and that it holds one step's windows.
  void check(const std::string& path) const {
    const std::int64_t count = read_header(path);
    GW_CHECK(count >= window_end(), "token shard '", path, "': ",
             count, " tokens, fewer than one step's ", window_end(), " (", world_, " rank",
             world_ == 1 ? "" : "s", " x batch ", batch_, " x seq ", seq_,
             " + 1); expected a larger shard or a smaller batch");
  }
  void open(std::int64_t shard) {
    const std::string& path = paths_[static_cast<std::size_t>(shard)];
    check(path);
    tokens_ = read(path, vocab_);
    pos_ = {shard, 0};
  }
  void advance_shard() {
    const auto next = (pos_.shard + 1) % static_cast<std::int64_t>(paths_.size());
    if (next == pos_.shard) {
      pos_.offset = 0;  // one shard: back to its start
    } else {
      open(next);
    }
  }

  std::vector<std::string> paths_;
  std::int64_t batch_, seq_, vocab_;
  int rank_, world_;
  std::vector<std::uint16_t> tokens_;
  ShardPosition pos_;
};

}  // namespace graphward::examples
