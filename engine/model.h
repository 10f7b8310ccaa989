#ifndef RECFLEET_ENGINE_MODEL_H_
#define RECFLEET_ENGINE_MODEL_H_

// GEM-lite (DESIGN section 2): sparse part, sequence branch, cross branch,
// dense interaction with a mixture of expert MLPs, CTR and CVR heads,
// composed of the layers in engine/layers/ (each with its Forward and
// Backward on tensor views; their compute is kernel-API calls and the glue
// ops of engine/layers/ops.h). This class wires them together, keeps the
// activations of a step, and owns the optimizer step and the batch checks.
//
// T is float (training) or double (exact gradient checks). One step:
// ForwardBackward (loss, dense gradients, gradients of every embedding
// output), then ApplyUpdates (AdamW on dense parameters, rowwise Adagrad
// on the touched table rows, one fused kernel call per table). A table
// shared by several features (the item table serves the candidate and the
// history) gets one Adagrad step on its summed gradient.
//
// Deterministic: the same config, schema and batches give bit-identical
// parameters. Not thread-safe; one model per thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/batch.h"
#include "engine/layers/attention.h"  // BlockCheckpoint, BlockSavedBytes.
#include "engine/layers/embeddings.h"  // TableStorage, TableLookups.
#include "engine/layers/moe.h"  // ExpertRouter.
#include "engine/model_config.h"
#include "engine/tensor.h"

namespace recfleet::engine {

enum class Head { kCtr = 0, kCvr = 1 };

struct StepResult {
  // Mean BCE of each head that had labels (0 for a head without labels).
  double ctr_loss = 0;
  double cvr_loss = 0;
  // Model FLOPs of the step (forward + backward) from the batch's real
  // jagged lengths: 2*M*N*K per linear, the attention kernels' own count of
  // visible query/key pairs; backward counted as 2x (linear) and 2.5x
  // (attention) the forward.
  double flops = 0;
  // Forward FLOPs run again in the backward by activation checkpointing
  // (ExecutionOptions::recompute_attention_blocks); not part of `flops`.
  double recomputed_flops = 0;
  // With ExecutionOptions::defer_loss_readback: the losses above are not
  // filled yet; GemLite::ReadLosses fills them. `step` numbers the
  // ForwardBackward calls of the model (0, 1, ...).
  bool losses_pending = false;
  int64_t step = 0;

  // One self-attention block's backward (GemLite::set_report_regions).
  struct Region {
    std::string name;  // "seq<l>", block l.
    bool recomputed = false;
    layers::BlockCheckpoint checkpoint = layers::BlockCheckpoint::kNone;
    bool fp8_saved = false;
    // The block's own activations held from its forward to its backward
    // (SelfAttentionBlock::SavedBytes): ~0 when it recomputes them all.
    int64_t kept_bytes = 0;
    // The same by kind, the input included (held by the block in FP8, or
    // the model's residual-stream tensor).
    layers::BlockSavedBytes saved;
    // The most bytes in use during the block's backward, its recomputation
    // included: the CUDA pool's (CudaMemoryStats) or CpuAllocator()'s.
    int64_t peak_bytes = 0;
    // Time of the recomputation (0 without): CUDA events on the compute
    // stream, a host clock on the CPU.
    double recompute_s = 0;
  };
  std::vector<Region> regions;  // In forward order; empty unless reported.

