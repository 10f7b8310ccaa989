#ifndef RECFLEET_SERVICES_COORDINATOR_PLAN_ADAPTER_H_
#define RECFLEET_SERVICES_COORDINATOR_PLAN_ADAPTER_H_

// Bridges the job API and the planner: a JobSpec becomes a planner
// PlanRequest, a gang placement (the workers' topology labels) becomes a
// planner Topology, and a Plan becomes process groups for the assignments,
// a one-line summary for JobStatus, and the PlanJob response message.
//
// The JobSpec describes the model by its shape (dims, layers, list lengths),
// while the planner wants parameter counts and FLOPs. The estimates below are
// deliberately simple and first-order (matrix multiplies only; biases,
// norms and activations are ignored except where stated); every one is
// listed here so a plan can be checked by hand:
//
//  * Sequence length: the spec states only each SEQUENCE feature's
//    max_length, so the history is taken at its cap: one histogram bucket at
//    L = sum of max_length over spec.model.sequence.features. Plans are
//    therefore upper bounds on attention cost and memory.
//  * Dense-stack input width d0 = sum of NUMERIC widths + the dim of every
//    ID_LIST and CANDIDATE feature's table + the sequence branch's pooled
//    output (model_dim x max(pma_queries, 1)) + model_dim per CANDIDATE
//    feature when cross layers exist.
//  * "sequence.proj" (GEMM): per layer the Q, K, V, O projections (4 D^2)
//    and a 4x feed-forward (8 D^2): params 12 D^2 per layer, 24 D^2 FLOPs
//    per token per layer; saves 10 D bf16 values per token per layer.
//  * "sequence.attention" (attention): per layer 4 D FLOPs per token pair
//    (QK^T and AV); FULL: 4 D L^2 per layer; SLIDING_WINDOW: 4 D W L;
//    BLOCK: 4 D B L with B = block_size (64). Saves 2 D values per token.
//    Both sequence modules share the checkpoint region "sequence".
//  * "cross" (GEMM): each cross layer and the PMA block project the history
//    to K and V (4 D^2 FLOPs per token) and attend q queries (4 D q FLOPs
//    per token; q = CANDIDATE features for cross layers, pma_queries for
//    PMA); Q and O projections cost 4 D^2 q per sample. Params 4 D^2 per
//    layer.
//  * MLP from width d: params sum(in x out + out), FLOPs 2 sum(in x out);
//    saves 2 bf16 values per hidden unit (pre- and post-activation).
//  * DCN (width stays d): full rank params (d^2 + d) and 2 d^2 FLOPs per
//    layer; low rank r: params (2 d r + d) and 4 d r FLOPs per layer.
//  * MoE: E experts, each an MLP from d; params E x expert + the d x E gate;
//    FLOPs top_k x expert (routed compute), activations top_k x expert.
//  * Heads: one MLP per head from the last dense width through hidden_dims
//    to one logit, named "head.ctr" / "head.cvr".
//  * Dense modules without a name are called "<kind><index>" ("dcn0",
//    "moe1"), as job.proto states.
//  * Tables: rows and dim from the spec; pooling factor = ids looked up per
//    sample over the features that use the table (1 per ID_LIST and
//    CANDIDATE feature, as the spec gives no list-length statistic;
//    max_length per SEQUENCE feature); a table any SEQUENCE feature uses is
//    unpooled (one vector per id). Access frequency 1.
//  * Batch: data.local_batch_size samples per GPU (per CPU rank).
//  * FP8 attention backward (precision.attention_backward FP8): one call's
//    temporaries of each fp8_attention block (e4m3 copies of q, dO, k, v and
//    of q, dO, k transposed, and their scales: ~4 bytes per query and 3 per
//    key per model-dim element) as its module's backward scratch (with a
//    rate table too), which the planner adds to the peak for the largest.
//  * Precision: the planner's default recipe (bf16 compute and gathers,
//    fp32 master weights, Adam, fp32 tables), with model.precision's FP8
//    modules at their measured rate (kFp8ModuleRate) and FP8 all-gathers, and its FP8
//    attention named in the plan's recipe (its time is bf16's).
//  * Parallelism hints (spec.parallelism: fsdp_group_size, replicas,
//    table_sharding_group_size) are passed on as constraints; the plan
//    explains what they cost against the planner's own choice.
//    expert_parallel is not: the planner decides EP per expert module.
//
// With a measured rate table (engine/step_rates.h) the model side comes
// from the engine instead of the estimates above: the one JobSpec builder
// (engine/job_model.h) builds the GEM-lite, engine/step_cost.h counts its
// parameters and FLOPs exactly as the engine's MFU counts them, over
// sequence lengths drawn from the dataset's length distribution (a
// synthetic:// dataset's `lengths`; a dataset file or directory this process
// can read (an absolute path on a filesystem it shares with the loader, as
// in the local cluster): the first sequence feature's lengths in up to 4,096
// rows sampled across its training file, data::SampleRowLengths; otherwise
// every history at its cap), capped at max_length. One planner module per part of the network
// (dense_proj, sequence, cross, pma, dcn, moe, towers; attention as
// "<part>.attention"), the GEMM and attention efficiencies, the optimizer's
// bandwidth, the elementwise and per-step time (other_compute_s) and the
// activation and fixed bytes all come from the table.
//
// Hardware numbers (HBM, peak FLOP/s, link speeds) are not in the worker
// labels; they come from a template Topology (DefaultHardware() or a
// topology YAML). Pure functions; thread-safe.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/job_model.h"
#include "engine/step_rates.h"
#include "planner/model.h"
#include "planner/plan.h"
#include "planner/topology.h"
#include "recfleet/v1/job.pb.h"
#include "recfleet/v1/plan.pb.h"
#include "recfleet/v1/worker_service.pb.h"
#include "services/coordinator/gang_scheduler.h"

