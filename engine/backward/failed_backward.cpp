// Note [A failed backward]: what an eager backward that fails part-way undoes, and the account
// its error carries (EagerExecutor::fail_backward, declared in engine/backward/backward.h).
#include <functional>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/backward/backward.h"

namespace graphward {

// Note [A failed backward]
// A backward that fails part-way — out of memory for a gradient buffer, a kernel that cannot be
// launched, a reducer's error — must leave nothing it does not say. Leaves whose .grad this
// backward created get their undefined .grad back. A .grad that was defined before and that a
// step already wrote cannot be restored without a copy of it made every backward (memory and a
// kernel a leaf, on the path every step takes), so the error names those leaves: overwrite them
// (zero_grad, or GradWrite::kOverwrite) before a retry. The saved tensors of the steps that
// finished were freed as the backward went (as PyTorch frees them): the error says how many, and
// a later backward through those nodes is refused naming the failed backward ("run the forward
// again"); when none was freed (a failure at the first step, or retain_graph) the tape is whole
// and the backward may simply run again. The streams the backward forked are joined into the
// caller's (rule [fork and join]) before the error is thrown, and the error keeps its type
// (OutOfMemoryError, CudaError, Error; std::bad_alloc becomes OutOfMemoryError) with this account
// added. Inside a capture none of this applies: the error goes up as it was, and the capture is
// abandoned with whatever it recorded (capture_stream).
//
// Freeing the saved tensors at the end instead, so that every failure left the tape whole, was
// measured and not chosen: it raises the backward's peak memory on every step (docs/DECISIONS.md,
// "a failed backward says what it left"), for a retry that out of memory rarely allows anyway.
void EagerExecutor::fail_backward(const BackwardPlan& plan, int reached, bool release_saved,
                                  const std::vector<std::pair<int, bool>>& leaf_had_grad,
                                  const std::function<void()>& join) {
  join();
  // Steps before `reached` finished, and freed their saved tensors when asked to.
  std::size_t freed = 0;
  for (int k = 0; k < reached; ++k) {
    Node* n = plan.steps[static_cast<std::size_t>(k)].node;
    if (release_saved && n->released()) {
      n->note_released_by_failed_backward();
      ++freed;
    }
  }
  std::vector<std::string> partial;
  std::size_t reset = 0;
  for (const auto& [i, had] : leaf_had_grad) {
    const BackwardPlan::Buffer& b = plan.buffers[static_cast<std::size_t>(i)];
    if (!had) {
      if (b.leaf.grad().defined()) ++reset;
      b.leaf.grad() = Tensor();
      continue;
    }
    bool written = false;
    for (int c : b.contributors)
      written = written || (c == BackwardPlan::kSeed ? reached >= -1 : c <= reached);
    if (written) partial.push_back(b.leaf.str());
  }
  std::string account = detail::concat(
      " [the backward failed ",
      reached == -2 ? std::string("before it wrote anything")
      : reached == -1
          ? std::string("at its seeds")
          : detail::concat("at step ", reached + 1, " of ", plan.steps.size(), " (",
                           plan.steps[static_cast<std::size_t>(reached)].node->label(), ")"),
      ". ",
      freed == 0
          ? std::string(
                "Nothing was released: the tape is whole and the backward may be run again. ")
          : detail::concat("The saved tensors of the ", freed, " step", freed == 1 ? "" : "s",
                           " before it were freed as it went: run the forward again before another "
                           "backward. "));
  account += reset ? detail::concat(reset, " .grad",
                                    reset == 1 ? " it had made was" : "s it had made were",
                                    " undefined again. ")
                   : std::string();
  if (partial.empty()) {
    account += "No .grad that existed before was written.]";
  } else {
    account +=
        detail::concat(partial.size(), " .grad", partial.size() == 1 ? "" : "s",
                       " that existed before already hold part of this backward's gradient: ");
    for (std::size_t k = 0; k < partial.size() && k < 8; ++k)
      account += (k ? ", " : "") + partial[k];
    if (partial.size() > 8) account += ", ...";
    account += "; overwrite them (zero_grad, or GradWrite::kOverwrite) before running it again.]";
  }
  try {
    throw;
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(e.what() + account);
  } catch (const CudaError& e) {
    throw CudaError(e.what() + account, e.code());
  } catch (const Error& e) {
    throw Error(e.what() + account);
  } catch (const std::bad_alloc& e) {
    throw OutOfMemoryError(std::string("graphward: out of host memory (") + e.what() + ")" +
                           account);
  }
}

}  // namespace graphward
