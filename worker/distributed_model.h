#ifndef RECFLEET_WORKER_DISTRIBUTED_MODEL_H_
#define RECFLEET_WORKER_DISTRIBUTED_MODEL_H_

// GEM-lite trained by one rank of a job, with the parallelism of
// ../DESIGN section 3, the same code on CPU ranks (Gloo, the CPU engine) and
// on CUDA ranks (NCCL, the CUDA engine; see "Devices" below):
//   dense   the dense parameters in FSDP units, one per top-level module
//           of the model or group of them (engine::GemLite::ModuleNames:
//           "dense_proj", each self-attention block "seq<l>", "cross" =
//           the final norm, cross-attention and PMA, "dcn", "moe", "heads"
//           = both towers), each a flat buffer sharded over the rank's FSDP
//           group (all-gathered before its forward, gradients
//           reduce-scattered), replicated across the replica group (shard
//           gradients all-reduced); AdamW steps the local shards only, and
//           they are all the optimizer state this rank holds. With prefetch
//           (the default; set_prefetch) the collectives overlap the
//           compute: unit 0's all-gather starts with the step (behind the
//           table lookups), unit i+1's as soon as unit i's has arrived
//           (while unit i computes), and unit i's reduce-scatter as soon as
//           the backward has finished its gradients (while the units before
//           it compute theirs), through the engine's module hooks and the
//           communicators' started collectives (Gloo: the communicator's
//           thread; NCCL: its side stream, ordered by CUDA events, no host
//           wait); the step waits for every reduction before the
//           optimizer. Without prefetch every unit is gathered before the
//           forward and reduced after the backward, blocking: the same
//           collectives on the same data, so the same numbers;
//   sparse  the embedding tables sharded over the table group exactly as
//           the plan placed them (table-wise, row-wise on listed ranks,
//           column-wise; worker/dist/sharded_embedding.h), replicated
//           across the table-replica group, or under V3 split again over
//           the plan's "table_shards/" group (each block all-gathered for
//           the step, the whole block, not only its touched rows);
//           lookups and rowwise-Adagrad updates go through all-to-alls to
//           the owning ranks.
//   experts with an expert-parallel group (the plan's "expert/" groups),
//           each rank computes only its block of the experts, on the tokens
//           of the whole group (token all-to-all, worker/dist/
//           expert_parallel.h), and stores and steps only the parameters
//           of those experts with their AdamW moments (1/EP of the experts'
//           bytes), outside the FSDP buffer: their gradients are
//           all-reduced over the "expert_replica" group only (the ranks
//           owning the same experts in the other expert groups). GatherDense
//           all-gathers the experts over the expert group into the engine
//           model, for Predict and for export.
//           Predict (eval) computes every expert locally on those gathered
//           weights rather than through the all-to-all: the eval rounds of
//           RankRun give a rank past its slice of the eval set no batch
//           (Predict(nullptr)), while the token all-to-all needs every rank
//           of the group in every round, and the engine has no zero-token
//           MoE forward to join it with.
// Every rank's loss is the mean over its own samples; the engine weights
// its gradients by the rank's share of the global batch (known before the
// forward), so N ranks train exactly like one rank on the concatenated
// batch (up to float summation order), with any local batch sizes.
//
// Devices: every buffer lives on the device of the rank's communicators
// (the host with Gloo, the current CUDA device with NCCL): the FSDP shard,
// its AdamW moments and gradient, the gathered flat parameter and its
// gradient, the rank's experts and their optimizer state, the pooled
// embeddings and their gradients, and the table shards. On CUDA the engine
// computes on external tables fed with those device buffers; the copies
// between the flat buffers and the engine's parameters are device-to-device
// on the legacy default stream (ordered with the engine and with NCCL's
// blocking streams), and AdamW steps the device shard. Pooled rows, their
// gradients and the experts' tokens and gradients go device to device
// (sharded_embedding.h, expert_parallel.h); the ids (from the host's
// batch) are copied to the device once a step and bucketed by owner there.
// Through host memory still: with replicated or column-sliced tables, the
// served bags and gradients; counts and sizes. `world` only carries a few
// integers (host or device). Compute
// time on CUDA ends when the device has finished the backward (the step
// waits for it).
//
// Timing (Times): comm_seconds is the time the step waited on
// communication (exposed): with prefetch, the waits for a unit's gather in
// the forward and for the reductions before the optimizer; the rest of the
// forward and backward is compute. On CUDA a prefetched gather is waited
// for on the device (no host wait), so a gather that comes late shows as
// compute there.
//
// With the recipe's FP8 all-gather (config.fp8.fp8_all_gather) the weights
// of the recipe's FP8 modules that the FP8 GEMMs take travel FP8 in the
// dense all-gather, their scales from the tiles' all-reduced maxima
// (worker/dist/fp8_all_gather.h): every rank, the shard's owner included,
// trains on the same dequantized copy, while the shard and its AdamW
// moments stay fp32. The copy is quantized in the FP8 GEMMs' own
// 128x128 tiles with the whole tiles' scales, whichever rank holds which
// part. The CPU engine computes those layers in fp32 on that copy. The
// CUDA engine (NCCL ranks) runs their GEMMs in FP8 on the gathered codes
// and tile scales themselves (GemLite::UseFp8Weight): exactly the operands
// those GEMMs make of the fp32 weights without the FP8 gather, and no
// weight quantization left in the step; the dequantized copy serves the
// layers' other GEMMs (bf16 ones, eval batches the FP8 GEMMs cannot take).
// The
// experts of an expert-parallel group are not in the FSDP buffer and are
// not quantized. Each unit holding FP8 weights gathers FP8 on its own,
// prefetched like the others (the unpack runs when the unit is made
// ready); units without one gather fp32.
//
// Checkpoints are layout-independent: each shard's owner (replica 0 of it,
// of an expert block expert replica 0) records its element or row ranges
// (dense ranges of the flat vector of every parameter, experts included,
// one or two per FSDP unit;
// worker/checkpoint.h SaveDenseSlice) with values and optimizer state, and a
// restore copies whatever overlaps the restoring rank's ranges, so a
// checkpoint can be resumed under another FSDP or table layout.
//
// Not thread-safe; every rank of the job calls TrainStep / Predict /
// GatherDense together (they run collectives).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "kernels/ops/multi_tensor.h"
#include "worker/checkpoint.h"
#include "worker/comm/communicator.h"
#include "worker/dist/device_buffer.h"
#include "worker/dist/expert_parallel.h"
#include "worker/dist/fp8_all_gather.h"
#include "worker/dist/fsdp.h"
#include "worker/dist/layout.h"
#include "worker/dist/sharded_embedding.h"
#include "worker/rank_model.h"

