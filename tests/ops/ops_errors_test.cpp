// Bad input: every case is a graphward::Error naming the op, what it got and what it expected,
// and nothing is written (Note [Check, then write] in engine/ops/ops_common.h).
#include <regex>
#include <string>

#include "test_util.h"

namespace graphward {
namespace {

TEST(OpsErrors, MatmulInnerDimensionMismatchNamesBothShapes) {
  GW_EXPECT_ERROR(matmul(zeros({2, 3}), zeros({4, 5})), "matmul", "[2, 3]", "[4, 5]",
                  "a.shape[1] == b.shape[0]");
}

// Where an error was raised is named from the repository's root, however the tree was built: the
// library's own checks (an op, a header's inline check, the tensor runtime) say "[at
// <room>/<file>:<line>]", never an absolute build path.
TEST(OpsErrors, TheFileAnErrorNamesIsRelativeToTheRepository) {
  const std::regex where(
      R"( \[at (base|kernels|engine/(runtime|tape|ops|backward)|capture|dist)/)"
      R"([a-z_0-9]+\.(cpp|h|cu|cuh):[0-9]+\])");
  auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  for (const std::string& m : {message_of([] {
                                 (void)matmul(zeros({2, 3}), zeros({4, 5}));
                               }),
                               message_of([] {
                                 (void)zeros({2, 3}).view({7});
                               }),
                               message_of([] {
                                 (void)reshape(zeros({2, 3}), {4, 2});
                               }),
                               message_of([] { (void)zeros({2}).item(); })}) {
    EXPECT_TRUE(std::regex_search(m, where)) << m;
    EXPECT_EQ(m.find("[at /"), std::string::npos) << m;
  }
}

TEST(OpsErrors, MatmulNeeds2dInputs) {
  GW_EXPECT_ERROR(matmul(zeros({2, 3, 4}), zeros({4, 5})), "matmul", "[2, 3, 4]", "2-d");
}

TEST(OpsErrors, LinearWeightAndBiasShapes) {
  GW_EXPECT_ERROR(linear(zeros({2, 3}), zeros({4, 5})), "linear", "[2, 3]", "[4, 5]");
  GW_EXPECT_ERROR(linear(zeros({2, 3}), zeros({4, 3}), zeros({5})), "linear", "bias", "[5]", "[4]");
}

TEST(OpsErrors, LinearWithAnActivationNamesItselfAndItsSavedTensor) {
  GW_EXPECT_ERROR(linear(zeros({2, 3}), zeros({4, 5}), Tensor(), Activation::kGelu), "linear_gelu",
                  "[2, 3]", "[4, 5]");
  GW_EXPECT_ERROR(linear(zeros({2, 3}), zeros({4, 3}), zeros({5}), Activation::kRelu),
                  "linear_relu", "bias", "[5]", "[4]");
  // A saved tensor of the wrong shape: refused before any slot is written.
  const Tensor x = randn({2, 3}, 1), w = randn({4, 3}, 2), dy = randn({2, 4}, 3);
  Tensor gx = randn({2, 3}, 4), gw = randn({4, 3}, 5);
  const std::vector<float> gx0 = gx.to_vector<float>(), gw0 = gw.to_vector<float>();
  GW_EXPECT_ERROR(
      linear_act_backward(dy, x, w, zeros({2, 5}), Activation::kGelu, {&gx, true}, {&gw, true}),
      "linear_gelu_backward", "preactivation", "[2, 5]", "[2, 4]");
  GW_EXPECT_ERROR(
      linear_act_backward(dy, x, w, Tensor(), Activation::kRelu, {&gx, true}, {&gw, true}),
      "linear_relu_backward", "output", "undefined");
  EXPECT_EQ(gx.to_vector<float>(), gx0);
  EXPECT_EQ(gw.to_vector<float>(), gw0);
}

TEST(OpsErrors, IntegerTensorsAreIndicesOnly) {
  const Tensor ids = from_vector(std::vector<std::int32_t>{0, 1, 2}, {3});
  EXPECT_EQ(ids.dtype(), DType::kInt32);
  EXPECT_EQ(ids.to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 1, 2}));
  GW_EXPECT_ERROR(relu(ids), "relu", "int32", "floating-point");
  GW_EXPECT_ERROR(ids.set_requires_grad(true), "set_requires_grad", "integers");
  GW_EXPECT_ERROR(randn({2}, 1, {DType::kInt32}), "int32", "float32 or float64");
}

