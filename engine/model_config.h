#ifndef RECFLEET_ENGINE_MODEL_CONFIG_H_
#define RECFLEET_ENGINE_MODEL_CONFIG_H_

// GEM-lite hyperparameters as a plain struct (DESIGN section 2). The
// feature schema (tables, id-list features, sequence fields) comes from the
// dataset; this struct says how big each part of the network is and how it
// is trained. Front ends fill it: the local trainer's YAML today
// (engine/job_yaml.h), the job spec proto later, each through a small
// adapter; Validate() is the one place that checks it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attention/attention.h"
#include "kernels/gemm/linear.h"
#include "kernels/ops/activation.h"

namespace recfleet::engine {

// The linear layers that run FP8 (the JobSpec's model.precision, see
// proto/recfleet/v1/job.proto PrecisionRecipe): by module, with 1x128 /
// 128x128 block scales (LinearRecipe's kFp8Block). Every other linear layer
// keeps the model's precision. On CUDA the GEMMs run cuBLASLt's block-scaled
// FP8; a CPU model computes the same numerics with the reference kernels
// (bit-identical quantization, products in double): slow, for tests that
// check a recipe in CI. CPU jobs still refuse fp8_modules at submit
// (job_model.h): their workers compute in fp32.
struct Fp8Recipe {
  // PrecisionRecipe.fp8_modules names: "dense_proj", "dcn", "moe.gate",
  // "moe.experts", "moe.experts.l1", "moe.experts.l2", "towers".
  std::vector<std::string> modules;
  bool fp8_weight_gradients = false;  // Else the FP8 modules' dW GEMMs run bf16.
  // FP8 weight gradients (implied, whatever fp8_weight_gradients says) after
  // a 128-point random Hadamard transform of dy and x along the token
  // dimension, dy rounded stochastically (LinearRecipe::wgrad_hadamard and
  // wgrad_stochastic): outliers spread over each group of 128 tokens, and an
  // unbiased dW. Each layer draws new signs and rounding for every forward
  // (engine/layers/linear.h). Costs one more transform pass per wgrad
  // operand.
  bool wgrad_hadamard_stochastic = false;
  // The FSDP all-gather carries these modules' weights (".w") as FP8 with
  // their scales (worker/dist/fp8_all_gather.h); master weights stay fp32.
  bool fp8_all_gather = false;
  // PrecisionRecipe.fp8_attention names: "sequence", "cross", "pma". Their
  // attention forward runs the FP8 E4M3 kernel
  // (attention::ForwardPrecision::kFp8E4M3); the backward stays bf16 unless
  // attention_backward.
  std::vector<std::string> attention;
  // PrecisionRecipe.attention_backward = ATTENTION_BACKWARD_FP8: those
  // blocks' attention backward runs FP8 E4M3 as well
  // (attention::BackwardPrecision::kFp8E4M3).
  bool attention_backward = false;

  bool empty() const { return modules.empty() && attention.empty(); }
  // Whether the attention block `block` ("sequence", "cross", "pma") runs
  // its attention forward in FP8.
  bool HoldsAttention(const std::string& block) const;
  // The attention forward precision of `block`.
  attention::ForwardPrecision AttentionPrecision(const std::string& block) const {
    return HoldsAttention(block) ? attention::ForwardPrecision::kFp8E4M3 : attention::ForwardPrecision::kBf16;
  }
  // The attention backward precision of `block`.
  attention::BackwardPrecision AttentionBackwardPrecision(const std::string& block) const {
    return HoldsAttention(block) && attention_backward ? attention::BackwardPrecision::kFp8E4M3
                                                       : attention::BackwardPrecision::kBf16;
  }
  // Whether the linear layer named `linear` (its parameter name without
  // ".w": "dcn0", "moe.expert3.l1", "ctr.l1") belongs to a named module.
  bool Holds(const std::string& linear) const;
  // The GEMM recipe of an FP8 layer (its seed is the layer's to set).
  LinearRecipe Recipe() const;
};

// The module names Fp8Recipe::modules accepts, in the model's forward order.
const std::vector<std::string>& Fp8ModuleNames();
// The block names Fp8Recipe::attention accepts, in the model's forward order.
const std::vector<std::string>& Fp8AttentionNames();

struct GemLiteConfig {
  // Width of every embedding and token; a multiple of `heads`.
  int64_t dim = 16;
  int64_t heads = 2;

  // Sequence branch: `seq_layers` pre-norm self-attention blocks over the
  // jagged history.
  int seq_layers = 1;
  attention::Mask seq_mask = attention::Mask::kNone;
  int64_t seq_window = 16;  // Width of Mask::kSlidingWindow.
  attention::Activation seq_activation = attention::Activation::kSoftmax;
  bool rope = true;
  bool qk_norm = false;

  // Cross branch: the non-sequence tokens (one per id-list feature, plus one
  // for the numeric features) attend to the history; `pma_queries` learned
  // queries pool it (0: no PMA).
  bool cross_attention = true;
  int pma_queries = 2;

  // Dense interaction: DCN-style cross layers x_{l+1} = x0 * (W x_l + b) + x_l
  // on the concatenated tokens, then a softmax-gated mixture of expert MLPs
  // (in -> expert_hidden -> expert_out), then per-head towers
  // (expert_out -> tower_hidden -> 1).
  int dcn_layers = 1;
  int num_experts = 2;
  int64_t expert_hidden = 64;
  int64_t expert_out = 32;
  int64_t tower_hidden = 16;
  Activation mlp_activation = Activation::kRelu;

  // Optimizers: AdamW on dense parameters, rowwise Adagrad on tables.
  double learning_rate = 2e-3;
  double weight_decay = 0.0;
  // > 0: before each AdamW step the dense gradients are clipped to this
  // global L2 norm (PyTorch's clip_grad_norm_: scaled by
  // min(1, c / (norm + 1e-6)), a non-finite norm passed on as it does,
  // kernels/ops/grad_clip.h); over the whole model's dense gradients, also
  // when they are sharded over ranks. Tables (rowwise Adagrad) are not
  // clipped. 0: off.
  double dense_grad_clip_norm = 0.0;
  double adagrad_learning_rate = 0.05;
  double embedding_init_std = 0.05;
  uint64_t seed = 1;

  Fp8Recipe fp8;  // Linear layers in FP8; empty: none.

  // InvalidArgument naming the first bad field and its accepted range.
  absl::Status Validate() const;
};

// The attention options of the sequence branch's self-attention blocks.
attention::AttentionOptions SequenceAttentionOptions(const GemLiteConfig& config);

// Stable names for logs and config files.
absl::StatusOr<attention::Mask> ParseMask(const std::string& name);
absl::StatusOr<attention::Activation> ParseAttentionActivation(const std::string& name);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_MODEL_CONFIG_H_
