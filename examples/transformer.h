#pragma once
// A small transformer trained on synthetic sequences — the model and data of
// examples/train_transformer.cpp, its tests and bench/models_bench.cpp (modes and trainer:
// examples/trainer.h).
//
// Model (pre-norm): token embedding + learned positions -> `blocks` blocks of
// x + attention(layer_norm(x)) -> x + MLP(layer_norm(x)) (linear + GELU fused, linear) ->
// layer_norm -> linear to vocabulary logits -> fused cross-entropy; each add (positions,
// residuals) and the layer norm after it one op (add_layer_norm: a block's last residual with the
// next block's first layer norm). Attention: one linear makes Q, K and V; self_attention takes
// them as heads and returns the heads' outputs merged, for the projection — in bfloat16 on CUDA
// cuDNN's fused attention reading Q, K and V in place; otherwise split_heads (one copy each),
// scaled_dot_product_attention (scores = Q·Kᵀ/√d by one batched GEMM, the scale its alpha;
// softmax, or with `causal` the causal softmax: each position attends to itself and the positions
// before it; the weighted sum by another batched GEMM) and the heads merged (reshape +
// transpose).
// Task: at every position, predict the previous token (the first position: itself) — attention
// has to look one position back, which a causal mask allows. AdamW.
#include <cmath>
#include <cstdint>
#include <vector>

#include "examples/trainer.h"

namespace graphward::examples {

struct TransformerConfig {
  std::int64_t batch = 16, seq = 32, dim = 64, heads = 4, ff = 256, vocab = 16;
  int batches = 4;
  double lr = 3e-3;
  std::uint64_t seed = 7;
  int blocks = 1;       // transformer blocks
  bool causal = false;  // causal self-attention (each position sees itself and those before)
};

class TransformerModel {
 public:
  using Config = TransformerConfig;
  TransformerModel(const TransformerConfig& c, Device device) : c_(c) {
    GW_CHECK(c.dim % c.heads == 0, "TransformerModel: dim ", c.dim, " is not a multiple of heads ",
             c.heads, "; expected dim = heads · head size");
    GW_CHECK(c.blocks >= 1, "TransformerModel: blocks is ", c.blocks, "; expected at least 1");
    const TensorOptions opt{DType::kFloat32, device};
    std::uint64_t seed = c.seed * 1000;
    auto weight = [&](std::int64_t out, std::int64_t in) {
      const double s = 1.0 / std::sqrt(static_cast<double>(in));
      return uniform({out, in}, -s, s, seed++, opt).set_requires_grad(true);
    };
    auto param = [&](const Shape& s, double value) {
      return full(s, value, opt).set_requires_grad(true);
    };
    tok_ = mul(randn({c.vocab, c.dim}, seed++, opt), 0.5).detach().set_requires_grad(true);
    pos_ = mul(randn({c.seq, c.dim}, seed++, opt), 0.5).detach().set_requires_grad(true);
    for (int i = 0; i < c.blocks; ++i) {
      Block b;
      b.ln1_w = param({c.dim}, 1), b.ln1_b = param({c.dim}, 0);
      b.wqkv = weight(3 * c.dim, c.dim), b.bqkv = param({3 * c.dim}, 0);
      b.wo = weight(c.dim, c.dim), b.bo = param({c.dim}, 0);
      b.ln2_w = param({c.dim}, 1), b.ln2_b = param({c.dim}, 0);
      b.w1 = weight(c.ff, c.dim), b.b1 = param({c.ff}, 0);
      b.w2 = weight(c.dim, c.ff), b.b2 = param({c.dim}, 0);
      blocks_.push_back(std::move(b));
    }
    lnf_w_ = param({c.dim}, 1), lnf_b_ = param({c.dim}, 0);
    wout_ = weight(c.vocab, c.dim), bout_ = param({c.vocab}, 0);
  }

