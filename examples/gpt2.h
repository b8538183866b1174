#pragma once
// GPT-2 as llm.c trains it (its d12 is GPT-2 small, 124M parameters): the model of
// examples/train_gpt2, its tests and benchmarks.
//
// Model (pre-norm, llm.c's layout): token embedding wte [padded vocab, width] + learned positions
// wpe [seq, width] -> `depth` blocks of x + attn(ln1(x)) -> x + mlp(ln2(x)) -> ln_f -> logits by
// the token embedding itself (the output projection tied to wte: logits = x · wteᵀ, no bias) ->
// cross-entropy over the real vocabulary. Attention: one linear makes Q, K and V, causal
// self_attention (fused through cuDNN in bfloat16 on CUDA), the output projection; MLP: width ->
// 4 · width with GELU (tanh) fused into the linear -> width. Each residual add and the layer norm
// after it are one op (add_layer_norm), as in examples/transformer.h.
//
// The vocabulary is padded (llm.c: 50257 to 50304, a multiple of 128, for the GEMMs' alignment):
// wte's padded rows start at zero, no token picks them, and the loss reads only the real
// vocabulary's logits — the padded columns take no part in the softmax, as in llm.c's fused
// classifier (cross_entropy over the first `vocab` columns, read in place).
//
// Initialization as llm.c's and nanoGPT's: every matrix and both embeddings N(0, 0.02²), the two
// residual projections of a block (attention's and the MLP's output) N(0, (0.02 / √(2 · depth))²),
// biases 0, layer norms' weights 1 and biases 0.
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "examples/checkpoint.h"
#include "examples/token_shards.h"
#include "examples/trainer.h"
#include "graphward/graphward_dist.h"

namespace graphward::examples {

struct Gpt2Config {
  std::int64_t batch = 4, seq = 64;  // a micro-batch: batch sequences of seq tokens
  std::int64_t depth = 12, width = 768, heads = 12;
  std::int64_t vocab = 50257, padded_vocab = 50304;
  std::int64_t max_seq = 1024;  // wpe's rows: the longest sequence the model takes
  int batches = 4;              // fixed batches the generic trainer cycles through
  double lr = 6e-4;
  std::uint64_t seed = 1;
  // The synthetic data's tokens (examples/token_shards.h: synthetic_tokens) when batches are
  // made without a shard.
  std::uint64_t data_seed = 7;

  // GPT-2 small, llm.c's d12.
  static Gpt2Config d12() { return {}; }
};

class Gpt2Model {
 public:
  using Config = Gpt2Config;
  Gpt2Model(const Gpt2Config& c, Device device) : c_(c) {
    GW_CHECK(c.depth >= 1, "Gpt2Model: depth is ", c.depth, "; expected at least 1");
    GW_CHECK(c.width >= 1 && c.heads >= 1 && c.width % c.heads == 0, "Gpt2Model: width ", c.width,
             " and heads ", c.heads, "; expected width a multiple of heads");
    GW_CHECK(c.vocab >= 2 && c.padded_vocab >= c.vocab, "Gpt2Model: vocab ", c.vocab,
             " padded to ", c.padded_vocab, "; expected 2 <= vocab <= padded vocab");
    GW_CHECK(c.seq >= 1 && c.seq <= c.max_seq, "Gpt2Model: seq ", c.seq, " and max_seq ",
             c.max_seq, "; expected 1 <= seq <= max_seq");
    const TensorOptions opt{DType::kFloat32, device};
    std::uint64_t seed = c.seed * 1000;
    auto normal = [&](const Shape& s, double stddev) {
      return mul(randn(s, seed++, opt), stddev).detach().set_requires_grad(true);
    };
    auto param = [&](const Shape& s, double value) {
      return full(s, value, opt).set_requires_grad(true);
    };
    const double std_residual = 0.02 / std::sqrt(2.0 * static_cast<double>(c.depth));
    const std::int64_t C = c.width;
    {
      // wte: the real rows N(0, 0.02²), the padded rows 0.
      const Tensor real = mul(randn({c.vocab, C}, seed++, opt), 0.02);
      wte_ = (c.padded_vocab > c.vocab
                  ? concat({real, zeros({c.padded_vocab - c.vocab, C}, opt)}, 0)
                  : real)
                 .detach()
                 .set_requires_grad(true);
    }
    wpe_ = normal({c.max_seq, C}, 0.02);
    for (std::int64_t i = 0; i < c.depth; ++i) {
      Block b;
      b.ln1_w = param({C}, 1), b.ln1_b = param({C}, 0);
      b.qkv_w = normal({3 * C, C}, 0.02), b.qkv_b = param({3 * C}, 0);
      b.proj_w = normal({C, C}, std_residual), b.proj_b = param({C}, 0);
      b.ln2_w = param({C}, 1), b.ln2_b = param({C}, 0);
      b.fc_w = normal({4 * C, C}, 0.02), b.fc_b = param({4 * C}, 0);
      b.fc_proj_w = normal({C, 4 * C}, std_residual), b.fc_proj_b = param({C}, 0);
      blocks_.push_back(std::move(b));
    }
    lnf_w_ = param({C}, 1), lnf_b_ = param({C}, 0);
    std::vector<std::int32_t> positions(static_cast<std::size_t>(c.seq));
    for (std::int64_t t = 0; t < c.seq; ++t) positions[static_cast<std::size_t>(t)] =
        static_cast<std::int32_t>(t);
    positions_ = from_vector(positions, {c.seq}, device);
  }