  // The memory timeline of the step (GemLite::set_report_regions): at each
  // mark, after the device finished the work issued before it, the bytes in
  // use and the most in use since the previous mark (the first: since the
  // step began). Marks: "step_start" (what stays across steps: parameters,
  // gradients, optimizer state, tables, staged batches), then
  // "forward.<region>" after each region's forward and "backward.<region>"
  // after each region's backward (the sequence blocks' include their
  // recomputation). A region's forward growth is what it keeps for the
  // backward (plus its output); the step's peak is the largest peak, and
  // its activation memory that peak minus step_start's bytes.
  struct MemoryMark {
    std::string name;
    int64_t in_use_bytes = 0;
    int64_t peak_bytes = 0;
  };
  std::vector<MemoryMark> memory;
};

// The initial value of element (row, col) of the schema's table `table`: a
// N(0, config.embedding_init_std) draw that depends only on (config.seed,
// table, row, col), so tables split over any number of ranks start exactly
// as one rank's would.
double InitialTableValue(const GemLiteConfig& config, int table, int64_t row, int64_t col);

// Where and at which precision a model computes.
struct ExecutionOptions {
  // kCpu: the reference kernels. kCuda: every tensor (parameters, optimizer
  // state, tables, activations, batches) in device memory from
  // CudaAllocator(), every layer on the CUDA kernels, all of a step enqueued
  // on the legacy default stream with no host round trip inside it (the
  // loss is read back once, after the backward is enqueued). GemLite<float>
  // only.
  Device device = Device::kCpu;
  // CUDA only. false: fp32 throughout (GEMMs in full fp32, the fp32
  // attention kernels): the mode that matches the CPU model to fp32
  // rounding. true: every linear's GEMMs in bf16 and the attention on the
  // bf16 tensor-core kernels, with fp32 master weights and optimizer state;
  // where the attention's head dim suits those kernels (64 or 128) the
  // sequence branch's residual stream, its final norm and the q/k/v/
  // attention activations of every attention layer are bf16 too, with the
  // norms' statistics, residual adds and the gradient stream in fp32; the
  // dense interaction and the heads keep fp32 activations.
  bool bf16 = false;
  // CUDA only. false: ForwardBackward waits for the step's losses before it
  // returns (the host stops once per step). true: it only enqueues their
  // copy to pinned host memory and returns with losses_pending, so the host
  // can enqueue the update and the next step while the GPU still computes;
  // ReadLosses(result) waits for that copy when the caller wants the value
  // (a trainer: when it logs; a benchmark: one step later).
  bool defer_loss_readback = false;
  // Activation checkpointing of the sequence branch: the first this many
  // self-attention blocks (0 to config.seq_layers) keep only their input
  // and recompute the rest in the backward (SelfAttentionBlock::
  // set_recompute). The blocks are alike, so each saves the same bytes for
  // the same recompute cost; the first ones are chosen because their
  // activations would be held the longest. Gradients are unchanged.
  int recompute_attention_blocks = 0;
  // Per self-attention block (empty, or one entry per block): what it keeps
  // for its backward and recomputes (layers::BlockCheckpoint); when given it
  // replaces recompute_attention_blocks. Gradients are unchanged.
  std::vector<layers::BlockCheckpoint> attention_checkpoint;
  // The blocks that recompute anything keep their input and (when kept)
  // their attention output in FP8 (SelfAttentionBlock::set_checkpoint), and
  // on CUDA the model frees the block's bf16 input right after the block's
  // forward. Gradients then approximate the stored path's.
  bool fp8_saved_activations = false;
  // CUDA: the dense part of a training step (DCN, MoE and the towers,
  // forward and backward: fixed shapes at a fixed batch size) is captured
  // once per batch size and heads as two CUDA graphs and replayed instead of
  // being issued launch by launch (engine/cuda_device.h CudaGraphRegion).
  // Numerics are the eager path's. Off in steps with a phase timer, an
  // expert router, FP8 layers or module hooks (FSDP units: the hooks'
  // collectives are not capturable), and in Predict/Loss; a batch of another
  // size runs eagerly and re-captures. A failed capture fails the step.
  bool cuda_graphs = false;
};

// Calls at the boundaries of the model's top-level modules during a forward
// and backward (GemLite::SetModuleHooks), by module index (ModuleNames):
// the place to fetch a module's parameters just before they are needed
// and to ship its gradients as soon as they are final (FSDP units with
// prefetch, worker/distributed_model.h). An error aborts the step. On CUDA
// the calls happen as the work is enqueued: what a hook enqueues on the
// legacy default stream runs between the modules' kernels.
struct ModuleHooks {
  // Before the forward first reads module m's parameters (a module the
  // config leaves out has no parameters and no calls).
  std::function<absl::Status(int module)> before_forward;
  // Once the backward has written module m's parameter gradients for good
  // (for a head without labels: zero, right after the other head's
  // backward).
  std::function<absl::Status(int module)> after_backward;
};

template <typename T>
class GemLite {
 public:
  static absl::StatusOr<std::unique_ptr<GemLite>> Create(
      const GemLiteConfig& config, const FeatureSchema& schema,
      TableStorage storage = TableStorage::kInternal, const ExecutionOptions& execution = {});
  ~GemLite();

