// Two ranks that disagree (run by scripts/run_dp.sh 2, ctest label multigpu): a broadcast of
// tensors of other shapes on each rank, and a backward whose models differ, are refused on every
// rank with an error naming the other rank — before any collective could hang or mix memory — and
// the group still works after. Then rank 1 stops dead: rank 0's next synchronization with it is an
// error within the collective timeout (the group aborted), not a hang. Prints "dp_mismatch: PASS"
// on rank 0.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "graphward/dist/process_group.h"
#include "graphward/graphward.h"

namespace gw = graphward;

namespace {
// Progress on stderr (run_dp.sh prints every rank's output when they hang past GW_DP_TIMEOUT).
void say(int rank, const char* what) {
  std::fprintf(stderr, "dp_mismatch: rank %d: %s\n", rank, what);
}

// Runs `f`, which must throw a graphward::Error containing every one of `parts`.
bool refused(const char* what, const std::function<void()>& f,
             const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const gw::Error& e) {
    for (const std::string& p : parts) {
      if (std::string(e.what()).find(p) == std::string::npos) {
        std::fprintf(stderr, "dp_mismatch: %s: the message lacks \"%s\": %s\n", what, p.c_str(),
                     e.what());
        return false;
      }
    }
    return true;
  }
  std::fprintf(stderr, "dp_mismatch: %s was not refused\n", what);
  return false;
}
}  // namespace

int main() {
  try {
    gw::dist::ProcessGroup pg({.collective_timeout_s = 20});
    const int rank = pg.rank(), other = 1 - rank;
    const gw::TensorOptions f32{gw::DType::kFloat32, pg.device()};
    bool ok = pg.world_size() == 2;
    const std::string names_other = "rank(s) " + std::to_string(other);
    say(rank, "a broadcast of other shapes");
    ok = refused("a broadcast of other shapes", [&] {
      pg.broadcast({gw::zeros({64 + 8 * rank, 16}, f32)});
    }, {"the ranks disagree", names_other}) && ok;
    // The group still works: a broadcast both ranks agree on gives rank 0's values.
    const gw::Tensor same = gw::mul(gw::ones({4}, f32), static_cast<double>(rank + 1));
    pg.broadcast({same});
    for (float v : same.to_vector<float>()) ok = ok && v == 1.0f;
    // A backward of different models: refused before the first bucket is reduced.
    say(rank, "a backward of different models");
    const gw::Tensor w = gw::randn({8 + rank, 4}, 1, f32).set_requires_grad(true);
    const gw::Tensor x = gw::randn({3, 4}, 2, f32);
    ok = refused("a backward of different models", [&] {
      gw::backward(gw::sum(gw::linear(x, w)), {.reduce_gradients = &pg});
    }, {"the ranks disagree", names_other, "the same model"}) && ok;
    pg.check_identical({same}, "the broadcast tensor");
    say(rank, "the checks passed; rank 1 stops");
    // A rank that stops (as if it crashed: no destructor, no goodbye).
    if (rank == 1) std::_Exit(0);
    ok = refused("a gather with the other rank gone", [&] { (void)pg.all_gather(7); },
                 {"aborted", "make a new one on every rank"}) && ok;
    say(rank, "the gather with the other rank gone has returned");
    ok = refused("the aborted group", [&] { (void)pg.all_gather(8); },
                 {"the group was aborted"}) && ok;
    if (rank == 0) std::printf("dp_mismatch: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp_mismatch: %s\n", e.what());
    return 1;
  }
}