  // ids: int32 [batch, seq] (the config's seq) -> logits [batch · seq, padded vocab].
  Tensor logits(const Tensor& ids) const {
    GW_CHECK(ids.dim() == 2 && ids.size(1) == c_.seq, "Gpt2Model: ids of shape ",
             shape_str(ids.shape()), "; expected [batch, ", c_.seq, "]");
    const std::int64_t B = ids.size(0), T = c_.seq, C = c_.width;
    // The positions' rows: wpe itself at the longest sequence, else its first T rows picked.
    const Tensor pos = T == c_.max_seq ? wpe_ : embedding(wpe_, positions_);
    const Block& first = blocks_.front();
    const AddLayerNorm in = add_layer_norm(embedding(wte_, ids), pos, first.ln1_w, first.ln1_b);
    Tensor x = reshape(in.sum, {B * T, C}), normed = reshape(in.normed, {B * T, C});
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      const Block& b = blocks_[i];
      const Tensor qkv = linear(normed, b.qkv_w, b.qkv_b);
      const Tensor o = self_attention(qkv, T, c_.heads, {.causal = true});
      const AddLayerNorm a = add_layer_norm(x, linear(o, b.proj_w, b.proj_b), b.ln2_w, b.ln2_b);
      const Tensor f = linear(linear(a.normed, b.fc_w, b.fc_b, Activation::kGelu), b.fc_proj_w,
                              b.fc_proj_b);
      const bool last = i + 1 == blocks_.size();
      const AddLayerNorm out = add_layer_norm(a.sum, f, last ? lnf_w_ : blocks_[i + 1].ln1_w,
                                              last ? lnf_b_ : blocks_[i + 1].ln1_b);
      x = out.sum;
      normed = out.normed;
    }
    return linear(normed, wte_);  // the tied projection
  }
  // targets: int32 [batch · seq]; the mean cross-entropy over the real vocabulary's columns.
  Tensor loss(const Tensor& ids, const Tensor& targets) const {
    return cross_entropy(logits(ids), targets, c_.vocab);
  }
  // llm.c's order: wte, wpe, each block's parameters in order, the final layer norm.
  std::vector<Tensor> params() const {
    std::vector<Tensor> p{wte_, wpe_};
    for (const Block& b : blocks_) {
      p.insert(p.end(), {b.ln1_w, b.ln1_b, b.qkv_w, b.qkv_b, b.proj_w, b.proj_b, b.ln2_w, b.ln2_b,
                         b.fc_w, b.fc_b, b.fc_proj_w, b.fc_proj_b});
    }
    p.insert(p.end(), {lnf_w_, lnf_b_});
    return p;
  }
  std::int64_t parameter_count() const {
    std::int64_t n = 0;
    for (const Tensor& t : params()) n += t.numel();
    return n;
  }
  // The same count from a config alone (llm.c's d12: 124,475,904, its padded rows included).
  static std::int64_t parameter_count(const Gpt2Config& c) {
    const std::int64_t C = c.width;
    return c.padded_vocab * C + c.max_seq * C + c.depth * (12 * C * C + 13 * C) + 2 * C;
  }
  // A training step's flops a token: 6 · parameters (without the position table) + 12 · depth ·
  // seq · width for attention's two products (nanoGPT's and llm.c's estimate; the backward 2×).
  static double flops_per_token(const Gpt2Config& c) {
    return 6.0 * static_cast<double>(parameter_count(c) - c.max_seq * c.width) +
           12.0 * static_cast<double>(c.depth * c.seq * c.width);
  }

  // `batches` windows of synthetic tokens (synthetic_tokens with the config's data seed), each
  // batch · seq inputs and their targets, the next tokens.
  static Batches data(const Gpt2Config& c, Device device) {
    const std::int64_t n = c.batch * c.seq;
    const std::vector<std::uint16_t> t =
        synthetic_tokens(n * c.batches + 1, c.vocab, c.data_seed);
    Batches d;
    for (int b = 0; b < c.batches; ++b) {
      std::vector<std::int32_t> x(static_cast<std::size_t>(n)), y(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        const auto at = static_cast<std::size_t>(b * n + i);
        x[static_cast<std::size_t>(i)] = t[at];
        y[static_cast<std::size_t>(i)] = t[at + 1];
      }
      d.x.push_back(from_vector(x, {c.batch, c.seq}, device));
      d.t.push_back(from_vector(y, {n}, device));
    }
    return d;
  }

