#pragma once
// A small transformer block trained on synthetic sequences — the model and data of
// examples/train_transformer.cpp, its tests and bench/models_bench.cpp (modes and trainer:
// examples/trainer.h).
//
// Model (pre-norm): token embedding + learned positions -> x + attention(layer_norm(x)) ->
// x + MLP(layer_norm(x)) (linear + GELU fused, linear) -> layer_norm -> linear to vocabulary logits
// -> fused cross-entropy; each add (positions, residuals) and the layer norm after it one op
// (add_layer_norm). Attention is written with the ops: one linear makes Q, K and V;
// split_heads takes each out as heads (one copy each); scores = Q·Kᵀ / √d by one batched GEMM (bmm
// with trans_b, the scale its alpha); softmax; the weighted sum by another bmm; heads merged back
// (reshape + transpose) and projected.
// Task: at every position, predict the previous token (the first position: itself) — attention
// has to look one position back. AdamW.
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
};

class TransformerModel {
 public:
  using Config = TransformerConfig;
  TransformerModel(const TransformerConfig& c, Device device) : c_(c) {
    GW_CHECK(c.dim % c.heads == 0, "TransformerModel: dim ", c.dim, " is not a multiple of heads ",
             c.heads, "; expected dim = heads · head size");
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
    ln1_w_ = param({c.dim}, 1), ln1_b_ = param({c.dim}, 0);
    wqkv_ = weight(3 * c.dim, c.dim), bqkv_ = param({3 * c.dim}, 0);
    wo_ = weight(c.dim, c.dim), bo_ = param({c.dim}, 0);
    ln2_w_ = param({c.dim}, 1), ln2_b_ = param({c.dim}, 0);
    w1_ = weight(c.ff, c.dim), b1_ = param({c.ff}, 0);
    w2_ = weight(c.dim, c.ff), b2_ = param({c.dim}, 0);
    lnf_w_ = param({c.dim}, 1), lnf_b_ = param({c.dim}, 0);
    wout_ = weight(c.vocab, c.dim), bout_ = param({c.vocab}, 0);
  }

  // ids: int32 [batch, seq] -> logits [batch · seq, vocab].
  Tensor logits(const Tensor& ids) const {
    const std::int64_t B = ids.size(0), T = c_.seq, D = c_.dim, H = c_.heads, dh = D / H;
    // The embeddings [B, T, D] plus the positions [T, D] (repeated over the batch), and the first
    // layer norm: one op.
    const AddLayerNorm in = add_layer_norm(embedding(tok_, ids), pos_, ln1_w_, ln1_b_);
    const Tensor x = reshape(in.sum, {B * T, D});
    const Tensor qkv = linear(reshape(in.normed, {B * T, D}), wqkv_, bqkv_);
    // [B·T, 3D] -> each of Q, K, V as [B·H, T, dh], one copy each
    const Tensor q = split_heads(qkv, T, H, 0, D), k = split_heads(qkv, T, H, D, D),
                 v = split_heads(qkv, T, H, 2 * D, D);
    const Tensor p = softmax(bmm(q, k, false, true, 1.0 / std::sqrt(static_cast<double>(dh))));
    const Tensor o = reshape(transpose(reshape(bmm(p, v), {B, H, T, dh}), 1, 2), {B * T, D});
    // Each residual add with the layer norm after it: one op (one kernel on the GPU).
    const AddLayerNorm a = add_layer_norm(x, linear(o, wo_, bo_), ln2_w_, ln2_b_);
    const Tensor f = linear(linear(a.normed, w1_, b1_, Activation::kGelu), w2_, b2_);
    return linear(add_layer_norm(a.sum, f, lnf_w_, lnf_b_).normed, wout_, bout_);
  }
  Tensor loss(const Tensor& ids, const Tensor& targets) const {
    return cross_entropy(logits(ids), targets);
  }
  std::vector<Tensor> params() const {
    return {tok_, pos_,  ln1_w_, ln1_b_, wqkv_,  bqkv_,  wo_, bo_,   ln2_w_,
            ln2_b_, w1_, b1_,    w2_,    b2_,    lnf_w_, lnf_b_, wout_, bout_};
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
  TransformerConfig c_;
  Tensor tok_, pos_, ln1_w_, ln1_b_, wqkv_, bqkv_, wo_, bo_, ln2_w_, ln2_b_, w1_, b1_, w2_, b2_,
      lnf_w_, lnf_b_, wout_, bout_;
};

inline TrainResult train_transformer(const TransformerConfig& c, Device device, Mode mode,
                                     int steps) {
  return train<TransformerModel>(c, device, mode, steps);
}

}  // namespace graphward::examples
