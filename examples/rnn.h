#pragma once
// A stacked LSTM (or GRU) trained on synthetic sequences, its layers on streams of their own as a
// wavefront — the model, data and loop shared by examples/train_rnn.cpp, bench/rnn_bench.cpp and
// their tests.
//
// Cell (layer l, time t) reads the output of (l − 1, t) and the state of (l, t − 1). With
// `wavefront`, layer l's cells run on stream l: the tensors remember the stream that made them, so
// cell (l, t) waits for (l − 1, t) on its own (rule [read after write]) while layer l − 1 goes on
// with t + 1 — the diagonal wavefront of "fast and flexible RNNs" — and the backward runs each
// cell's gradient on its stream, in reverse. Task: regress a fixed random linear map of the mean of
// the inputs from the top layer's last hidden state (MSE). Optimizer: AdamW.
#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "examples/trainer.h"  // Mode, mode_name, TrainResult, run_steps

namespace graphward::examples {

// How a layer's steps are computed: the cell composed of ops (lstm_cell, sixteen ops a cell: the
// reference), the fused cell (fused_lstm_cell: two GEMMs and one kernel a cell), or each layer one
// op over all its steps (fused_lstm_layer: the input projections of every step in one GEMM, as
// cuDNN's LSTM; the layers one after another, so no wavefront).
enum class RnnCell { kComposed, kFused, kLayer };

inline const char* rnn_cell_name(RnnCell c) {
  switch (c) {
    case RnnCell::kComposed:
      return "composed";
    case RnnCell::kLayer:
      return "layer";
    case RnnCell::kFused:
      break;
  }
  return "fused";
}

struct RnnConfig {
  std::int64_t in = 16, hidden = 64, out = 4, batch = 32;
  int layers = 4, steps_in_time = 8;
  double lr = 3e-3;
  bool wavefront = true;  // ignored by RnnCell::kLayer
  RnnCell cell = RnnCell::kFused;
  bool gru = false;  // GRU cells (gru_cell, fused_gru_cell) instead of LSTM cells; no kLayer

  std::uint64_t seed = 3;
};

class RnnTrainer {
 public:
  RnnTrainer(const RnnConfig& c, Device device, Mode mode) : c_(c), device_(device), mode_(mode) {
    GW_CHECK(!(c.gru && c.cell == RnnCell::kLayer),
             "RnnTrainer: a GRU has no layer op; expected RnnCell::kFused or kComposed");
    const TensorOptions opt{DType::kFloat32, device};
    std::uint64_t seed = c.seed * 1000;
    const std::int64_t gates = (c.gru ? 3 : 4) * c.hidden;
    for (int l = 0; l < c.layers; ++l) {
      const std::int64_t in = l == 0 ? c.in : c.hidden;
      const double s = 1.0 / std::sqrt(static_cast<double>(c.hidden));
      w_ih_.push_back(uniform({gates, in}, -s, s, seed++, opt).set_requires_grad(true));
      w_hh_.push_back(uniform({gates, c.hidden}, -s, s, seed++, opt).set_requires_grad(true));
      b_ih_.push_back(zeros({gates}, opt).set_requires_grad(true));
      b_hh_.push_back(zeros({gates}, opt).set_requires_grad(true));
      if (c.wavefront && c.cell != RnnCell::kLayer && device.is_cuda()) {
        streams_.push_back(std::make_unique<Stream>(device));
      }
    }
    head_w_ = uniform({c.out, c.hidden}, -0.1, 0.1, seed++, opt).set_requires_grad(true);
    head_b_ = zeros({c.out}, opt).set_requires_grad(true);
    // Data: a few fixed batches of sequences and their targets.
    const Tensor map = randn({c.out, c.in}, c.seed * 7 + 1);
    for (int b = 0; b < 2; ++b) {
      std::vector<Tensor> xs;
      Tensor mean_x;
      for (int t = 0; t < c.steps_in_time; ++t) {
        const Tensor x = randn({c.batch, c.in}, c.seed * 7 + 2 + 100 * b + t);
        mean_x = mean_x.defined() ? add(mean_x, x) : x;
        xs.push_back(x.to(device));
      }
      {
        NoGradGuard no_grad;
        targets_.push_back(linear(mul(mean_x, 1.0 / c.steps_in_time), map).to(device));
      }
      inputs_.push_back(std::move(xs));
    }
    zero_h_ = zeros({c.batch, c.hidden}, opt);
    zero_state_ = zeros({2, c.batch, c.hidden}, opt);
    std::vector<Tensor> params;
    for (int l = 0; l < c.layers; ++l) {
      for (const Tensor* p : {&w_ih_[l], &w_hh_[l], &b_ih_[l], &b_hh_[l]}) params.push_back(*p);
    }
    params.push_back(head_w_);
    params.push_back(head_b_);
    opt_ = std::make_unique<AdamW>(params, AdamWOptions{.lr = c.lr, .weight_decay = 0.0});
    if (mode == Mode::kBackwardGraph) {
      arena_ = std::make_unique<StepArena>(device);
      bw_ = std::make_unique<BackwardGraph>(device);
    }
    GW_CHECK(mode != Mode::kStepGraphInBackward,
             "RnnTrainer: expected Mode::kEager, kBackwardGraph or kStepGraph");
    if (mode == Mode::kStepGraph) step_graph_ = std::make_unique<StepGraph>(device);
  }

