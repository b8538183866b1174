// Hostile input, by class: the public op-level backwards, each called with every one of its tensor
// arguments replaced by a tensor of another shape, rank or dtype, or an undefined one. Each call
// refuses with a graphward::Error before writing anything, or (where the replacement is still a
// valid argument, e.g. a broadcast row) returns consistent gradients; nothing reads or writes
// outside a buffer (the sanitizer build of scripts/test.sh checks that).
#include <functional>

#include "test_util.h"

namespace graphward {
namespace {

struct Case {
  const char* name;          // as its errors name it (linear_act_backward names its activation)
  std::vector<Tensor> args;  // the valid arguments
  // Runs the backward on `args` into gradient slots it makes; returns them.
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> run;
};

Tensor r(const Shape& s, std::uint64_t seed) {
  return randn(s, seed);
}
Tensor ids(std::vector<std::int32_t> v) {
  const auto n = static_cast<std::int64_t>(v.size());
  return from_vector(v, {n});
}

std::vector<Case> cases() {
  using V = std::vector<Tensor>;
  std::vector<Case> c;
  c.push_back({"matmul_backward", {r({2, 4}, 1), r({2, 3}, 2), r({3, 4}, 3)}, [](const V& a) {
                 Tensor ga, gb;
                 matmul_backward(a[0], a[1], a[2], {&ga}, {&gb});
                 return V{ga, gb};
               }});
  c.push_back({"bmm_backward", {r({2, 2, 4}, 1), r({2, 2, 3}, 2), r({2, 3, 4}, 3)}, [](const V& a) {
                 Tensor ga, gb;
                 bmm_backward(a[0], a[1], a[2], false, false, {&ga}, {&gb});
                 return V{ga, gb};
               }});
  c.push_back({"linear_backward", {r({2, 4}, 1), r({2, 3}, 2), r({4, 3}, 3)}, [](const V& a) {
                 Tensor gx, gw, gb;
                 linear_backward(a[0], a[1], a[2], {&gx}, {&gw}, {&gb});
                 return V{gx, gw, gb};
               }});
  c.push_back({"linear_gelu_backward",
               {r({2, 4}, 1), r({2, 3}, 2), r({4, 3}, 3), r({2, 4}, 4)},
               [](const V& a) {
                 Tensor gx, gw, gb;
                 linear_act_backward(a[0], a[1], a[2], a[3], Activation::kGelu, {&gx}, {&gw},
                                     {&gb});
                 return V{gx, gw, gb};
               }});
  for (auto [name, fn] :
       {std::pair{"add_backward", &add_backward}, std::pair{"sub_backward", &sub_backward},
        std::pair{"mul_backward", &mul_backward}}) {
    c.push_back({name, {r({2, 3}, 1), r({2, 3}, 2), r({3}, 3)}, [fn](const V& a) {
                   Tensor ga, gb;
                   fn(a[0], a[1], a[2], {&ga}, {&gb});
                   return V{ga, gb};
                 }});
  }
  for (auto [name, fn] :
       {std::pair{"relu_backward", &relu_backward}, std::pair{"tanh_backward", &tanh_backward},
        std::pair{"sigmoid_backward", &sigmoid_backward},
        std::pair{"gelu_backward", &gelu_backward},
        std::pair{"softmax_backward", &softmax_backward},
        std::pair{"log_softmax_backward", &log_softmax_backward},
        std::pair{"dropout_backward", &dropout_backward}}) {
    c.push_back({name, {r({2, 3}, 1), r({2, 3}, 2)}, [fn](const V& a) {
                   Tensor gx;
                   fn(a[0], a[1], {&gx});
                   return V{gx};
                 }});
  }
  for (auto [name, fn] :
       {std::pair{"sum_backward", &sum_backward}, std::pair{"mean_backward", &mean_backward}}) {
    c.push_back({name, {r({}, 1), r({2, 3}, 2)}, [fn](const V& a) {
                   Tensor gx;
                   fn(a[0], a[1], {&gx});
                   return V{gx};
                 }});
  }
  c.push_back({"mse_loss_backward", {r({}, 1), r({2, 3}, 2), r({2, 3}, 3)}, [](const V& a) {
                 Tensor gp, gt;
                 mse_loss_backward(a[0], a[1], a[2], {&gp}, {&gt});
                 return V{gp, gt};
               }});
  c.push_back({"cross_entropy_backward",
               {r({}, 1), r({2, 3}, 2), r({2, 2}, 3), ids({0, 2})},
               [](const V& a) {
                 Tensor gl;
                 cross_entropy_backward(a[0], a[1], a[2], a[3], {&gl});
                 return V{gl};
               }});
  c.push_back({"layer_norm_backward",
               {r({2, 3}, 1), r({2, 3}, 2), r({3}, 3), r({2}, 4), ones({2})},
               [](const V& a) {
                 Tensor gx, gw, gb;
                 layer_norm_backward(a[0], a[1], a[2], a[3], a[4], {&gx}, {&gw}, {&gb});
                 return V{gx, gw, gb};
               }});
  c.push_back({"embedding_backward", {r({2, 4}, 1), r({5, 4}, 2), ids({4, 0})}, [](const V& a) {
                 Tensor gt;
                 embedding_backward(a[0], a[1], a[2], {&gt});
                 return V{gt};
               }});
  c.push_back({"conv2d_backward",
               {r({1, 2, 2, 2}, 1), r({1, 1, 4, 4}, 2), r({2, 1, 3, 3}, 3)},
               [](const V& a) {
                 Tensor gx, gw, gb;
                 conv2d_backward(a[0], a[1], a[2], {}, {&gx}, {&gw}, {&gb});
                 return V{gx, gw, gb};
               }});
  c.push_back({"max_pool2d_backward",
               {r({1, 1, 2, 2}, 1), r({1, 1, 4, 4}, 2), r({1, 1, 2, 2}, 3)},
               [](const V& a) {
                 Tensor gx;
                 max_pool2d_backward(a[0], a[1], a[2], {}, {&gx});
                 return V{gx};
               }});
  return c;
}

// The replacements tried for an argument of shape `s`.
std::vector<Tensor> replacements(const Tensor& t) {
  std::vector<Tensor> out{Tensor(), r({}, 90), r({7}, 91), r({1, 1, 1, 1, 1}, 92)};
  if (t.dtype() == DType::kInt32) {
    out.push_back(r(t.shape(), 93));                      // floats where ids are
    out.push_back(ids(std::vector<std::int32_t>(3, 0)));  // one more id
    return out;
  }
  out.push_back(zeros(t.shape(), {DType::kFloat64}));  // another dtype
  out.push_back(zeros(t.shape(), {DType::kInt32}));
  Shape more = t.shape(), fewer = t.shape(), flat{t.numel()};
  if (!more.empty()) {
    more[0] += 1;
    fewer.back() = fewer.back() > 1 ? fewer.back() - 1 : 2;
    out.push_back(r(more, 94));
    out.push_back(r(fewer, 95));
    out.push_back(r(flat, 96));
    Shape extra = t.shape();
    extra.insert(extra.begin(), 2);
    out.push_back(r(extra, 97));
  } else {
    out.push_back(r({1}, 98));
    out.push_back(r({2}, 99));
  }
  return out;
}

TEST(OpLevelBackward, EveryArgumentOfEveryOpLevelBackwardReplacedIsRefusedOrConsistent) {
  int refused = 0, accepted = 0;
  for (const Case& c : cases()) {
    ASSERT_NO_THROW(c.run(c.args)) << c.name << ": the valid call";
    for (std::size_t i = 0; i < c.args.size(); ++i) {
      for (const Tensor& bad : replacements(c.args[i])) {
        std::vector<Tensor> args = c.args;
        args[i] = bad;
        const std::string what = std::string(c.name) + " argument " + std::to_string(i) + " as " +
                                 (bad.defined() ? bad.str() : std::string("undefined"));
        try {
          for (const Tensor& g : c.run(args)) {
            if (!g.defined()) continue;
            EXPECT_EQ(g.numel(), shape_numel(g.shape())) << what;
            EXPECT_GE(g.storage()->bytes(), g.nbytes()) << what;
          }
          ++accepted;
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(c.name), std::string::npos)
              << what << ": the error does not name the op: " << e.what();
          ++refused;
        } catch (const std::exception& e) {
          ADD_FAILURE() << what << ": threw " << e.what() << ", not a graphward::Error";
        }
      }
    }
  }
  EXPECT_GT(refused, 100);
  (void)accepted;
}

}  // namespace
}  // namespace graphward