TEST(OpsErrors, CrossEntropyTargets) {
  const Tensor logits = randn({3, 4}, 1);
  GW_EXPECT_ERROR(cross_entropy(logits, from_vector(std::vector<std::int32_t>{0, 1}, {2})),
                  "cross_entropy", "int32[3]");
  GW_EXPECT_ERROR(cross_entropy(logits, zeros({3})), "cross_entropy", "float32[3]", "int32[3]");
  GW_EXPECT_ERROR(cross_entropy(logits, from_vector(std::vector<std::int32_t>{0, 4, 1}, {3})),
                  "cross_entropy", "target 1 is 4", "[0, 4)");
  GW_EXPECT_ERROR(cross_entropy(randn({3}, 2), from_vector(std::vector<std::int32_t>{0}, {1})),
                  "cross_entropy", "2-d");
}

TEST(OpsErrors, NonBroadcastableShapes) {
  GW_EXPECT_ERROR(add(zeros({2, 3}), zeros({3, 2})), "add", "[2, 3]", "[3, 2]", "broadcast");
  GW_EXPECT_ERROR(mul(zeros({2, 3}), zeros({2})), "mul", "[2, 3]", "[2]");
  // Trailing dimensions repeat only where all of them match.
  GW_EXPECT_ERROR(add(zeros({4, 2, 3}), zeros({3, 3})), "add", "[4, 2, 3]", "[3, 3]", "trailing");
  GW_EXPECT_ERROR(add(zeros({2, 3}), zeros({4, 2, 2})), "add", "[2, 3]", "[4, 2, 2]");
  GW_EXPECT_ERROR(sub(zeros({2, 3, 4}), zeros({2, 1, 4})), "sub", "[2, 3, 4]", "[2, 1, 4]");
  GW_EXPECT_ERROR(mse_loss(zeros({2, 3}), zeros({3, 2})), "mse_loss", "[2, 3]", "[3, 2]");
}

TEST(OpsErrors, DtypeMismatch) {
  GW_EXPECT_ERROR(add(zeros({2}), zeros({2}, {DType::kFloat64})), "add", "float32", "float64");
}

TEST(OpsErrors, EmptyTensor) {
  GW_EXPECT_ERROR(relu(zeros({0, 3})), "relu", "empty", "[0, 3]");
  GW_EXPECT_ERROR(sum(zeros({0})), "sum", "empty");
  GW_EXPECT_ERROR(matmul(zeros({2, 0}), zeros({0, 3})), "matmul", "empty");
}

TEST(OpsErrors, UndefinedTensor) {
  GW_EXPECT_ERROR(relu(Tensor()), "relu", "undefined");
}

TEST(OpsErrors, NonFiniteScalar) {
  GW_EXPECT_ERROR(mul(ones({2}), std::nan("")), "mul", "finite");
  GW_EXPECT_ERROR(add(ones({2}), INFINITY), "add", "finite");
  GW_EXPECT_ERROR(scale_backward(ones({2}), -INFINITY, {}), "scale_backward", "finite");
}

TEST(OpsErrors, GradOutShapeMismatch) {
  Tensor g;
  GW_EXPECT_ERROR(relu_backward(zeros({3}), zeros({4}), {&g}), "relu_backward", "[3]", "[4]");
  GW_EXPECT_ERROR(matmul_backward(zeros({2, 2}), zeros({2, 3}), zeros({3, 4}), {&g}, {}),
                  "matmul_backward", "[2, 2]", "[2, 4]");
  GW_EXPECT_ERROR(sum_backward(zeros({2}), zeros({3}), {&g}), "sum_backward", "one element");
  EXPECT_FALSE(g.defined()) << "a failed backward must not allocate its gradient";
}

TEST(OpsErrors, BadGradSlotLeavesEveryOtherSlotUntouched) {
  const Tensor x = randn({4, 3}, 1), w = randn({2, 3}, 2), dy = randn({4, 2}, 3);
  Tensor gx = full({4, 3}, 7.0);
  Tensor gw = zeros({3, 3});  // wrong shape: expected [2, 3]
  Tensor gb;
  const auto gx_version = gx.version();
  GW_EXPECT_ERROR(linear_backward(dy, x, w, {&gx, true}, {&gw}, {&gb}), "linear_backward",
                  "grad_weight", "[3, 3]", "[2, 3]");
  EXPECT_EQ(testing::values(gx), std::vector<double>(12, 7.0)) << "grad_x was written";
  EXPECT_EQ(gx.version(), gx_version);
  EXPECT_FALSE(gb.defined());
  EXPECT_EQ(testing::values(gw), std::vector<double>(9, 0.0));
}

TEST(OpsErrors, GradSlotDtypeMismatch) {
  Tensor g = zeros({3}, {DType::kFloat64});
  GW_EXPECT_ERROR(relu_backward(ones({3}), ones({3}), {&g}), "relu_backward", "grad_x", "float64",
                  "float32");
}

TEST(OpsErrors, MessageSaysWhereItWasDetected) {
  try {
    relu(Tensor());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ops_common.cpp:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace graphward