  // The loss of batch `batch` (its time steps' inputs and its target).
  Tensor loss(int batch) const {
    const std::vector<Tensor>& xs = inputs_[static_cast<std::size_t>(batch)];
    return loss_of(xs, targets_[static_cast<std::size_t>(batch)]);
  }

  // The loss of the time steps' inputs `xs` ([B, in] each) against `target` ([B, out]).
  Tensor loss_of(std::span<const Tensor> xs, const Tensor& target) const {
    GW_CHECK(static_cast<int>(xs.size()) == c_.steps_in_time, "RnnTrainer: ", xs.size(),
             " inputs; expected one per time step (", c_.steps_in_time, ")");
    if (c_.cell == RnnCell::kLayer) return layer_loss(xs, target);
    if (c_.gru) {  // GRU cells, fused or composed: a layer's h the next layer's input
      const Tensor h = wavefront(xs, zero_h_, [&](const Tensor& in, const Tensor& st, int l) {
        return c_.cell == RnnCell::kFused
                   ? fused_gru_cell(in, st, w_ih_[l], w_hh_[l], b_ih_[l], b_hh_[l])
                   : gru_cell(in, st, w_ih_[l], w_hh_[l], b_ih_[l], b_hh_[l]);
      });
      return mse_loss(linear(h, head_w_, head_b_), target);
    }
    if (c_.cell == RnnCell::kFused) {  // a layer's state [2, B, H] the next one's input, in place
      const Tensor s = wavefront(xs, zero_state_, [&](const Tensor& in, const Tensor& st, int l) {
        return fused_lstm_cell(in, st, w_ih_[l], w_hh_[l], b_ih_[l], b_hh_[l]);
      });
      return mse_loss(linear(lstm_hidden(s), head_w_, head_b_), target);
    }
    const LstmState s = wavefront(
        xs, LstmState{zero_h_, zero_h_}, [&](const Tensor& in, const LstmState& st, int l) {
          return lstm_cell(in, st, w_ih_[l], w_hh_[l], b_ih_[l], b_hh_[l]);
        });
    return mse_loss(linear(s.h, head_w_, head_b_), target);
  }

  // The layers over the steps, cell (l, t) = cell(input, state of (l, t − 1), l) on layer l's
  // stream where there are streams; a layer's input is the layer below's output (its state, or
  // its h for LstmState). Returns the top layer's last state.
  template <class State, class Cell>
  State wavefront(std::span<const Tensor> xs, const State& zero, Cell cell) const {
    std::vector<State> s(static_cast<std::size_t>(c_.layers), zero);
    for (int t = 0; t < c_.steps_in_time; ++t) {
      Tensor in = xs[static_cast<std::size_t>(t)];
      for (int l = 0; l < c_.layers; ++l) {
        std::optional<StreamGuard> on;
        if (!streams_.empty()) on.emplace(*streams_[static_cast<std::size_t>(l)]);
        State& st = s[static_cast<std::size_t>(l)];
        st = cell(in, st, l);
        if constexpr (std::is_same_v<State, LstmState>) {
          in = st.h;
        } else {
          in = st;
        }
      }
    }
    return s.back();
  }

