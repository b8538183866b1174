#pragma once
// Note [Choosing a GEMM algorithm] (engine/runtime/blas.cpp): which of cuBLASLt's candidate algorithms a
// GEMM shape runs, decided once per process and device on the shape's first use.
#include <string>
#include <utility>
#include <vector>

#include "graphward/engine/runtime/device.h"

namespace graphward {

// Whether a GEMM shape's first use outside a stream capture times cuBLASLt's candidates and keeps
// the fastest (on by default; GRAPHWARD_GEMM_TUNING=0 in the environment turns it off at start).
// Off, every shape runs the heuristic's choice, the same in every process. Applies to shapes first
// used after the call; a shape's choice never changes once made.
void set_gemm_tuning(bool on);
bool gemm_tuning();

namespace debug {
// One GEMM shape's choice, as made.
struct GemmChoice {
  long long m = 0, n = 0, k = 0, batch = 1;
  bool trans_a = false, trans_b = false, bf16 = false;
  bool tf32 = false;     // float32 multiplied as TF32 (Note [TF32], engine/runtime/math_mode.h)
  std::string kind;      // "gemm", "gemm+bias_grad", or "gemm+epilogue <n>" (kernels::Epilogue)
  bool tuned = false;    // timed (else the heuristic's choice: tuning off, or first used in a
                         // capture)
  int candidates = 0;    // cuBLASLt's candidates
  int chosen = 0;        // the one run, in the heuristic's order (0: its own choice)
  double first_us = 0;   // tuned: GPU µs a launch of the heuristic's choice
  double chosen_us = 0;  // tuned: of the one chosen
  // Timed against the alternative, µs: for a fused bias gradient (kind "gemm+bias_grad") its
  // GEMM and a column sum apart, for a plain GEMM cuBLAS's own (cublasSgemm). Declined when that
  // was more than 10% faster: the alternative runs instead.
  double alternative_us = 0;
  bool declined = false;
  std::string algo;  // the one chosen, readable
  // tuned: every candidate as timed, in the heuristic's order (candidate 0 its choice): its
  // algorithm, readable, and µs a launch (infinite where it did not launch).
  std::vector<std::pair<std::string, double>> candidate_us;
};
// Every choice made on `device` so far, in the order made (empty on a build without CUDA).
std::vector<GemmChoice> gemm_choices(Device device);
}  // namespace debug

}  // namespace graphward
