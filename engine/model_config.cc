#include "engine/model_config.h"

#include <algorithm>
#include <cmath>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recfleet::engine {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view expected, double got) {
  return absl::InvalidArgumentError(
      absl::StrCat("model.", field, " must be ", expected, ", got ", got));
}

}  // namespace

const std::vector<std::string>& Fp8ModuleNames() {
  static const std::vector<std::string>* names = new std::vector<std::string>{
      "dense_proj", "dcn", "moe.gate", "moe.experts", "moe.experts.l1", "moe.experts.l2", "towers"};
  return *names;
}

const std::vector<std::string>& Fp8AttentionNames() {
  static const std::vector<std::string>* names = new std::vector<std::string>{"sequence", "cross", "pma"};
  return *names;
}

bool Fp8Recipe::HoldsAttention(const std::string& block) const {
  return std::find(attention.begin(), attention.end(), block) != attention.end();
}

bool Fp8Recipe::Holds(const std::string& linear) const {
  // Linear names as engine/model.cc and engine/layers/ give them.
  const bool expert = absl::StartsWith(linear, "moe.expert");
  for (const std::string& m : modules) {
    if ((m == "dense_proj" && linear == "dense_proj") || (m == "moe.gate" && linear == "moe.gate") ||
        (m == "dcn" && absl::StartsWith(linear, "dcn")) ||
        (m == "moe.experts" && expert) ||
        (m == "moe.experts.l1" && expert && absl::EndsWith(linear, ".l1")) ||
        (m == "moe.experts.l2" && expert && absl::EndsWith(linear, ".l2")) ||
        (m == "towers" && (absl::StartsWith(linear, "ctr.") || absl::StartsWith(linear, "cvr.")))) {
      return true;
    }
  }
  return false;
}

LinearRecipe Fp8Recipe::Recipe() const {
  const bool fp8_wgrad = fp8_weight_gradients || wgrad_hadamard_stochastic;
  LinearRecipe r{GemmPrecision::kFp8Block, GemmPrecision::kFp8Block,
                 fp8_wgrad ? GemmPrecision::kFp8Block : GemmPrecision::kBf16};
  r.wgrad_hadamard = r.wgrad_stochastic = wgrad_hadamard_stochastic;
  return r;
}

absl::Status GemLiteConfig::Validate() const {
  if (dim < 1) return Bad("dim", ">= 1", dim);
  if (heads < 1 || dim % heads != 0) return Bad("heads", "a divisor of model.dim", heads);
  if (seq_layers < 0) return Bad("seq_layers", ">= 0", seq_layers);
  if (seq_mask == attention::Mask::kSlidingWindow && seq_window < 1) {
    return Bad("seq_window", ">= 1 for the sliding-window mask", seq_window);
  }
  if (rope && (dim / heads) % 2 != 0) {
    return Bad("heads", "such that dim / heads is even when rope is on", heads);
  }
  if (pma_queries < 0) return Bad("pma_queries", ">= 0", pma_queries);
  if (dcn_layers < 0) return Bad("dcn_layers", ">= 0", dcn_layers);
  if (num_experts < 1) return Bad("num_experts", ">= 1", num_experts);
  if (expert_hidden < 1) return Bad("expert_hidden", ">= 1", expert_hidden);
  if (expert_out < 1) return Bad("expert_out", ">= 1", expert_out);
  if (tower_hidden < 1) return Bad("tower_hidden", ">= 1", tower_hidden);
  if (!(learning_rate >= 0)) return Bad("learning_rate", ">= 0", learning_rate);
  if (!(weight_decay >= 0)) return Bad("weight_decay", ">= 0", weight_decay);
  if (!(dense_grad_clip_norm >= 0) || std::isinf(dense_grad_clip_norm)) {
    return Bad("dense_grad_clip_norm", "finite and >= 0 (0: off)", dense_grad_clip_norm);
  }
  if (!(adagrad_learning_rate >= 0)) return Bad("adagrad_learning_rate", ">= 0", adagrad_learning_rate);
  if (!(embedding_init_std > 0)) return Bad("embedding_init_std", "> 0", embedding_init_std);
  for (const std::string& m : fp8.modules) {
    const std::vector<std::string>& known = Fp8ModuleNames();
    if (std::find(known.begin(), known.end(), m) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model.fp8.modules: unknown module '", m,
                                                     "'; one of ", absl::StrJoin(known, ", ")));
    }
  }
  for (const std::string& b : fp8.attention) {
    const std::vector<std::string>& known = Fp8AttentionNames();
    if (std::find(known.begin(), known.end(), b) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model.fp8.attention: unknown block '", b, "'; one of ",
                                                     absl::StrJoin(known, ", ")));
    }
    const bool present = b == "sequence" ? seq_layers > 0 : b == "cross" ? cross_attention : pma_queries > 0;
    if (!present) {
      return absl::InvalidArgumentError(absl::StrCat("model.fp8.attention: names '", b, "', which the model lacks"));
    }
    if (dim / heads != 128) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.fp8.attention: the FP8 attention kernel takes head dim 128, the model's is ", dim / heads));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<attention::Mask> ParseMask(const std::string& name) {
  if (name == "full") return attention::Mask::kNone;
  if (name == "causal") return attention::Mask::kCausal;
  if (name == "sliding_window") return attention::Mask::kSlidingWindow;
  if (name == "block") return attention::Mask::kBlock;
  return absl::InvalidArgumentError(absl::StrCat(
      "attention mask must be full, causal, sliding_window or block, got '", name, "'"));
}

absl::StatusOr<attention::Activation> ParseAttentionActivation(const std::string& name) {
  if (name == "softmax") return attention::Activation::kSoftmax;
  if (name == "gelu") return attention::Activation::kGelu;
  if (name == "silu") return attention::Activation::kSilu;
  return absl::InvalidArgumentError(
      absl::StrCat("attention activation must be softmax, gelu or silu, got '", name, "'"));
}

attention::AttentionOptions SequenceAttentionOptions(const GemLiteConfig& config) {
  attention::AttentionOptions o;
  o.activation = config.seq_activation;
  o.mask = config.seq_mask;
  o.window = config.seq_window;
  o.rope = config.rope;
  o.qk_norm = config.qk_norm;
  o.forward_precision = config.fp8.AttentionPrecision("sequence");
  o.backward_precision = config.fp8.AttentionBackwardPrecision("sequence");
  return o;
}

}  // namespace recfleet::engine