namespace recfleet::coordinator {

// The PlanRequest for `spec` (see the estimates above). Errors
// (INVALID_ARGUMENT) name the spec field, e.g. a feature's unknown table.
absl::StatusOr<planner::PlanRequest> PlanRequestFromSpec(const ::recfleet::v1::JobSpec& spec);
// The same priced by a measured rate table (see above) for a fleet of
// `hardware` (its peak FLOP/s and HBM bandwidth turn the rates into the
// planner's efficiencies; plan on WithMeasuredPeak(hardware, *rates));
// `rates` null: the shape estimates. Also fails with the builder's error for
// a spec GEM-lite does not build. `counts`: SpecStepCounts(spec) when the
// caller has them already (null: counted here).
absl::StatusOr<planner::PlanRequest> PlanRequestFromSpec(const ::recfleet::v1::JobSpec& spec,
                                                         const engine::StepRates* rates,
                                                         const planner::Topology& hardware,
                                                         const engine::StepCounts* counts = nullptr);
// The counts (engine/step_cost.h) of the spec's GEM-lite from the one
// JobSpec builder over SpecSequenceLengths: what a rate table prices. Builds
// the model and samples the dataset: compute once per planning.
absl::StatusOr<engine::StepCounts> SpecStepCounts(const ::recfleet::v1::JobSpec& spec);
// `hardware` with its peak raised to the fastest rate of `rates` when that
// is above it: a measured rate above the stated peak means the peak is
// understated (a CPU topology calibrated with every core busy), and the
// planner's efficiencies must stay <= 1.
planner::Topology WithMeasuredPeak(planner::Topology hardware, const engine::StepRates& rates);
// Sequence lengths of up to 4,096 samples of the spec's data, as above
// (synthetic: seeded draws; a readable dataset: sampled rows; else the cap).
std::vector<int64_t> SpecSequenceLengths(const ::recfleet::v1::JobSpec& spec,
                                         const engine::JobModel& model);

// H200 nodes: 141 GB HBM, 989 TFLOP/s bf16, 4.8 TB/s HBM; NVLink 450 GB/s
// (3 us), zone RoCE 50 GB/s (10 us), cross-zone 12.5 GB/s (30 us) per GPU
// and direction. Counts are zero: TopologyFromPlacement fills them.
planner::Topology DefaultHardware();

// The fleet of one placement, in rank order, with `hardware`'s speeds and
// sizes. Nodes are runs of consecutive workers with the same node label (a
// worker without one is its own node); zones and NVLink domains are runs of
// consecutive nodes with the same label. Where labels do not nest evenly
// (nodes with different rank counts, zones of different sizes) the planner
// cannot cost the groups level by level, so the fleet is flattened: one
// node per worker, one NVLink domain per node, one zone.
absl::StatusOr<planner::Topology> TopologyFromPlacement(const Placement& placement,
                                                        const planner::Topology& hardware);

// The assignment groups of a plan over ranks 0..world-1: "world"; then
// "fsdp/<i>" (fsdp_group consecutive ranks), "replica/<j>" (ranks j, j + G,
// ...: one per FSDP shard position) when there is more than one replica,
// "expert/<module>/<i>" (ep_degree consecutive ranks) for expert-parallel
// modules, "tables/<k>" (the model-parallel all-to-all groups, mp_group
// members mp_stride apart) and, for V3, "table_shards/<k>" (v3_shard_degree
// consecutive ranks that split one group's shards).
std::vector<::recfleet::v1::ProcessGroup> PlanGroups(const planner::Plan& plan);

// One line for JobStatus.message: mesh, sparse layout, peak memory and the
// predicted step time. The plan's peak is a GPU's; for a CPU job pass
// `cpu_rank_peak_bytes` (CpuJobPeakBytes; 0: not predicted), which the line
// gives instead, as the rank's resident memory.
std::string PlanSummary(const planner::Plan& plan, std::optional<double> cpu_rank_peak_bytes = std::nullopt);

// The plan as the API message (recfleet/v1/plan.proto); its summary is
// PlanSummary(plan, cpu_rank_peak_bytes).
::recfleet::v1::Plan PlanToProto(const planner::Plan& plan,
                                 std::optional<double> cpu_rank_peak_bytes = std::nullopt);

// Plans `spec` on `placement`. Errors: INVALID_ARGUMENT (spec, hints or
// labels the adapter cannot use; a hint the fleet cannot form names its
// spec.parallelism field), FAILED_PRECONDITION with the planner's message
// when nothing fits.
absl::StatusOr<planner::Plan> PlanPlacement(const ::recfleet::v1::JobSpec& spec,
                                            const Placement& placement,
                                            const planner::Topology& hardware,
                                            const engine::StepRates* rates = nullptr,
                                            const engine::StepCounts* counts = nullptr);

// A CPU rank's peak resident bytes (what the worker reports as its peak
// memory) for `spec`, priced by a CPU rate table with measured memory terms:
// `resident_bytes` (the worker process before the job: code, libraries,
// threads; RegisterWorkerRequest.resident_memory_bytes) + the job's model
// from the one JobSpec builder: engine::StaticBytes (fp32 parameters,
// gradients and AdamW moments; tables with their Adagrad state, each whole:
// an upper bound on a rank whose plan shards them) + the table's fitted
// bytes per token and per dense element at the local batch over the
// dataset's lengths (SpecSequenceLengths; activations saved for backward,
// batch buffers) + its fitted fixed bytes (the allocator's and threads'
// overhead of a training step). A job with a readable eval set (not
// synthetic://) adds it decoded (every rank holds all of it,
// data::EstimateDecodedBytes) and, when it evaluates, prices activations at
// the larger of the local and eval batch (1,024 when unset): the eval
// forward is the training forward, whose layers keep their saved tensors;
// priced as a training step's, an upper bound on a forward without the
// backward's gradients. Not priced: the threads, connections and buffers of
// Gloo and the loader stream (measured in bench/RESULTS.md).
// FailedPrecondition for a table without memory terms; the builder's error
// for a spec GEM-lite does not build.
// `counts`: SpecStepCounts(spec) when the caller has them (null: counted).
absl::StatusOr<double> CpuRankPeakBytes(const ::recfleet::v1::JobSpec& spec, const engine::StepRates& rates,
                                        int64_t resident_bytes, const engine::StepCounts* counts = nullptr);

// The plan of `spec` on one GPU of `hardware` from the spec's shapes: what
// a run of one rank outside a coordinator (`recfleet train --local`,
// engine_bench) takes its activation checkpointing from (engine/job_model.h
// AttentionCheckpointModes). Errors as PlanPlacement's.
absl::StatusOr<::recfleet::v1::Plan> PlanOneGpu(const ::recfleet::v1::JobSpec& spec,
                                                const planner::Topology& hardware);

// The table of `rates` measured on the job's device (cuda for jobs with
// gpus_per_worker >= 1, else cpu); null when there is none.
const engine::StepRates* RatesForJob(const ::recfleet::v1::JobSpec& spec,
                                     const std::vector<engine::StepRates>& rates);

// A GroupPlanner for the scheduler: plans every job on its placement (priced
// by RatesForJob(rates)) and hands out PlanGroups with PlanSummary and the
// predicted peak: the plan's for a GPU job, CpuRankPeakBytes (over the
// placement's largest worker resident memory) for a CPU job, none for a
// CPU job without a CPU table with memory terms or a worker that reported
// no resident memory.
// `data_root`: where relative dataset paths of specs resolve, as on the
// loaders and workers (their --data_root); "" = the working directory.
// Reads the job's dataset on every call (PlanningDatasetReader, then
// PlanningDataGroupPlanner): a scheduler holding a lock reads once per job
// instead, with the two halves below.
GroupPlanner PlanningGroupPlanner(planner::Topology hardware,
                                  std::vector<engine::StepRates> rates = {},
                                  std::string data_root = "");

// What a job's plans read from its dataset. It does not depend on the
// placement, so a scheduler reads it once per job, outside its lock (file
// I/O: up to 16 blocks of the training file and of the eval set), and plans
// every placement of the job from it.
struct PlanningData {
  // SpecStepCounts of the job (its GEM-lite over the dataset's sampled
  // lengths); unset for a job without a rate table of its device, whose plan
  // takes the shape estimates and reads no data.
  std::optional<engine::StepCounts> counts;
  // The eval set decoded (data::EstimateDecodedBytes), for CpuRankPeakBytes;
  // unset without an eval set this process finds, or without a rate table.
  std::optional<double> eval_set_bytes;
};

// A CPU job's predicted peak resident bytes per rank: CpuRankPeakBytes over
// the placement's largest reported worker resident memory and `data`; 0
// when it cannot be predicted (no CPU rate table with memory terms, no
// counts read with it, or no worker that reported its resident memory).
double CpuJobPeakBytes(const ::recfleet::v1::JobSpec& spec, const Placement& placement,
                       const engine::StepRates* rates, const PlanningData& data);

// Reads the PlanningData of `spec` (already SpecForPlanning-resolved) priced
// by `rates` (RatesForJob; null: nothing is read). A dataset or eval set
// that is not where this process looks is not an error (the histories are
// taken at their cap and no eval set is counted, as SpecSequenceLengths
// says: the coordinator need not share the loaders' filesystem); one that is
// there but cannot be read is: FAILED_PRECONDITION "dataset '<path>' cannot
// be read for planning: <cause>". Also the builder's error for a spec
// GEM-lite does not build.
absl::StatusOr<PlanningData> ReadPlanningData(const ::recfleet::v1::JobSpec& spec,
                                              const engine::StepRates* rates);

// Reads a job's PlanningData from the spec it was submitted with (resolving
// its dataset under `data_root` and pricing it with RatesForJob(rates)).
using PlanningDataReader =
    std::function<absl::StatusOr<PlanningData>(const ::recfleet::v1::JobSpec& spec)>;
PlanningDataReader PlanningDatasetReader(std::vector<engine::StepRates> rates = {},
                                         std::string data_root = "");

// A GroupPlanner over a job's PlanningData: no file I/O, only the planner's
// own work on the placement. The spec is the one the job was submitted with.
using DataGroupPlanner = std::function<absl::StatusOr<GroupPlan>(
    const ::recfleet::v1::JobSpec& spec, const Placement& placement, const PlanningData& data)>;
DataGroupPlanner PlanningDataGroupPlanner(planner::Topology hardware,
                                          std::vector<engine::StepRates> rates = {},
                                          std::string data_root = "");

// `spec` with its spec.data.dataset / eval_dataset paths resolved under
// `data_root` as the loaders and workers resolve them
// (dataloader::DatasetPath), so the planner samples the files they read; `spec` itself when data_root is "".
// For planning only: the spec a job stores and hands to workers keeps the
// user's paths.
::recfleet::v1::JobSpec SpecForPlanning(const ::recfleet::v1::JobSpec& spec,
                                        const std::string& data_root);

// InvalidArgument naming the field when spec.data.dataset or
// spec.data.eval_dataset lies outside `data_root`
// (dataloader::CheckDatasetUnderRoot; "" allows every path). The
// coordinator checks it before it creates or plans a job, as the loaders and
// workers check it before they open one.
absl::Status CheckDatasetsUnderRoot(const ::recfleet::v1::JobSpec& spec, const std::string& data_root);

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_PLAN_ADAPTER_H_