namespace recfleet::worker {

class DistributedModel : public RankModel {
 public:
  // `groups` (the rank's four training groups) and `world` (every rank of
  // the job) are not owned and must outlive the model. `planned_tables`:
  // the plan's sharding of every schema table inside the table group (in
  // schema order); empty (no plan, e.g. a layout from hints only): a
  // balanced placement (dist::BalancedTablePlacements). InvalidArgument
  // naming the table when the plan does not fit the schema or the group,
  // and when `execution.device` is not the device of `groups`'
  // communicators (CUDA: the current device, set by the caller).
  static absl::StatusOr<std::unique_ptr<DistributedModel>> Create(
      const engine::GemLiteConfig& config, const engine::FeatureSchema& schema, const dist::TrainingGroups* groups,
      comm::Communicator* world, const std::vector<dist::PlannedTable>& planned_tables = {},
      const engine::ExecutionOptions& execution = {});
  Device device() const { return device_; }
  // Whether the mixture of experts runs expert-parallel (groups->expert()
  // of more than one rank).
  bool expert_parallel() const { return router_ != nullptr; }

  // One synchronous training step on this rank's `batch` (>= 1 sample).
  absl::StatusOr<engine::StepResult> TrainStep(const engine::Batch& batch, Times* times);
  // RankModel: `overlap` runs after the step (the step waits for the
  // device anyway, at its collectives).
  absl::StatusOr<engine::StepResult> TrainStep(const engine::Batch& batch, Times* times,
                                               const std::function<absl::Status()>& overlap) override;
  absl::Status Prefetch(const engine::Batch&) override { return absl::OkStatus(); }

  // Whether the FSDP collectives overlap the compute (see the top; on by
  // default). Every rank sets the same.
  void set_prefetch(bool on) { prefetch_ = on; }
  bool prefetch() const { return prefetch_; }
  // The FSDP units, in forward order.
  std::vector<std::string> unit_names() const;
  // Tests: appends what the step does at unit boundaries, in order:
  // "gather_start <unit>", "gather_ready <unit>", "forward <module>",
  // "backward_done <module>", "reduce_start <unit>", "reduce_ready <unit>"
  // (null: nothing, the default). Not owned.
  void set_schedule_log(std::vector<std::string>* log) { schedule_log_ = log; }