  // loss_of with a fused_lstm_layer a layer: the steps' inputs as one [T·B, in] matrix, each
  // layer's output [2, T·B, H] the next one's input; the head reads the top layer's last h.
  Tensor layer_loss(std::span<const Tensor> xs, const Tensor& target) const {
    Tensor in = concat(std::vector<Tensor>(xs.begin(), xs.end()), 0);
    for (int l = 0; l < c_.layers; ++l) {
      in = fused_lstm_layer(in, zero_state_, w_ih_[l], w_hh_[l], b_ih_[l], b_hh_[l]);
    }
    const std::int64_t bh = c_.batch * c_.hidden;
    const Tensor last_h =
        reshape(narrow(reshape(in, {1, in.numel()}), (c_.steps_in_time - 1) * bh, bh),
                {c_.batch, c_.hidden});
    return mse_loss(linear(last_h, head_w_, head_b_), target);
  }

  Tensor step(int i) {
    const int b = i % 2;
    if (mode_ == Mode::kStepGraph) {  // the batch through the graph's input slots
      std::vector<Tensor> batch = inputs_[static_cast<std::size_t>(b)];
      batch.push_back(targets_[static_cast<std::size_t>(b)]);
      return step_graph_->run(batch, [&](const std::vector<Tensor>& in) {
        const Tensor l = loss_of(std::span<const Tensor>(in).first(in.size() - 1), in.back());
        backward(l, {.grad_write = GradWrite::kOverwrite});
        opt_->step();
        return l;
      });
    }
    if (mode_ == Mode::kBackwardGraph) {
      Tensor l;
      {
        StepScope scope(*arena_);
        l = loss(b);
        bw_->backward(l, GradWrite::kOverwrite);
        if (device_.is_cuda()) arena_->record_step_end(current_stream(device_));
      }
      opt_->step();
      return l;
    }
    const Tensor l = loss(b);
    backward(l, {.grad_write = GradWrite::kOverwrite});
    opt_->step();
    return l;
  }

  // One more step's backward, replayed with a timing event around each of its steps (Note
  // [Timeline]) and written to `path` as a Chrome trace: with the wavefront, the cells' gradients
  // on their layers' streams, the diagonal in reverse. Mode::kBackwardGraph on CUDA. Returns the
  // trace's steps.
  std::vector<StepTiming> trace_backward(const std::string& path) {
    GW_CHECK(bw_ && device_.is_cuda(),
             "RnnTrainer::trace_backward: expected Mode::kBackwardGraph on a CUDA device");
    const Tensor l = loss(0);
    std::vector<StepTiming> steps = bw_->trace(l, GradWrite::kOverwrite);
    write_chrome_trace(path, steps, bw_->trace_stream_names(),
                       "train_rnn: a traced backward replay");
    return steps;
  }

  std::uint64_t captures() const {
    if (bw_) return bw_->stats().counters.captures;
    return step_graph_ ? step_graph_->counters().captures : 0;
  }
  std::uint64_t updates() const { return bw_ ? bw_->stats().counters.updates : 0; }
  std::size_t streams() const { return streams_.size(); }

 private:
  RnnConfig c_;
  Device device_;
  Mode mode_;
  std::vector<Tensor> w_ih_, w_hh_, b_ih_, b_hh_;
  Tensor head_w_, head_b_, zero_h_, zero_state_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<std::vector<Tensor>> inputs_;
  std::vector<Tensor> targets_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<StepArena> arena_;
  std::unique_ptr<BackwardGraph> bw_;
  std::unique_ptr<StepGraph> step_graph_;
};

// Eager, BackwardGraph or StepGraph (the whole step replayed: with `wavefront`, the layers'
// streams become the graph's branches, cell (l, t) after (l − 1, t) and (l, t − 1) alone).
inline TrainResult train_rnn(const RnnConfig& c, Device device, Mode mode, int steps) {
  RnnTrainer trainer(c, device, mode);
  return run_steps(trainer, device, steps);
}

}  // namespace graphward::examples
