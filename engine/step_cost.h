#ifndef RECFLEET_ENGINE_STEP_COST_H_
#define RECFLEET_ENGINE_STEP_COST_H_

// What one training step of a JobModel's GEM-lite does, counted from its
// config and the batch's sequence lengths without building the model: the
// model FLOPs exactly as the engine's FlopCounter counts them for MFU
// (engine/layers/layer.h: 2*M*N*K per linear, 4*head_dim*heads per visible
// query/key pair; model_test asserts the two agree), the parameters of each
// part of the network (what GemLite::num_dense_parameters() reports), the
// tables' storage, and the work that scales with neither (token-sized
// elementwise volume). The planner adapter prices these with a measured
// rate table (engine/step_rates.h).
//
// Pure functions; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "engine/job_model.h"

namespace recfleet::engine {

// One part of the network, in forward order: "dense_proj", "sequence"
// (the self-attention blocks and the final norm), "cross", "pma", "dcn",
// "moe" (gate and experts), "towers".
struct PartCost {
  std::string name;
  int64_t params = 0;            // Dense parameters (weights, biases, norm gains, PMA queries).
  double linear_flops = 0;       // Forward, 2*M*N*K summed over the part's linears.
  double attention_flops = 0;    // Forward, the attention kernels' count.
};

struct StepCounts {
  int64_t samples = 0;
  int64_t tokens = 0;  // History events in the batch (sum of lengths).
  std::vector<PartCost> parts;
  // Rows over all tables and the width every table shares (config.dim).
  int64_t table_rows = 0;
  int64_t dim = 0;
  // d-wide token elements the sequence branch's layers write per step:
  // tokens * dim * (seq_layers + 1). What norms, RoPE, residual adds and
  // dtype conversions stream, so their time scales with it.
  double token_elements = 0;
  // Width of the dense interaction (non-sequence tokens + PMA queries) x dim.
  int64_t interaction_dim = 0;
  // Activation elements of the dense interaction per step: samples x (the
  // interaction width at the DCN's input, every cross layer and the MoE's
  // input, plus every expert's hidden and output units and the towers').
  double dense_elements = 0;

  double LinearFlops() const;
  double AttentionFlops() const;
  int64_t DenseParams() const;
  // Forward + backward, as StepResult::flops: 3x linear, 3.5x attention.
  double StepFlops() const { return 3.0 * LinearFlops() + 3.5 * AttentionFlops(); }
};

// The step on a batch whose samples have these history lengths (after the
// model's max_length truncation).
StepCounts CountStep(const JobModel& model, absl::Span<const int64_t> lengths);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_STEP_COST_H_