  absl::StatusOr<std::vector<double>> Predict(const engine::Batch* batch, engine::Head head) override;

  // All-gathers the current dense parameters into the engine model (done by
  // TrainStep itself; call it before Predict after the last TrainStep).
  absl::Status GatherDense() override;

  absl::Status Save(CheckpointShard* shard) override;
  absl::Status Restore(const std::vector<CheckpointShard>& shards) override;

  // Names and sizes of the dense parameters and the tables' shapes.
  const std::string& fingerprint() const { return fingerprint_; }
  engine::GemLite<float>& engine_model() { return *model_; }
  const dist::ShardedEmbeddingCollection& tables() const { return *tables_; }
  int64_t adam_step() const { return adam_step_; }
  // Bytes of the experts' parameters (all experts), of those this rank
  // stores (its own under expert parallelism, else none: they sit in the
  // FSDP shard), and of this rank's FSDP shard of the other dense
  // parameters. The AdamW moments double each.
  int64_t expert_parameter_bytes() const { return (expert_span_.second - expert_span_.first) * sizeof(float); }
  int64_t stored_expert_parameter_bytes() const { return static_cast<int64_t>(expert_value_.size()); }
  int64_t dense_shard_bytes() const { return static_cast<int64_t>(shard_.size()); }
  // Bytes this rank contributes to each dense all-gather (its FSDP shard in
  // fp32, or with the FP8 all-gather its packed slot and the tile maxima
  // all-reduced before it), and the elements of the FSDP buffer that travel
  // as FP8 (0 without it).
  int64_t dense_gather_bytes() const;
  int64_t fp8_gathered_numel() const;

 private:
  DistributedModel() = default;
  // One FSDP unit: the parameters of consecutive modules, [span) of the
  // FSDP buffer (the flat dense vector without the experts' span), sharded
  // on its own.
  struct Unit {
    std::string name;
    std::pair<int64_t, int64_t> span{0, 0};
    std::optional<dist::FsdpFlatParameter> fsdp;
    // With the recipe's FP8 all-gather, when the unit holds FP8 weights: its
    // gathers (the reductions stay fsdp's).
    std::optional<dist::Fp8AllGather> fp8;
    // The engine's names of fp8's matrices, in its order.
    std::vector<std::string> fp8_names;
    // Element offsets of its shard in shard_ (and the moments and shard_grad_),
    // of its padded buffer in full_ and full_grad_.
    int64_t shard_at = 0, full_at = 0;
    std::vector<int> params;  // Indices into dense_params_.
    int modules = 0;          // Engine modules whose parameters it holds.
  };
  // A slice of this rank's shards: [range) of the flat dense vector, at
  // element `at` of shard_.
  struct ShardSlice {
    std::pair<int64_t, int64_t> range;
    int64_t at;
  };
  // The parts of this rank's shards of every unit holding parameters (the
  // padding left out), split around the experts' span.
  std::vector<ShardSlice> ShardSlices() const;
  // FSDP buffer offset of flat dense vector offset `flat` (outside the
  // experts' span).
  int64_t Compact(int64_t flat) const {
    return flat < expert_span_.first ? flat : flat - (expert_span_.second - expert_span_.first);
  }
  // Unit u's shard and padded buffers as views.
  TensorView UnitShard(const dist::DeviceBuffer& b, int u) const;
  TensorView UnitFull(const dist::DeviceBuffer& b, int u) const;
  // Blocking all-gather of every unit into the engine model, plus this
  // rank's own experts.
  absl::Status GatherForStep();
  // Prefetch: starts unit u's all-gather; makes units [0, u] ready in the
  // engine (each waits for its gather, starts the next one, and is copied
  // in); copies unit u's gradients out and starts its reduce-scatter.
  absl::Status StartGather(int u);
  absl::Status MakeReady(int u);
  absl::Status StartReduce(int u);
  // Module hooks of the engine (prefetch).
  absl::Status BeforeForward(int module);
  absl::Status AfterBackward(int module);
  // Prefetch: waits for every reduction (replicas included) and gather.
  absl::Status FinishReductions();
  // config.dense_grad_clip_norm > 0: the clip factor of the whole model's
  // dense gradients (after the reductions) on the device, set as
  // adam->grad_scale; every rank computes the same bits (see the .cc).
  absl::Status ClipScale(AdamConfig* adam);
  // Times `fn` as exposed communication (step_wait_seconds_).
  absl::Status Waited(const std::function<absl::Status()>& fn);
  void Log(absl::string_view what, absl::string_view name) const;
  // Writes pooled rows of the tables for `lookups` (empty bags when null).
  absl::Status Lookup(const std::vector<engine::TableLookups>* lookups);
  // Copies between the engine's dense parameters or gradients (`views`, in
  // DenseParameterNames order) and the flat buffers, on the model's device:
  // unit u's in its padded buffer of `full` (full_ or full_grad_), this
  // rank's experts in `experts`; into the engine when `to_engine`.
  absl::Status CopyUnit(int u, const std::vector<TensorView>& views, const dist::DeviceBuffer& full, bool to_engine);
  // Unit u's gathered values into the engine (CopyUnit) and, when they came
  // FP8 to a CUDA engine, the gathered codes to its FP8 GEMMs.
  absl::Status UnitToEngine(int u);
  absl::Status CopyExperts(const std::vector<TensorView>& views, const dist::DeviceBuffer& experts, bool to_engine);
  // Host copies of the optimizer state this rank stores, for checkpoints.
  struct HostState {
    std::vector<float> shard, adam_m, adam_v, experts, expert_m, expert_v;
  };
  absl::StatusOr<HostState> StateToHost() const;
  absl::Status StateFromHost(const HostState& state);
  // [numel] fp32 view of a flat buffer.
  static TensorView Flat(const dist::DeviceBuffer& b, int64_t numel) { return b.View(DType::kFloat32, {numel}); }

