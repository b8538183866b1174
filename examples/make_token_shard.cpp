// Writes a synthetic token shard in llm.c's format (examples/token_shards.h): `count` tokens below
// `vocab`, most of them their predecessor plus one, from a fixed seed — data a model can learn,
// for examples/train_gpt2 and its tests and benchmarks, with nothing downloaded.
//
//   make_token_shard OUT [--tokens N] [--vocab V] [--seed S]
#include <cstdio>
#include <string>

#include "examples/args.h"
#include "examples/token_shards.h"

namespace ex = graphward::examples;

int main(int argc, char** argv) {
  try {
    std::string out;
    std::int64_t tokens = 1 << 20, vocab = 50257, seed = 1;
    ex::ArgReader a(argc, argv);
    while (a.next()) {
      if (a.wants_help()) {
        std::printf("make_token_shard OUT [--tokens N] [--vocab V] [--seed S]\n"
                    "  writes N synthetic tokens below V (default 1048576 below 50257, seed 1) "
                    "as an llm.c token shard at OUT\n");
        return 0;
      }
      if (a.is("--tokens")) {
        tokens = ex::parse_int("--tokens", a.value(), 1, INT32_MAX);
      } else if (a.is("--vocab")) {
        vocab = ex::parse_int("--vocab", a.value(), 2, 65536);
      } else if (a.is("--seed")) {
        seed = ex::parse_int("--seed", a.value(), 0, INT64_MAX);
      } else if (a.name().rfind("--", 0) == 0) {
        throw graphward::Error("unknown flag " + a.name() + "; see --help");
      } else if (out.empty()) {
        out = a.name();
      } else {
        throw graphward::Error("a second output path '" + a.name() + "'; expected one");
      }
    }
    if (out.empty()) throw graphward::Error("no output path given; see --help");
    ex::write_token_shard(out, ex::synthetic_tokens(tokens, vocab, static_cast<std::uint64_t>(seed)));
    std::printf("make_token_shard: %lld tokens below %lld written to %s\n",
                static_cast<long long>(tokens), static_cast<long long>(vocab), out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_token_shard: %s\n", e.what());
    return 1;
  }
}
