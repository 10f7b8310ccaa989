#ifndef RECFLEET_PLANNER_MODEL_H_
#define RECFLEET_PLANNER_MODEL_H_

// What the planner needs to know about a training job: the model as data
// (dense modules, expert modules, embedding tables, the sequence-length
// histogram), the per-GPU batch, the per-module precision recipe, the
// compute efficiencies the cost model assumes, and planner knobs.
//
// Every quantity is per step and in base units (bytes, FLOPs, seconds).
// Plain values; a JobSpec adapter fills a PlanRequest field by field.

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace recfleet::planner {

// Decides which efficiency a module's FLOPs run at.
enum class OpKind { kGemm, kAttention, kElementwise };
const char* OpKindName(OpKind op);

// A dense module: an MLP, an attention block, a cross layer, or a mixture
// of expert MLPs. Forward FLOPs per sample are
//     flops_per_sample + flops_per_token * E[L] + flops_per_token_sq * E[L^2]
// over the sequence-length histogram; backward is twice the forward.
// For an expert module (num_experts > 0) every number is the total over all
// experts; every expert sees the whole batch (a dense mixture, as DHEN).
struct DenseModule {
  std::string name;
  std::string region;  // Activation-checkpoint region; empty: the module's own.
  OpKind op = OpKind::kGemm;
  int64_t params = 0;
  int num_experts = 0;
  double flops_per_sample = 0;
  double flops_per_token = 0;
  double flops_per_token_sq = 0;
  // bf16 activations saved for backward: constant + per-token parts.
  double activation_bytes_per_sample = 0;
  double activation_bytes_per_token = 0;
  // bf16 input activation per sample: what expert parallelism all-gathers
  // (and its output, reduce-scattered) and what a checkpointed region keeps.
  double io_bytes_per_sample = 0;
  // Whether the runtime can recompute the module's region (a region is
  // recomputable when all its modules are); one that cannot keeps all its
  // activations.
  bool recomputable = true;
  // Units the runtime recomputes the region in (the identical
  // self-attention blocks of a sequence region): the region is cut in whole
  // units, and fully cut it keeps every unit's input (io_bytes_per_sample
  // each). 0: by any fraction, keeping the region's one input.
  int recompute_units = 0;
  // With recompute_units: the runtime recomputes the last unit of the
  // forward (whose backward comes first) after that backward's memory peak,
  // not before it (the engine's sequence.norm level: the norm's output is
  // read only after the attention's backward), so recomputing that unit
  // lowers the peak too.
  bool recompute_after_peak = false;
  // Temporaries one call of the module's backward allocates and frees
  // before it returns (the FP8 attention backward's operand copies), per
  // sample: not kept activations, so checkpointing does not remove them;
  // the peak holds the largest module's beside the kept activations.
  double backward_scratch_bytes_per_sample = 0;

  bool is_expert() const { return num_experts > 0; }
  const std::string& RegionName() const { return region.empty() ? name : region; }
};

// An embedding table. Each sample looks up access_frequency *
// pooling_factor ids on average; a pooled table returns one dim-wide vector
// per present feature, a sequence table (pooled = false) one per id.
struct Table {
  std::string name;
  int64_t rows = 0;
  int dim = 0;
  double pooling_factor = 1;
  double access_frequency = 1;  // Fraction of samples carrying the feature.
  bool pooled = true;
};

struct SeqLengthBucket {
  double length = 0;
  double fraction = 0;  // Fractions are normalized to sum to 1.
};

struct Model {
  std::string name;
  std::vector<DenseModule> modules;  // In forward order.
  std::vector<Table> tables;
  std::vector<SeqLengthBucket> sequence_lengths;  // Empty: no sequence.

  double MeanLength() const;
  double MeanSquaredLength() const;
  double ForwardFlopsPerSample(const DenseModule& m) const;
  double ActivationBytesPerSample(const DenseModule& m) const;
};

// Bytes per element of each tensor class; a recipe per module, never one
// global switch: fp8_modules run GEMMs at the FP8 rate and all-gather FP8
// weights (shards quantized before the gather).
struct PrecisionRecipe {
  int weight_gather_bytes = 2;      // bf16 weights on the FSDP all-gather.
  std::set<std::string> fp8_modules;
  // The fp8_modules' weights travel FP8 on the all-gather (1 byte each;
  // the workers send a layer the FP8 GEMMs do not take, a dimension not a
  // multiple of 16, at fp32, which this does not count: a few small layers);
  // false: at weight_gather_bytes like the rest (recfleet's workers gather
  // fp32 unless the job's recipe says ALL_GATHER_FP8).
  bool fp8_all_gather = true;
  // Modules whose weights travel FP8 although their GEMMs do not run FP8
  // (a CPU job's FP8 all-gather).
  std::set<std::string> fp8_gather_modules;
  // Bytes per weight of `module` on the all-gather.
  int GatherBytes(const std::string& module) const {
    const bool fp8 = (fp8_all_gather && fp8_modules.count(module)) || fp8_gather_modules.count(module);
    return fp8 ? 1 : weight_gather_bytes;
  }
  int gradient_reduce_bytes = 2;    // Reduce-scatter / all-reduce dtype.
  int master_weight_bytes = 4;      // fp32 sharded master weights.
  int gradient_shard_bytes = 4;     // fp32 sharded gradient accumulator.
  int optimizer_bytes_per_param = 8;  // Adam m and v in fp32.
  int embedding_bytes = 4;          // Table storage dtype.
  int embedding_optimizer_bytes_per_row = 4;  // Rowwise Adagrad.
  int embedding_comm_bytes = 2;     // Pooled embeddings on the all-to-all.
  int embedding_grad_bytes = 4;     // Gradient rows synced across table copies.
  // Kept (checkpointed) activations stored in FP8 at the forward/backward
  // boundary halve their bytes.
  bool fp8_kept_activations = false;
  double fp8_speedup = 2.0;  // FP8 GEMM peak over bf16.
  // The recipe as the job states it (JobSpec model.precision), shown in the
  // plan's decisions; empty: no per-layer recipe given.
  std::string recipe;
};

// Fractions of peak each kind of work reaches (measured per layer on one
// GPU; the defaults are typical H100/H200 values).
struct Efficiencies {
  double gemm = 0.6;
  double attention = 0.45;
  double elementwise = 0.25;
  double embedding = 0.5;  // Fraction of HBM bandwidth that lookups reach.
};

struct PlannerOptions {
  // Part of HBM left to the CUDA context, allocator fragmentation and NCCL.
  double hbm_reserve_fraction = 0.05;
  // GEM's placement rule: only gradient all-reduce may cross zones. When
  // false, layouts whose all-gathers or all-to-alls cross zones are
  // rejected (and reported as rejected alternatives).
  bool allow_cross_zone_non_gradient = false;
  // Table copies (V2/V3) sync touched gradient rows every this many steps.
  int embedding_sync_interval = 1;
  // Largest model-parallel (all-to-all) group for V2 and V3; 0: the zone.
  // All-to-all cost grows with every peer, so GEM keeps groups near 256 and
  // shards further with V3 instead of growing the group.
  int max_model_parallel_group = 256;
  // Narrowest column shard of a column-wise sharded table.
  int min_column_shard_dim = 32;
  // Whether collectives run beside compute (prefetched all-gathers, gradient
  // reduction behind backward; estimate.h lists the windows), as the
  // worker's FSDP units with prefetch do (worker/distributed_model.h). False
  // puts every collective on the critical path: a runtime whose collectives
  // are synchronous calls between compute (the worker with prefetch off).
  bool overlap_collectives = true;
};

// The job's parallelism hints (recfleet.v1.ParallelismHints; the same
// names under `parallelism:` in a job file). 0 means "not set: the planner
// decides". A set hint is a constraint: the plan uses exactly that size, and
// explains what it costs against the planner's own best.
struct ParallelismHints {
  int fsdp_group_size = 0;            // Ranks sharding one dense replica.
  int replicas = 0;                   // world / fsdp_group_size.
  // Ranks of one model-parallel (all-to-all) group of consecutive ranks,
  // the tables replicated across groups (V2; V1 when it is the world).
  int table_sharding_group_size = 0;

  bool Any() const { return fsdp_group_size > 0 || replicas > 0 || table_sharding_group_size > 0; }
};

struct PlanRequest {
  Model model;
  int local_batch = 0;  // Samples per GPU per step.
  PrecisionRecipe precision;
  Efficiencies efficiency;
  PlannerOptions options;
  ParallelismHints hints;
  // Measured per-GPU work the modules' FLOPs do not cover: elementwise
  // glue, kernel launches and host work per step (seconds, on the critical
  // path), and memory the activations and shards do not (workspaces, the
  // allocator's rounding; bytes). 0 without a measured rate table.
  double other_compute_s = 0;
  double other_memory_bytes = 0;
  // The job's quality gate (JobSpec model.precision.quality_gate) trains a
  // shadow copy of the model before the first step while the job's own
  // parameters, optimizer state and tables stay resident: the peak holds
  // those once more (a buffer; the gate runs on jobs of one rank only). The
  // shadow models train under the job's activation checkpointing, so their
  // activations are the job's step's, which are not live during the gate.
  bool shadow_model = false;
  // The activations already hold each rank's own lookups (the embedding
  // outputs of its batch) and its batch's ids: a rate table's fitted
  // activation terms, measured on one rank whose peak includes them. Then
  // the sparse buffers count only what an all-to-all adds beyond them (the
  // send side of the outputs and the ids, and the received partial sums of
  // row-sharded tables beyond the one copy held), and nothing on a
  // table-sharding group of one rank, which runs no all-to-all.
  bool activations_hold_lookups = false;
  // Measured cost of ranks stepping together: with more than one rank the
  // step adds rank_sync_fraction x its compute (the rate table's
  // rank_sync_overhead: waits for the slowest rank at each synchronous
  // collective, wake-ups, shared cores). 0: not measured.
  double rank_sync_fraction = 0;
  // Where the efficiencies and the two numbers above come from, shown in
  // the plan's decisions; empty: the typical defaults.
  std::string rates_source;
  // Activation checkpointing the job asks for (JobSpec
  // model.activation_memory): regions recomputed whole, and at most this
  // many bytes of kept activations per GPU (0: only HBM limits them).
  // Either way the planner still recomputes what HBM forces.
  std::set<std::string> recompute_regions;
  double activation_budget_bytes = 0;
  // How the fixes of a plan that does not fit name the user's settings:
  // the planner's model format (plan-model-*.yaml) by default, a job file's
  // JobSpec paths when the request comes from one (the coordinator's
  // adapter). Empty: the user's file has no such setting, and no fix
  // suggests it.
  struct SettingNames {
    std::string local_batch = "batch.local";
    std::string fp16_tables = "precision.embedding: fp16";
    std::string fp8_kept_activations = "precision.kept_activations: fp8";
    std::string activation_budget = "activation_memory.budget_bytes";
  };
  SettingNames setting_names;
};

// Checks names are unique and non-empty and every count, size and fraction
// is in range. Errors name the module or table and the field.
absl::Status ValidateRequest(const PlanRequest& request);

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_MODEL_H_