  engine::GemLiteConfig config_;
  Device device_ = Device::kCpu;
  std::unique_ptr<engine::GemLite<float>> model_;
  const dist::TrainingGroups* groups_ = nullptr;
  comm::Communicator* world_ = nullptr;
  std::vector<Unit> units_;
  std::vector<int> module_unit_;  // Per engine module: the unit holding its parameters (-1: none).
  bool prefetch_ = true;
  // Prefetch, during a step: the started collectives per unit, the units
  // ready in the engine [0, ready_units_), the modules per unit whose
  // gradients are still to come, and the time the step waited on them.
  std::vector<std::unique_ptr<comm::PendingCollective>> gathers_, reductions_;
  int ready_units_ = 0;
  std::vector<int> grads_pending_;
  double step_wait_seconds_ = 0;
  std::vector<std::string> module_names_;
  std::vector<std::string>* schedule_log_ = nullptr;
  std::unique_ptr<dist::ShardedEmbeddingCollection> tables_;
  std::unique_ptr<dist::ExpertAllToAll> router_;  // Null without expert parallelism.
  bool records_tables_ = false;  // Whether Save records this rank's table parts.
  std::vector<TensorView> dense_params_, dense_grads_;
  std::vector<int64_t> dense_offsets_;  // Of each parameter in the flat dense vector.
  int64_t dense_numel_ = 0;             // Of the flat dense vector, experts included.
  // The experts' parameters span [expert_span_) of the flat dense vector
  // (empty at its end without expert parallelism), this rank's experts
  // [own_experts_); the FSDP buffer holds the rest, closed up (Compact).
  std::pair<int64_t, int64_t> expert_span_{0, 0}, own_experts_{0, 0};
  int64_t expert_block_numel_ = 0;  // The largest expert block of the group.
  // On the model's device (sizes in bytes): this rank's experts'
  // parameters, AdamW moments and gradients.
  dist::DeviceBuffer expert_value_, expert_m_, expert_v_, expert_grad_;
  // This rank's shards of every unit, one after another, their AdamW
  // moments and gradients; every unit's padded buffer, one after another,
  // gathered and its gradient.
  dist::DeviceBuffer shard_, adam_m_, adam_v_, shard_grad_;
  int64_t adam_step_ = 0;
  // AdamW over the shards and over this rank's experts (null: none), and
  // with gradient clipping {dense sum of squares, the experts', factor}.
  std::unique_ptr<MultiTensorAdam> shard_adam_, expert_adam_;
  dist::DeviceBuffer clip_;
  dist::DeviceBuffer full_, full_grad_;
  // Per table: this step's lookups and pooled rows (grown, never shrunk).
  std::vector<engine::TableLookups> lookups_;
  std::vector<dist::DeviceBuffer> pooled_;
  std::vector<TensorView> pooled_views_;
  std::string fingerprint_;
};

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_DISTRIBUTED_MODEL_H_