 private:
  struct Block {
    Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc_proj_w,
        fc_proj_b;
  };
  Gpt2Config c_;
  Tensor wte_, wpe_;
  Tensor positions_;  // int32 [seq]: 0, 1, ..., seq - 1
  std::vector<Block> blocks_;
  Tensor lnf_w_, lnf_b_;
};

// How GPT-2 is trained, as llm.c trains it: AdamW (β 0.9 / 0.95, weight decay on the matrices
// only: decay_matrices_only), the learning rate warmed up and decayed on the device
// (LrSchedule), the gradients' global norm clipped on the device, `accum` micro-batches a step.
struct Gpt2TrainConfig {
  Gpt2Config model;
  int accum = 1;  // micro-batches a step, their gradients accumulated
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95;
  double clip = 1.0;  // 0: no clipping
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 0;  // 0: no schedule (the peak at every step)
  double final_lr_fraction = 0.0;
  bool bf16 = false;  // the forward under Autocast
};

// One training run: the model, AdamW and the mode's machinery. step(x, y) trains on one step's
// micro-batches (x[k] int32 [batch, seq], y[k] int32 [batch · seq], k < accum) and returns the
// step's mean loss (a device tensor; not read here). Every mode takes each step's own batch
// tensors, as a training loop does (a StepGraph copies them into its slots, Note [Step inputs]).
class Gpt2Trainer {
 public:
  // group: data parallelism (Note [Gradient reduction]): the parameters broadcast from rank 0,
  // every step's gradients averaged over the ranks inside its last micro-batch's backward (in
  // the BackwardGraph mode inside every micro-batch's: the same average, more reductions); each
  // rank reads its own windows (TokenShards' rank and world). Not owned; null: one process.
  Gpt2Trainer(const Gpt2TrainConfig& c, Device device, Mode mode,
              dist::ProcessGroup* group = nullptr)
      : c_(c), device_(device), mode_(mode), group_(group), model_(c.model, device),
        opt_(decay_matrices_only(model_.params()), adamw_options(c)) {
    if (group) {
      GW_CHECK(group->device() == device, "Gpt2Trainer: the group is on ", group->device().str(),
               ", the trainer on ", device.str(), "; expected one device");
      group->broadcast(model_.params());
    }
    GW_CHECK(c.accum >= 1, "Gpt2Trainer: accum is ", c.accum, "; expected at least 1");
    GW_CHECK(c.clip >= 0, "Gpt2Trainer: clip is ", c.clip, "; expected at least 0 (0: none)");
    GW_CHECK(mode != Mode::kStepGraphInBackward, "Gpt2Trainer: ", mode_name(mode),
             " does not accumulate micro-batches or clip; expected eager, backward or step");
    if (mode == Mode::kBackwardGraph) {
      arena_ = std::make_unique<StepArena>(device);
      bw_ = std::make_unique<BackwardGraph>(
          device, BackwardGraphOptions{.backward = {.reduce_gradients = group}});
    }
    if (mode == Mode::kStepGraph) step_graph_ = std::make_unique<StepGraph>(device);
    if (c.bf16) {  // the parameters the forward casts: one forward, nothing recorded
      NoGradGuard no_grad;
      Autocast probe;
      const Batches d = Gpt2Model::data(one_batch(c.model), device);
      (void)model_.loss(d.x.front(), d.t.front());
      cast_parameters_ = probe.cast_parameters();
    }
  }

  Tensor step(const std::vector<Tensor>& x, const std::vector<Tensor>& y) {
    GW_CHECK(x.size() == static_cast<std::size_t>(c_.accum) && y.size() == x.size(),
             "Gpt2Trainer::step: ", x.size(), " inputs and ", y.size(), " targets; expected ",
             c_.accum, " of each (accum)");
    switch (mode_) {
      case Mode::kStepGraph: {
        std::vector<Tensor> batch;
        for (std::size_t k = 0; k < x.size(); ++k) batch.insert(batch.end(), {x[k], y[k]});
        return step_graph_->run(batch, [&](const std::vector<Tensor>& in) {
          std::vector<Tensor> xs, ys;
          for (std::size_t k = 0; k < in.size(); k += 2) xs.push_back(in[k]), ys.push_back(in[k + 1]);
          return train_step(xs, ys);
        });
      }
      case Mode::kBackwardGraph: {
        Tensor loss;
        {
          StepScope scope(*arena_);
          loss = accumulate(x, y);
          if (device_.is_cuda()) arena_->record_step_end(current_stream(device_));
        }
        finish();
        return loss;
      }
      default:
        return train_step(x, y);
    }
  }