  // ids: int32 [batch, seq] -> logits [batch · seq, vocab].
  Tensor logits(const Tensor& ids) const {
    const std::int64_t B = ids.size(0), T = c_.seq, D = c_.dim, H = c_.heads;
    // The embeddings [B, T, D] plus the positions [T, D] (repeated over the batch), and the first
    // block's first layer norm: one op.
    const Block& first = blocks_.front();
    const AddLayerNorm in = add_layer_norm(embedding(tok_, ids), pos_, first.ln1_w, first.ln1_b);
    Tensor x = reshape(in.sum, {B * T, D}), normed = reshape(in.normed, {B * T, D});
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      const Block& b = blocks_[i];
      const Tensor qkv = linear(normed, b.wqkv, b.bqkv);  // [B·T, 3D]: Q, K, V side by side
      const Tensor o = self_attention(qkv, T, H, {.causal = c_.causal});  // [B·T, D]
      // Each residual add with the layer norm after it: one op (one kernel on the GPU).
      const AddLayerNorm a = add_layer_norm(x, linear(o, b.wo, b.bo), b.ln2_w, b.ln2_b);
      const Tensor f = linear(linear(a.normed, b.w1, b.b1, Activation::kGelu), b.w2, b.b2);
      const bool last = i + 1 == blocks_.size();
      const AddLayerNorm out =
          add_layer_norm(a.sum, f, last ? lnf_w_ : blocks_[i + 1].ln1_w,
                         last ? lnf_b_ : blocks_[i + 1].ln1_b);
      x = out.sum;
      normed = out.normed;
    }
    return linear(normed, wout_, bout_);
  }
  Tensor loss(const Tensor& ids, const Tensor& targets) const {
    return cross_entropy(logits(ids), targets);
  }
  // The embeddings, each block's parameters in order, the final layer norm and the classifier.
  std::vector<Tensor> params() const {
    std::vector<Tensor> p{tok_, pos_};
    for (const Block& b : blocks_) {
      p.insert(p.end(), {b.ln1_w, b.ln1_b, b.wqkv, b.bqkv, b.wo, b.bo, b.ln2_w, b.ln2_b, b.w1,
                         b.b1, b.w2, b.b2});
    }
    p.insert(p.end(), {lnf_w_, lnf_b_, wout_, bout_});
    return p;
  }

  // Random token sequences [batch, seq]; targets [batch · seq]: each position's previous token.
  static Batches data(const TransformerConfig& c, Device device) {
    Batches d;
    for (int b = 0; b < c.batches; ++b) {
      const std::vector<float> u =
          uniform({c.batch * c.seq}, 0.0, 1.0, c.seed * 7919 + 1 + static_cast<std::uint64_t>(b))
              .to_vector<float>();
      std::vector<std::int32_t> ids(u.size()), targets(u.size());
      for (std::size_t i = 0; i < u.size(); ++i) {
        ids[i] = static_cast<std::int32_t>(
            std::min<std::int64_t>(c.vocab - 1, static_cast<std::int64_t>(u[i] * c.vocab)));
      }
      for (std::size_t i = 0; i < u.size(); ++i) {
        const bool first = i % static_cast<std::size_t>(c.seq) == 0;
        targets[i] = first ? ids[i] : ids[i - 1];
      }
      d.x.push_back(from_vector(ids, {c.batch, c.seq}, device));
      d.t.push_back(from_vector(targets, {c.batch * c.seq}, device));
    }
    return d;
  }

 private:
  struct Block {
    Tensor ln1_w, ln1_b, wqkv, bqkv, wo, bo, ln2_w, ln2_b, w1, b1, w2, b2;
  };
  TransformerConfig c_;
  Tensor tok_, pos_;
  std::vector<Block> blocks_;
  Tensor lnf_w_, lnf_b_, wout_, bout_;
};

inline TrainResult train_transformer(const TransformerConfig& c, Device device, Mode mode,
                                     int steps) {
  return train<TransformerModel>(c, device, mode, steps);
}

}  // namespace graphward::examples