  // Forward and backward on `batch`; keeps the gradients for ApplyUpdates.
  // InvalidArgument when the batch does not match the schema (feature count,
  // offsets, id range) or has no labels.
  absl::StatusOr<StepResult> ForwardBackward(const Batch& batch);
  // One optimizer step with the gradients of the last ForwardBackward:
  // AdamW on the dense parameters, their gradients first clipped to global
  // norm config.dense_grad_clip_norm when it is > 0 (on CUDA without a host
  // wait), and rowwise Adagrad on the tables (never clipped).
  absl::Status ApplyUpdates();
  // Fills the losses of a result with losses_pending (no-op otherwise).
  // The losses of step s stay readable until the ForwardBackward of step
  // s + 2 (which reuses their buffer); after it: FailedPrecondition.
  absl::Status ReadLosses(StepResult* result);
  // CUDA: starts copying `next` to the device on a side stream while the
  // current step computes (the copy is taken now; a later ForwardBackward,
  // Predict or Loss of the same Batch object uses it). No-op on the CPU.
  absl::Status Prefetch(const Batch& next);
  const ExecutionOptions& execution() const;
  // Benchmarks: where the layers report their phases (embedding, attention,
  // GEMM, optimizer; layers/layer.h); null turns it off.
  void SetPhaseTimer(layers::PhaseTimer* timer);
  // Benchmarks: fill StepResult::regions and StepResult::memory. It waits
  // for the device and resets the memory peak of the model's allocator at
  // every mark of the memory timeline (CUDA: the pool's, so a caller reads
  // its own whole-step peak before turning this on).
  void set_report_regions(bool on);
  // Logits of one head, [batch.size].
  absl::StatusOr<std::vector<double>> Predict(const Batch& batch, Head head);

  // Data parallelism across processes: the gradients ForwardBackward
  // computes are those of `weight` x the mean loss (this rank's share of a
  // global batch, so gradients that meet on other ranks, such as an
  // expert's, arrive already weighted). Reported losses stay unweighted.
  // 1 (the default): the plain mean.
  void set_loss_weight(double weight);
  // Top-level modules in forward order ("dense_proj", "seq0" .. "seq<L-1>",
  // "seq.final_norm", "cross", "pma", "dcn", "moe", "ctr", "cvr"; those the
  // config leaves out are missing), and the module of each dense parameter
  // (DenseParameterNames order: each module's parameters are contiguous,
  // modules in this order).
  std::vector<std::string> ModuleNames() const;
  std::vector<int> DenseParameterModules() const;
  // Calls `hooks` at module boundaries in every later forward (Predict and
  // Loss too) and backward; empty functions: none (the default).
  void SetModuleHooks(ModuleHooks hooks);
  // Expert parallelism for the mixture of experts (layers/moe.h); not owned,
  // null (the default) computes every expert here. Every forward (Predict
  // included) then runs the router's collectives.
  void SetExpertRouter(layers::ExpertRouter* router);
  // ExecutionOptions::cuda_graphs: steps whose dense forward ran as a
  // replayed CUDA graph (0 without the option).
  int64_t cuda_graph_replays() const;