  const Gpt2Model& model() const { return model_; }
  AdamW& optimizer() { return opt_; }

  // A checkpoint (examples/checkpoint.h) of the run after `step` steps with the data reader at
  // `data`: the parameters ("param.i"), the optimizer's state ("adamw." and its names), the
  // step, the data position and the learning rate's peak.
  void save(const std::string& path, std::int64_t step, const ShardPosition& data) const {
    save_checkpoint(path, checkpoint_tensors(),
                    {{"step", step},
                     {"data.shard", data.shard},
                     {"data.offset", data.offset},
                     {"lr.bits", std::bit_cast<std::int64_t>(opt_.lr())}});
  }
  struct Resumed {
    std::int64_t step = 0;
    ShardPosition data;
  };
  // Restores a checkpoint save() wrote for this model (its parameters and state in place: a
  // captured step goes on reading them); the step and data position to go on from. A checkpoint
  // of another model or optimizer, or a damaged one, is refused by name, nothing restored.
  Resumed load(const std::string& path) {
    const std::map<std::string, std::int64_t> v =
        load_checkpoint(path, checkpoint_tensors(), {"step", "data.shard", "data.offset", "lr.bits"});
    opt_.set_lr(std::bit_cast<double>(v.at("lr.bits")));
    return {v.at("step"), {v.at("data.shard"), v.at("data.offset")}};
  }
  std::uint64_t captures() const {
    if (bw_) return bw_->stats().counters.captures;
    if (step_graph_) return step_graph_->counters().captures;
    return 0;
  }
  std::uint64_t updates() const { return bw_ ? bw_->stats().counters.updates : 0; }

 private:
  std::vector<std::pair<std::string, Tensor>> checkpoint_tensors() const {
    std::vector<std::pair<std::string, Tensor>> t;
    const std::vector<Tensor> p = model_.params();
    for (std::size_t i = 0; i < p.size(); ++i) t.emplace_back("param." + std::to_string(i), p[i]);
    for (auto& [name, tensor] : opt_.state()) t.emplace_back("adamw." + name, tensor);
    return t;
  }
  static AdamWOptions adamw_options(const Gpt2TrainConfig& c) {
    AdamWOptions o{.lr = c.model.lr, .beta1 = c.beta1, .beta2 = c.beta2,
                   .weight_decay = c.weight_decay};
    if (c.total_steps > 0) {
      o.schedule = LrSchedule{.warmup_steps = c.warmup_steps, .total_steps = c.total_steps,
                              .final_lr_fraction = c.final_lr_fraction};
    }
    return o;
  }
  static Gpt2Config one_batch(Gpt2Config m) {
    m.batches = 1;
    return m;
  }
  // The forward of one micro-batch, under Autocast where asked.
  Tensor loss_of(const Tensor& x, const Tensor& y) const {
    if (!c_.bf16) return model_.loss(x, y);
    Autocast scope(cast_parameters_);
    return model_.loss(x, y);
  }
  // Forward and backward of every micro-batch, the gradients of the mean loss accumulated in the
  // .grads (the first overwrites them); the mean loss.
  Tensor accumulate(const std::vector<Tensor>& x, const std::vector<Tensor>& y) {
    const double scale = 1.0 / static_cast<double>(x.size());
    Tensor total;
    for (std::size_t k = 0; k < x.size(); ++k) {
      const Tensor loss = x.size() == 1 ? loss_of(x[k], y[k]) : mul(loss_of(x[k], y[k]), scale);
      const GradWrite write = k == 0 ? GradWrite::kOverwrite : GradWrite::kAccumulate;
      if (bw_) {
        bw_->backward(loss, write);
      } else {
        const bool last = k + 1 == x.size();
        backward(loss, {.grad_write = write, .reduce_gradients = last ? group_ : nullptr});
      }
      total = k == 0 ? loss.detach() : add(total, loss.detach());
    }
    return total;
  }
  void finish() {
    if (c_.clip > 0) (void)clip_grad_norm(model_.params(), c_.clip);
    opt_.step();
  }
  Tensor train_step(const std::vector<Tensor>& x, const std::vector<Tensor>& y) {
    const Tensor loss = accumulate(x, y);
    finish();
    return loss;
  }

  Gpt2TrainConfig c_;
  Device device_;
  Mode mode_;
  dist::ProcessGroup* group_ = nullptr;
  Gpt2Model model_;
  AdamW opt_;
  std::vector<Tensor> cast_parameters_;
  std::unique_ptr<StepArena> arena_;
  std::unique_ptr<BackwardGraph> bw_;
  std::unique_ptr<StepGraph> step_graph_;
};

}  // namespace graphward::examples