  // External tables. Per table of the schema, the bags `batch` looks up,
  // in this order: for every id-list feature on the table (schema order) one
  // bag per sample, then for every sequence field on it one single-id bag
  // per history token. The caller returns each bag's row *sum* (mean-pooled
  // features are divided by their length inside the model), as pooled[t]
  // [bags of table t, dim] on the model's device (CPU or CUDA alike).
  // InvalidArgument on a malformed batch.
  absl::StatusOr<std::vector<TableLookups>> TableLookupsOf(const Batch& batch) const;
  absl::StatusOr<StepResult> ForwardBackward(const Batch& batch, absl::Span<const TensorView> pooled);
  absl::StatusOr<std::vector<double>> Predict(const Batch& batch, Head head,
                                              absl::Span<const TensorView> pooled);
  // After ForwardBackward(batch, pooled): the gradient of the loss w.r.t.
  // pooled[t], [bags, dim] per table. Valid until the next forward.
  std::vector<TensorView> PooledGradients();

  // The loss ForwardBackward would report (sum over labelled heads), without
  // touching the stored gradients: the function a gradient check differences.
  absl::StatusOr<double> Loss(const Batch& batch);

  // Data parallelism inside one process: replicas with equal parameters run
  // ForwardBackward on disjoint parts of one batch; the primary scales its
  // gradients by its share of the samples, adds each replica's gradients
  // times that replica's share, applies the updates, and the replicas copy
  // the new parameters back. Exactly equivalent (up to float summation
  // order) to one ForwardBackward on the whole batch.
  absl::StatusOr<std::unique_ptr<GemLite>> Clone() const;
  void ScaleGradients(double weight);
  absl::Status AddGradients(const GemLite& replica, double weight);
  absl::Status CopyParametersFrom(const GemLite& primary);

  // Named views of parameters and of their gradients after ForwardBackward,
  // for gradient checks and checkpoints. Dense gradients are exact; a
  // table's gradient is assembled densely from the embedding-output
  // gradients (through the fused Adagrad kernel, see the .cc), so it is slow
  // and meant for small test tables. Once DenseParameter has handed out a
  // view (which its holder may write), every later forward re-rounds the
  // bf16 weight copies from the values instead of trusting those the AdamW
  // pass wrote.
  std::vector<std::string> DenseParameterNames() const;
  TensorView DenseParameter(const std::string& name);
  // The same view without that consequence: for reading (checkpoints,
  // fingerprints), or for a one-time write that the caller follows with
  // DenseParametersWritten(), after which the next forward re-rounds the
  // bf16 copies once.
  TensorView DenseParameterView(const std::string& name) const;
  void DenseParametersWritten();
  // CUDA: hands dense weight `name`'s FP8 form (codes [out, in] E4M3 and
  // its 128x128 tiles' scales) to the layer whose FP8 GEMMs read it; they
  // use it from then on instead of quantizing the value, until the next
  // call (layers::Linear::UseGivenFp8Weight). For a caller that writes the
  // value as those codes' dequantized values (FSDP's FP8 all-gather).
  // NotFound for an unknown name, FailedPrecondition where no FP8 GEMM
  // reads it.
  absl::Status UseFp8Weight(const std::string& name, const TensorView& codes, const TensorView& tile_scales);
  // Whether the next forward reads the bf16 weight copies as they are
  // (written by the last AdamW pass or refresh) instead of re-rounding them:
  // false on the CPU, with no copies, or with a mutable view out.
  bool Bf16CopiesTrusted() const;
  TensorView DenseGradient(const std::string& name);
  // Tables the model holds: the schema's with internal storage, 0 with
  // external storage.
  int num_tables() const;
  TensorView Table(int table);
  absl::StatusOr<Tensor> DenseTableGradient(int table);

  // Checkpoints: the optimizer state beside the parameters, on the model's
  // device. AdamW's first (moment 1) and second (moment 2) moments of a
  // dense parameter (an empty view for an unknown name), a table's rowwise
  // Adagrad accumulator [rows], and the AdamW step count (1-based steps
  // taken so far; restoring it keeps the bias correction exact).
  TensorView DenseAdamMoment(const std::string& name, int moment);
  TensorView TableMomentum(int table);
  int64_t adam_step() const;
  void set_adam_step(int64_t step);

  int64_t num_dense_parameters() const;
  int64_t num_table_parameters() const;

 private:
  struct Impl;
  explicit GemLite(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

extern template class GemLite<float>;
extern template class GemLite<double>;

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_MODEL_H_
