#include "services/coordinator/plan_adapter.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "data/dataset_file.h"
#include "engine/job_model.h"
#include "engine/step_cost.h"
#include "planner/planner.h"
#include "services/dataloader/job_loader.h"

namespace recfleet::coordinator {

using ::recfleet::v1::JobSpec;
using ::recfleet::v1::ProcessGroup;
namespace v1 = ::recfleet::v1;

namespace {

constexpr double kBf16 = 2;  // Bytes per saved activation value.
// A GPU worker's FP8 modules against bf16, per GEMM FLOP, their activation
// and weight quantization included, from config B's GEMM phase (M = 1,024
// rows) on an H200 (bench/RESULTS.md, 2026-12-04): 3.81-3.84 ms in bf16
// against 4.09 ms with the FP8 modules, which carry ~80% of the phase's
// GEMM FLOPs, so 1 / (1 + 0.26 / (0.8 * 3.83)) = 0.92. FP8 GEMMs alone reach
// ~1.56x on large square shapes; at the engine's batch sizes the weights'
// quantization and the block-scaled GEMMs' lower rate at M = 1,024 take
// that back, so the estimate keeps the measured rate, not the datasheet's.
constexpr double kFp8ModuleRate = 0.92;

// Fills `m` as an MLP from `in` through `dims`; returns the output width.
int64_t FillMlp(int64_t in, const std::vector<int64_t>& dims, planner::DenseModule* m) {
  double params = 0, macs = 0, units = 0;
  for (int64_t out : dims) {
    params += static_cast<double>(in * out + out);
    macs += static_cast<double>(in * out);
    units += static_cast<double>(out);
    in = out;
  }
  m->params = static_cast<int64_t>(params);
  m->flops_per_sample = 2 * macs;
  m->activation_bytes_per_sample = 2 * units * kBf16;
  return in;
}

std::vector<int64_t> Dims(const google::protobuf::RepeatedField<int32_t>& dims) {
  return std::vector<int64_t>(dims.begin(), dims.end());
}

// Consecutive runs of equal keys; empty when a key reappears after another.
std::vector<int> Runs(const std::vector<std::string>& keys) {
  std::vector<int> runs;
  std::set<std::string> seen;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0 && keys[i] == keys[i - 1]) {
      ++runs.back();
      continue;
    }
    if (!seen.insert(keys[i]).second) return {};
    runs.push_back(1);
  }
  return runs;
}

// The common value of `runs`, or 0 when they differ or are empty.
int Uniform(const std::vector<int>& runs) {
  if (runs.empty()) return 0;
  for (int r : runs) {
    if (r != runs[0]) return 0;
  }
  return runs[0];
}

// Groups of `size` members `stride` apart tiling ranks 0..world-1.
void AddTiling(const std::string& prefix, int world, int size, int stride,
               std::vector<ProcessGroup>* out) {
  if (size <= 0 || stride <= 0 || world % (size * stride) != 0) return;
  int index = 0;
  for (int block = 0; block < world; block += size * stride) {
    for (int offset = 0; offset < stride; ++offset) {
      ProcessGroup g;
      g.set_name(absl::StrCat(prefix, index++));
      for (int i = 0; i < size; ++i) g.add_ranks(block + offset + i * stride);
      out->push_back(std::move(g));
    }
  }
}

// Cuts the sequence branch's modules (`linear`, the blocks' GEMMs, and
// "sequence.attention") into the engine's checkpoint levels
// (engine::kSequenceCheckpointRegions, engine/layers/attention.h
// BlockCheckpoint), each its own region recomputed in whole blocks: per
// block and token, "sequence.norm" keeps the norm's output (2 d bytes,
// bf16; recomputed by an elementwise pass the planner prices at 0) and,
// with FP8-saved activations, the bytes FP8 saves on the block's input and
// attention output; "sequence.projections" keeps q, k, v (6 d bytes;
// recomputed by three of the block's four d x d GEMMs); "sequence.attention"
// keeps the attention output and its statistics (2 d, or FP8's 1 + 1/32 d,
// + 4 heads bytes; recomputed by the attention forward). What the branch's
// estimate holds beyond them (the residual stream, the backward's gradients
// and scratch) stays in region "sequence", not recomputable. The levels
// nest in the engine (a block recomputing its attention recomputes its
// projections and norm too); the planner cuts the cheapest bytes first,
// which is that order whenever the attention costs more per byte than
// three GEMMs.
void AddSequenceLevels(const std::string& linear, double tokens, double d, double heads,
                       int layers, bool fp8_saved, planner::Model* model) {
  planner::DenseModule* lin = nullptr;
  planner::DenseModule* attn = nullptr;
  for (planner::DenseModule& m : model->modules) {
    if (m.name == linear) lin = &m;
    if (m.name == "sequence.attention") attn = &m;
  }
  if (lin == nullptr || layers <= 0 || tokens <= 0) return;
  constexpr double kFp8 = (1.0 + 1.0 / 32) / 2;  // FP8 + a 1 x 128 fp32 scale, over bf16.
  const double a = d * kBf16;                     // One [tokens, d] bf16 activation, per token.
  const double fp8_gain = fp8_saved ? 2 * (1 - kFp8) * a : 0;
  const double level_bytes[3] = {a + fp8_gain, 3 * a, (fp8_saved ? kFp8 : 1.0) * a + 4 * heads};
  // The first block's input is the embeddings' fp32 output (4 d bytes per
  // token, not 2 d): its FP8 copy saves 2 d more, once per sample's tokens
  // (counted in the norm level, spread over its blocks).
  const double first_input_gain = fp8_saved ? 2 * d * tokens : 0;
  double branch = model->ActivationBytesPerSample(*lin);
  if (attn != nullptr) branch += model->ActivationBytesPerSample(*attn);
  double levels = first_input_gain;
  for (double b : level_bytes) levels += b * layers * tokens;
  lin->activation_bytes_per_sample = std::max(0.0, branch - levels);
  lin->activation_bytes_per_token = 0;
  lin->region = "sequence";
  // q, k and v: three of the block's four d x d GEMMs.
  const double qkv_flops = layers * 6 * d * d;
  planner::DenseModule norm, proj;
  norm.name = proj.name = engine::kSequenceCheckpointRegions[0];
  proj.name = engine::kSequenceCheckpointRegions[1];
  norm.op = planner::OpKind::kElementwise;
  proj.op = planner::OpKind::kGemm;
  if (lin->flops_per_token > 0) {
    lin->flops_per_token = std::max(0.0, lin->flops_per_token - qkv_flops);
    proj.flops_per_token = qkv_flops;
  } else {
    const double moved = std::min(lin->flops_per_sample, qkv_flops * tokens);
    lin->flops_per_sample -= moved;
    proj.flops_per_sample = moved;
  }
  norm.activation_bytes_per_sample = level_bytes[0] * layers * tokens + first_input_gain;
  proj.activation_bytes_per_sample = level_bytes[1] * layers * tokens;
  if (attn != nullptr) {
    attn->region = engine::kSequenceCheckpointRegions[2];
    attn->activation_bytes_per_token = 0;
    attn->activation_bytes_per_sample = level_bytes[2] * layers * tokens;
    attn->io_bytes_per_sample = 0;  // Cut in blocks, each keeping nothing.
  }
  std::vector<planner::DenseModule> out;
  for (planner::DenseModule& m : model->modules) {
    const bool is_linear = m.name == linear;
    out.push_back(std::move(m));
    if (is_linear) {
      out.push_back(norm);
      out.push_back(proj);
    }
  }
  model->modules = std::move(out);
}

// The engine recomputes the self-attention blocks at the levels of
// AddSequenceLevels (one unit per block); every other region keeps its
// activations. A level the job names forces it and the levels it nests
// ("sequence": all three); the budget goes to the request as is.
void ApplyActivationMemory(const JobSpec& spec, planner::PlanRequest* request) {
  const std::set<std::string> levels(std::begin(engine::kSequenceCheckpointRegions),
                                     std::end(engine::kSequenceCheckpointRegions));
  for (planner::DenseModule& m : request->model.modules) {
    m.recomputable = levels.count(m.RegionName()) > 0;
    m.recompute_units = m.recomputable ? spec.model().sequence().num_layers() : 0;
  }
  const v1::ActivationMemory& am = spec.model().activation_memory();
  request->recompute_regions.clear();
  for (const std::string& name : am.recompute()) {
    int depth = 0;
    if (name == "sequence" || name == engine::kSequenceCheckpointRegions[2]) depth = 3;
    if (name == engine::kSequenceCheckpointRegions[1]) depth = 2;
    if (name == engine::kSequenceCheckpointRegions[0]) depth = 1;
    if (depth == 0) request->recompute_regions.insert(name);  // The planner names what is wrong.
    for (int i = 0; i < depth; ++i) request->recompute_regions.insert(engine::kSequenceCheckpointRegions[i]);
  }
  request->activation_budget_bytes = static_cast<double>(am.budget_bytes());
  // The engine recomputes a kNorm block's norm after its attention's
  // backward (the block's memory peak): the last block's norm output is off
  // the peak too, unless every block recomputes its projections (forced),
  // which need the norm first.
  const bool all_projections =
      request->recompute_regions.count(engine::kSequenceCheckpointRegions[1]) > 0;
  for (planner::DenseModule& m : request->model.modules) {
    m.recompute_after_peak =
        m.RegionName() == engine::kSequenceCheckpointRegions[0] && !all_projections;
  }
}

// The temporaries of one FP8 (e4m3) attention backward call over `q_rows`
// queries and `kv_rows` keys of width `dim`, as Fp8Backward
// (kernels/attention/attention_cuda.cc) allocates them and frees them when
// the call returns: one byte per element of q8 and do8 [q_rows, dim], k8 and
// v8 [kv_rows, dim], and the transposed qt8, dot8 [dim, Fp8VtCols(q_rows)]
// and kt8 [dim, Fp8VtCols(kv_rows)] (rows rounded up to 16); fp32 q_scale,
// do_scale and dsum [q_rows, heads], the k, v, qt and dot scales [dim] each
// and the amax scratch [4, dim]; heads of 128, the FP8 kernels' only head
// dim. Its outputs dq, dk, dv are the engine's bf16 tensors, as for bf16.
double Fp8AttentionBackwardBytes(double q_rows, double kv_rows, double dim) {
  auto padded = [](double rows) { return std::ceil(rows / 16) * 16; };
  const double e4m3 = dim * (2 * q_rows + 2 * kv_rows + 2 * padded(q_rows) + padded(kv_rows));
  return e4m3 + 4 * (3 * q_rows * dim / 128 + 8 * dim);
}

// One attention call of a block the recipe may run FP8, under the planner
// module that holds it.
struct AttentionCall {
  std::string block;   // PrecisionRecipe.fp8_attention name.
  std::string module;  // Planner module.
  double queries = 0;  // Query rows per sample; the keys are the history's.
};

// With attention_backward FP8, each FP8 call's temporaries
// (Fp8AttentionBackwardBytes at the request's batch, per sample) as its
// module's backward scratch: one call's, the largest, as the calls run one
// after another. Counted whole: the bf16 backward's own temporaries, which
// a rate table's fitted terms hold and the FP8 call does not allocate (its
// rowsum; the fp32 dQ accumulator, 4 bytes per q element, where the Hopper
// kernel fuses dQ, its choice per batch), are not subtracted, so what the
// recipe adds to the peak is an upper bound.
void ApplyFp8AttentionBackward(const v1::PrecisionRecipe& recipe, const std::vector<AttentionCall>& calls,
                               double history, double dim, planner::PlanRequest* request) {
  const double b = request->local_batch;
  if (recipe.attention_backward() != v1::PrecisionRecipe::ATTENTION_BACKWARD_FP8 || b <= 0) return;
  const auto& fp8 = recipe.fp8_attention();
  for (const AttentionCall& call : calls) {
    if (std::find(fp8.begin(), fp8.end(), call.block) == fp8.end()) continue;
    const double bytes = Fp8AttentionBackwardBytes(b * call.queries, b * history, dim) / b;
    for (planner::DenseModule& m : request->model.modules) {
      if (m.name == call.module) {
        m.backward_scratch_bytes_per_sample = std::max(m.backward_scratch_bytes_per_sample, bytes);
      }
    }
  }
}

v1::MemoryPlan MemoryToProto(const planner::MemoryBreakdown& m) {
  v1::MemoryPlan p;
  p.set_embedding_bytes(m.embedding);
  p.set_dense_bytes(m.dense);
  p.set_optimizer_bytes(m.optimizer);
  p.set_activation_bytes(m.activations);
  p.set_buffer_bytes(m.buffers);
  p.set_total_bytes(m.Total());
  return p;
}

// Samples drawn from the dataset's length distribution to price a step.
constexpr int kLengthSamples = 4096;

// A dataset that is where this process looks but cannot be read.
absl::Status Unreadable(const std::string& what, const std::string& path, const absl::Status& cause) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " '", path, "' cannot be read for planning: ", cause.message()));
}

// The lengths drawn from `spec`'s dataset (uncapped); none when there is
// nothing to sample (no sequence feature, a malformed synthetic:// URI, no
// dataset where this process looks). Errors for a dataset file that is
// there but cannot be read.
absl::StatusOr<std::vector<int64_t>> SampledLengths(const JobSpec& spec, const engine::JobModel& model) {
  std::vector<int64_t> lengths;
  const std::string& dataset = spec.data().dataset();
  if (absl::StartsWith(dataset, "synthetic://")) {
    absl::StatusOr<data::SynthOptions> synth = dataloader::ParseSyntheticDataset(dataset);
    if (synth.ok()) {
      std::mt19937_64 rng(synth->seed);
      lengths.resize(kLengthSamples);
      for (int64_t& l : lengths) l = synth->lengths.Sample(rng);
    }
  } else if (!model.sequence_columns.empty()) {
    // The dataset's own histories, where this process can read its files.
    absl::StatusOr<dataloader::DatasetFiles> files = dataloader::ResolveDataset(dataset, {});
    if (!files.ok()) return lengths;
    absl::StatusOr<std::vector<int64_t>> sampled =
        data::SampleRowLengths(files->train, model.sequence_columns[0], kLengthSamples);
    if (!sampled.ok()) return Unreadable("dataset", files->train, sampled.status());
    lengths = *std::move(sampled);
  }
  return lengths;
}

// `lengths` capped at the model's max_length; every history at the cap when
// there are none.
std::vector<int64_t> CappedLengths(std::vector<int64_t> lengths, const engine::JobModel& model) {
  int64_t cap = 0;
  for (int m : model.sequence_max_length) cap = std::max<int64_t>(cap, m);
  if (lengths.empty()) return std::vector<int64_t>(kLengthSamples, std::max<int64_t>(cap, 1));
  for (int64_t& l : lengths) {
    if (cap > 0) l = std::min(l, cap);
  }
  return lengths;
}

// The decoded bytes of `spec`'s eval set; unset when it has none this
// process can find (or a synthetic:// training set). Errors for an eval file
// that is there but cannot be read.
absl::StatusOr<std::optional<double>> EvalSetBytes(const JobSpec& spec) {
  const std::string& dataset = spec.data().dataset();
  if (absl::StartsWith(dataset, "synthetic://")) return std::optional<double>();
  absl::StatusOr<std::string> eval = dataloader::ResolveEvalFile(dataset, spec.data().eval_dataset(), {});
  if (!eval.ok() || eval->empty()) return std::optional<double>();
  absl::StatusOr<double> bytes = data::EstimateDecodedBytes(*eval);
  if (!bytes.ok()) return Unreadable("eval set", *eval, bytes.status());
  return std::optional<double>(*bytes);
}

// CpuRankPeakBytes over counts and eval set bytes already read.
absl::StatusOr<double> CpuPeak(const JobSpec& spec, const engine::StepRates& rates, int64_t resident_bytes,
                               const engine::StepCounts& n, std::optional<double> eval_set_bytes) {
  if (!(rates.fixed_bytes > 0 || rates.bytes_per_token_element > 0 || rates.bytes_per_dense_element > 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", rates.device, " rate table measured no memory terms; run recfleet data calibrate --rates"));
  }
  const engine::StepPrediction p = engine::PredictStep(n, rates);
  // Every rank holds the whole eval set decoded, and its eval forward keeps
  // the activations of an eval batch.
  double eval_batch = 0;
  if (eval_set_bytes.has_value() && spec.training().eval_every() > 0) {
    eval_batch = static_cast<double>(engine::EvalBatchSize(spec));
  }
  // The counts are of kLengthSamples samples; activations scale with the batch.
  const double batch = std::max<double>(spec.data().local_batch_size(), eval_batch);
  return static_cast<double>(resident_bytes) + p.static_bytes +
         p.activation_bytes * batch / static_cast<double>(n.samples) + rates.fixed_bytes +
         eval_set_bytes.value_or(0);
}

}  // namespace

std::vector<int64_t> SpecSequenceLengths(const JobSpec& spec, const engine::JobModel& model) {
  absl::StatusOr<std::vector<int64_t>> sampled = SampledLengths(spec, model);
  return CappedLengths(sampled.ok() ? *std::move(sampled) : std::vector<int64_t>(), model);
}

planner::Topology WithMeasuredPeak(planner::Topology hardware, const engine::StepRates& rates) {
  hardware.peak_flops_per_gpu = std::max(
      {hardware.peak_flops_per_gpu, rates.gemm_flops_per_s, rates.attention_flops_per_s});
  return hardware;
}

absl::StatusOr<engine::StepCounts> SpecStepCounts(const JobSpec& spec) {
  absl::StatusOr<engine::JobModel> model = engine::BuildJobModel(spec);
  if (!model.ok()) return model.status();
  return engine::CountStep(*model, SpecSequenceLengths(spec, *model));
}

absl::StatusOr<planner::PlanRequest> PlanRequestFromSpec(const JobSpec& spec,
                                                         const engine::StepRates* rates,
                                                         const planner::Topology& hardware,
                                                         const engine::StepCounts* counts) {
  if (rates == nullptr) return PlanRequestFromSpec(spec);
  absl::StatusOr<planner::PlanRequest> shapes = PlanRequestFromSpec(spec);
  if (!shapes.ok()) return shapes;
  absl::StatusOr<engine::StepCounts> counted;
  if (counts == nullptr) {
    counted = SpecStepCounts(spec);
    if (!counted.ok()) return counted.status();
    counts = &*counted;
  }
  planner::PlanRequest request = *std::move(shapes);
  const engine::StepCounts& n = *counts;
  const double per = 1.0 / static_cast<double>(n.samples);
  const double mean_length = static_cast<double>(n.tokens) * per;
  request.model.sequence_lengths = {{mean_length, 1.0}};
  for (planner::Table& t : request.model.tables) {
    // Every table has the model's width; a sequence table is looked up once
    // per event of the actual histories, not of their cap.
    if (!t.pooled) t.pooling_factor = t.pooling_factor > 0 ? mean_length : 0;
  }
  request.model.modules.clear();
  const double d = static_cast<double>(n.dim), D = static_cast<double>(n.interaction_dim);
  for (const engine::PartCost& part : n.parts) {
    planner::DenseModule m;
    m.name = part.name;
    m.op = planner::OpKind::kGemm;
    m.params = part.params;
    m.flops_per_sample = part.linear_flops * per;
    const bool history = part.name == "sequence" || part.name == "cross" || part.name == "pma";
    m.io_bytes_per_sample = kBf16 * (history ? mean_length * d : D);
    if (part.name == "sequence") {
      m.region = "sequence";
      m.activation_bytes_per_sample = n.token_elements * per * rates->bytes_per_token_element;
    }
    if (part.name == "dcn") {
      m.activation_bytes_per_sample = n.dense_elements * per * rates->bytes_per_dense_element;
    }
    request.model.modules.push_back(m);
    if (part.attention_flops > 0) {
      planner::DenseModule a;
      a.name = part.name + ".attention";
      a.region = m.RegionName();
      a.op = planner::OpKind::kAttention;
      a.flops_per_sample = part.attention_flops * per;
      a.io_bytes_per_sample = m.io_bytes_per_sample;
      request.model.modules.push_back(a);
    }
  }
  AddSequenceLevels("sequence", mean_length, d, spec.model().sequence().num_heads(),
                    spec.model().sequence().num_layers(),
                    spec.model().activation_memory().fp8_saved(), &request.model);
  // Cross-attention's queries: the interaction's tokens but PMA's (StepCounts::interaction_dim).
  const double pma_queries = spec.model().cross().pma_queries();
  ApplyFp8AttentionBackward(spec.model().precision(),
                            {{"sequence", "sequence.attention", mean_length},
                             {"cross", "cross.attention", D / d - pma_queries},
                             {"pma", "pma.attention", pma_queries}},
                            mean_length, d, &request);
  // The engine's FP8 modules under the part names above: their GEMMs on a
  // GPU job, their all-gathered weights on a CPU job (which computes fp32).
  std::set<std::string> fp8;
  for (const std::string& name : spec.model().precision().fp8_modules()) {
    fp8.insert(absl::StartsWith(name, "moe.") ? "moe" : name);
  }
  if (spec.resources().gpus_per_worker() > 0) {
    request.precision.fp8_modules = fp8;
  } else {
    request.precision.fp8_modules.clear();
    request.precision.fp8_gather_modules = request.precision.fp8_all_gather ? fp8 : std::set<std::string>();
  }

  // Measured rates in place of the typical efficiencies.
  const planner::Topology hw = WithMeasuredPeak(hardware, *rates);
  // A rate of 0 means the fit found that work free at its size: the peak.
  auto efficiency = [&](double rate) { return rate > 0 ? std::min(1.0, rate / hw.peak_flops_per_gpu) : 1.0; };
  request.efficiency.gemm = efficiency(rates->gemm_flops_per_s);
  request.efficiency.attention = efficiency(rates->attention_flops_per_s);
  if (rates->seconds_per_param > 0) {
    // The planner streams 2 x master + gradient + 2 x moments per parameter.
    const planner::PrecisionRecipe& p = request.precision;
    const double bytes = 2.0 * p.master_weight_bytes + p.gradient_shard_bytes + 2.0 * p.optimizer_bytes_per_param;
    request.efficiency.elementwise =
        std::min(1.0, bytes / (hw.hbm_bandwidth_bytes_per_s * rates->seconds_per_param));
  }
  const double batch = request.local_batch;
  request.other_compute_s = rates->seconds_per_step +
                            batch * per * (n.token_elements * rates->seconds_per_token_element +
                                           n.dense_elements * rates->seconds_per_dense_element);
  request.other_memory_bytes = rates->fixed_bytes;
  // The probes' peaks, and so the fitted activation terms, include their
  // lookups' outputs and the staged batch's ids.
  request.activations_hold_lookups = true;
  // Measured on the rate table's own ranks (CPU: ranks of one host over
  // loopback); the planner adds it only to plans of more than one rank.
  request.rank_sync_fraction = rates->rank_sync_overhead;
  request.rates_source = absl::StrCat("step rates measured on ", rates->machine, " (", rates->date,
                                      ", ", rates->precision, ")");
  ApplyActivationMemory(spec, &request);
  if (absl::Status s = planner::ValidateRequest(request); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec as a plan request: ", s.message()));
  }
  return request;
}

absl::StatusOr<planner::PlanRequest> PlanRequestFromSpec(const JobSpec& spec) {
  const v1::ModelSpec& model = spec.model();
  planner::PlanRequest request;
  request.model.name = spec.display_name().empty() ? "job" : spec.display_name();
  request.local_batch = spec.data().local_batch_size();
  // Fixes name the job file's fields. A JobSpec has no fp16 tables, and its
  // FP8-saved activations (model.activation_memory.fp8_saved) cover only
  // the recomputing self-attention blocks, which AddSequenceLevels prices:
  // the planner's halving of every kept activation is not on offer.
  request.setting_names.local_batch = "spec.data.local_batch_size";
  request.setting_names.fp16_tables = "";
  request.setting_names.fp8_kept_activations = "";
  request.setting_names.activation_budget = "spec.model.activation_memory.budget_bytes";

  std::map<std::string, int> table_index;
  for (int i = 0; i < model.tables_size(); ++i) {
    const v1::EmbeddingTable& t = model.tables(i);
    planner::Table table;
    table.name = t.name();
    table.rows = t.rows();
    table.dim = t.dim();
    table.pooling_factor = 0;  // Summed over the features below.
    table_index[t.name()] = i;
    request.model.tables.push_back(table);
  }

  // Features: table lookups, dense input width, sequence lengths.
  std::map<std::string, int> sequence_length;
  int64_t input_width = 0;
  int candidates = 0;
  for (int i = 0; i < model.features_size(); ++i) {
    const v1::Feature& f = model.features(i);
    if (f.kind() == v1::Feature::NUMERIC) {
      input_width += f.width();
      continue;
    }
    auto it = table_index.find(f.table());
    if (it == table_index.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.model.features[", i, "].table: no table named '", f.table(), "'"));
    }
    planner::Table& table = request.model.tables[it->second];
    if (f.kind() == v1::Feature::SEQUENCE) {
      table.pooling_factor += f.max_length();
      table.pooled = false;
      sequence_length[f.name()] = f.max_length();
    } else {
      table.pooling_factor += 1;
      input_width += table.dim;
      if (f.kind() == v1::Feature::CANDIDATE) ++candidates;
    }
  }

  if (model.has_sequence()) {
    const v1::SequenceBranch& seq = model.sequence();
    double length = 0;
    for (int i = 0; i < seq.features_size(); ++i) {
      auto it = sequence_length.find(seq.features(i));
      if (it == sequence_length.end()) {
        return absl::InvalidArgumentError(absl::StrCat("spec.model.sequence.features[", i,
                                                       "]: no SEQUENCE feature named '",
                                                       seq.features(i), "'"));
      }
      length += it->second;
    }
    const double d = seq.model_dim(), layers = seq.num_layers();
    request.model.sequence_lengths.push_back({length, 1.0});

    planner::DenseModule proj;
    proj.name = "sequence.proj";
    proj.region = "sequence";
    proj.op = planner::OpKind::kGemm;
    proj.params = static_cast<int64_t>(layers * 12 * d * d);
    proj.flops_per_token = layers * 24 * d * d;
    proj.activation_bytes_per_token = layers * 10 * d * kBf16;
    proj.io_bytes_per_sample = length * d * kBf16;
    request.model.modules.push_back(proj);

    planner::DenseModule attn;
    attn.name = "sequence.attention";
    attn.region = "sequence";
    attn.op = planner::OpKind::kAttention;
    const v1::AttentionSpec& a = seq.attention();
    switch (a.kind()) {
      case v1::AttentionSpec::SLIDING_WINDOW:
        attn.flops_per_token = layers * 4 * d * a.window();
        break;
      case v1::AttentionSpec::BLOCK:
        attn.flops_per_token = layers * 4 * d * (a.block_size() > 0 ? a.block_size() : 64);
        break;
      default:
        attn.flops_per_token_sq = layers * 4 * d;
    }
    attn.activation_bytes_per_token = layers * 2 * d * kBf16;
    attn.io_bytes_per_sample = length * d * kBf16;
    request.model.modules.push_back(attn);
    AddSequenceLevels(proj.name, length, d, seq.num_heads(), static_cast<int>(layers),
                      model.activation_memory().fp8_saved(), &request.model);

    input_width += static_cast<int64_t>(d) * std::max(model.cross().pma_queries(), 1);
    const v1::CrossBranch& cross = model.cross();
    const int blocks = cross.num_cross_layers() + (cross.pma_queries() > 0 ? 1 : 0);
    if (blocks > 0) {
      const double queries = static_cast<double>(cross.num_cross_layers()) * candidates +
                             cross.pma_queries();
      planner::DenseModule c;
      c.name = "cross";
      c.op = planner::OpKind::kGemm;
      c.params = static_cast<int64_t>(blocks * 4 * d * d);
      c.flops_per_token = blocks * 4 * d * d + 4 * d * queries;
      c.flops_per_sample = 4 * d * d * queries;
      c.activation_bytes_per_token = blocks * 2 * d * kBf16;
      c.activation_bytes_per_sample = queries * 2 * d * kBf16;
      c.io_bytes_per_sample = length * d * kBf16;
      request.model.modules.push_back(c);
      if (cross.num_cross_layers() > 0) input_width += static_cast<int64_t>(d) * candidates;
    }
    ApplyFp8AttentionBackward(model.precision(),
                              {{"sequence", attn.name, length},
                               {"cross", "cross", static_cast<double>(candidates)},
                               {"pma", "cross", static_cast<double>(cross.pma_queries())}},
                              length, d, &request);
  }

  int64_t width = input_width;
  std::string dcn_module, expert_module;  // Planner names of the spec's DCN and MoE/MLP.
  for (int i = 0; i < model.dense_size(); ++i) {
    const v1::DenseModule& dm = model.dense(i);
    planner::DenseModule m;
    m.io_bytes_per_sample = width * kBf16;
    const double w = static_cast<double>(width);
    switch (dm.module_case()) {
      case v1::DenseModule::kMlp:
        m.name = absl::StrCat("mlp", i);
        width = FillMlp(width, Dims(dm.mlp().hidden_dims()), &m);
        break;
      case v1::DenseModule::kDcn: {
        m.name = absl::StrCat("dcn", i);
        const double layers = dm.dcn().num_layers(), r = dm.dcn().low_rank();
        m.params = static_cast<int64_t>(layers * (r > 0 ? 2 * w * r + w : w * w + w));
        m.flops_per_sample = layers * (r > 0 ? 4 * w * r : 2 * w * w);
        m.activation_bytes_per_sample = layers * 2 * w * kBf16;
        break;
      }
      case v1::DenseModule::kMoe: {
        m.name = absl::StrCat("moe", i);
        const v1::MoeSpec& moe = dm.moe();
        planner::DenseModule expert;
        const int64_t out = FillMlp(width, Dims(moe.expert_hidden_dims()), &expert);
        m.num_experts = moe.num_experts();
        m.params = expert.params * moe.num_experts() + width * moe.num_experts();
        m.flops_per_sample = moe.top_k() * expert.flops_per_sample;
        m.activation_bytes_per_sample = moe.top_k() * expert.activation_bytes_per_sample;
        width = out;
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("spec.model.dense[", i, "]: one of mlp, dcn or moe is required"));
    }
    if (!dm.name().empty()) m.name = dm.name();
    (dm.has_dcn() ? dcn_module : expert_module) = m.name;
    request.model.modules.push_back(m);
  }

  for (const v1::Head& head : model.heads()) {
    planner::DenseModule m;
    m.name = absl::StrCat("head.", absl::AsciiStrToLower(v1::Head::Kind_Name(head.kind())));
    m.io_bytes_per_sample = width * kBf16;
    std::vector<int64_t> dims = Dims(head.hidden_dims());
    dims.push_back(1);
    FillMlp(width, dims, &m);
    request.model.modules.push_back(m);
  }

  // The engine's FP8 modules (engine/model_config.h Fp8Recipe) as the
  // planner's modules; the numeric projection has no module of its own.
  const v1::PrecisionRecipe& precision = model.precision();
  // CPU workers compute in fp32 (their recipe is the FP8 all-gather only).
  const bool fp8_gemms = spec.resources().gpus_per_worker() > 0;
  // The workers gather fp32 weights and reduce fp32 gradients; the FP8
  // modules' weights travel FP8 under ALL_GATHER_FP8.
  request.precision.weight_gather_bytes = 4;
  request.precision.gradient_reduce_bytes = 4;
  request.precision.fp8_all_gather = precision.all_gather() == v1::PrecisionRecipe::ALL_GATHER_FP8;
  request.precision.fp8_speedup = kFp8ModuleRate;
  // A CPU job's recipe names the modules its all-gather carries as FP8.
  std::set<std::string>& named =
      fp8_gemms ? request.precision.fp8_modules : request.precision.fp8_gather_modules;
  for (const std::string& name : precision.fp8_modules()) {
    if (!fp8_gemms && !request.precision.fp8_all_gather) break;
    if (name == "dcn" && !dcn_module.empty()) named.insert(dcn_module);
    if (absl::StartsWith(name, "moe.") && !expert_module.empty()) named.insert(expert_module);
    if (name == "towers") {
      for (const planner::DenseModule& m : request.model.modules) {
        if (absl::StartsWith(m.name, "head.")) named.insert(m.name);
      }
    }
  }
  if (precision.fp8_modules_size() > 0) {
    const std::string modules = absl::StrJoin(precision.fp8_modules(), ", ");
    request.precision.recipe =
        fp8_gemms ? absl::StrCat("FP8 (E4M3, 1x128 activation / 128x128 weight scales) in ", modules,
                                 "; weight gradients ",
                                 precision.weight_gradient() == v1::PrecisionRecipe::FP8 ? "FP8"
                                 : precision.weight_gradient() == v1::PrecisionRecipe::FP8_HADAMARD_STOCHASTIC
                                     ? "FP8 after a random Hadamard transform, dy rounded stochastically"
                                     : "bf16",
                                 "; every other linear layer bf16")
                  : absl::StrCat("fp32 GEMMs on CPU workers; weights of ", modules, " rounded to FP8 by the all-gather");
    if (precision.all_gather() == v1::PrecisionRecipe::ALL_GATHER_FP8) {
      absl::StrAppend(&request.precision.recipe, "; FSDP all-gather of their weights in FP8 (E4M3 in the GEMMs' "
                                                 "128x128 tiles: ~0.5x bf16 bytes, ~0.25x fp32)");
    }
  }
  if (precision.fp8_attention_size() > 0) {
    // The planner's attention time stays bf16's: the FP8 forward's kernel is
    // ~1.1x bf16's but its quantize pre-pass makes the call ~0.9x, and the
    // FP8 backward call is ~0.95-0.98x bf16's (bench/RESULTS.md).
    const bool fp8_bwd = precision.attention_backward() == v1::PrecisionRecipe::ATTENTION_BACKWARD_FP8;
    if (!request.precision.recipe.empty()) absl::StrAppend(&request.precision.recipe, "; ");
    absl::StrAppend(&request.precision.recipe, "FP8 (E4M3) attention ", fp8_bwd ? "forward and backward" : "forward",
                    " in ", absl::StrJoin(precision.fp8_attention(), ", "),
                    fp8_bwd ? ", the backward's e4m3 copies in the peak's buffers" : ", its backward bf16");
  }
  if (precision.fp8_modules_size() > 0 || precision.fp8_attention_size() > 0 ||
      spec.model().activation_memory().fp8_saved()) {
    if (precision.quality_gate().max_relative_ne_increase() > 0) {
      request.shadow_model = true;
      const v1::PrecisionQualityGate& gate = precision.quality_gate();
      absl::StrAppend(&request.precision.recipe,
                      absl::StrFormat("; quality gate: eval NE within +%g%% of bf16 on a %d-step shadow run%s",
                                      100 * gate.max_relative_ne_increase(),
                                      gate.shadow_steps() > 0 ? gate.shadow_steps() : 200,
                                      gate.runs() > 1 ? absl::StrCat(", ", gate.runs(), " runs") : std::string()));
    }
  }

  const v1::ParallelismHints& hints = spec.parallelism();
  request.hints.fsdp_group_size = hints.fsdp_group_size();
  request.hints.replicas = hints.replicas();
  request.hints.table_sharding_group_size = hints.table_sharding_group_size();

  ApplyActivationMemory(spec, &request);
  if (absl::Status s = planner::ValidateRequest(request); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec as a plan request: ", s.message()));
  }
  return request;
}

planner::Topology DefaultHardware() {
  planner::Topology t;
  t.name = "h200";
  t.hbm_bytes_per_gpu = 141e9;
  t.peak_flops_per_gpu = 989e12;
  t.hbm_bandwidth_bytes_per_s = 4.8e12;
  t.links[planner::kNvlink] = {450e9, 3e-6};
  t.links[planner::kZone] = {50e9, 10e-6};
  t.links[planner::kCrossZone] = {12.5e9, 30e-6};
  return t;
}

absl::StatusOr<planner::Topology> TopologyFromPlacement(const Placement& placement,
                                                        const planner::Topology& hardware) {
  if (placement.workers.empty() || placement.ranks_per_worker < 1) {
    return absl::InvalidArgumentError("placement: no workers to plan on");
  }
  std::vector<std::string> worker_nodes;
  for (const WorkerView& w : placement.workers) {
    worker_nodes.push_back(w.topology.node().empty() ? "worker/" + w.id : w.topology.node());
  }
  planner::Topology t = hardware;
  t.name = absl::StrCat(hardware.name, " x", placement.workers.size(), " workers");
  const int workers_per_node = Uniform(Runs(worker_nodes));
  // Labels of each node's first worker (a node's workers share them).
  std::vector<std::string> zones, domains;
  if (workers_per_node > 0) {
    for (size_t i = 0; i < placement.workers.size(); i += workers_per_node) {
      const v1::Topology& labels = placement.workers[i].topology;
      zones.push_back(labels.zone());
      domains.push_back(labels.zone() + "\n" +
                        (labels.nvlink_domain().empty() ? worker_nodes[i] : labels.nvlink_domain()));
    }
  }
  const int nodes_per_zone = Uniform(Runs(zones));
  const int nodes_per_domain = Uniform(Runs(domains));
  if (workers_per_node > 0 && nodes_per_zone > 0 && nodes_per_domain > 0 &&
      nodes_per_zone % nodes_per_domain == 0) {
    t.num_nodes = static_cast<int>(zones.size());
    t.gpus_per_node = workers_per_node * placement.ranks_per_worker;
    t.nodes_per_zone = nodes_per_zone;
    t.nodes_per_nvlink_domain = nodes_per_domain;
  } else {
    t.num_nodes = static_cast<int>(placement.workers.size());
    t.gpus_per_node = placement.ranks_per_worker;
    t.nodes_per_zone = t.num_nodes;
    t.nodes_per_nvlink_domain = 1;
  }
  if (absl::Status s = planner::ValidateTopology(t); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("topology from worker labels: ", s.message()));
  }
  return t;
}

std::vector<ProcessGroup> PlanGroups(const planner::Plan& plan) {
  std::vector<ProcessGroup> groups(1);
  groups[0].set_name("world");
  for (int r = 0; r < plan.world; ++r) groups[0].add_ranks(r);
  const int g = plan.dense.fsdp_group;
  AddTiling("fsdp/", plan.world, g, 1, &groups);
  if (plan.dense.replicas > 1) AddTiling("replica/", plan.world, plan.dense.replicas, g, &groups);
  for (const planner::ExpertChoice& e : plan.dense.experts) {
    if (e.ep_degree > 1) AddTiling("expert/" + e.module + "/", plan.world, e.ep_degree, 1, &groups);
  }
  const planner::SparseLayout& s = plan.sparse;
  AddTiling("tables/", plan.world, s.mp_group, s.mp_stride, &groups);
  if (s.v3_shard_degree > 1) AddTiling("table_shards/", plan.world, s.v3_shard_degree, 1, &groups);
  return groups;
}

std::string PlanSummary(const planner::Plan& plan, std::optional<double> cpu_rank_peak_bytes) {
  std::string experts;
  for (const planner::ExpertChoice& e : plan.dense.experts) {
    if (e.ep_degree > 1) absl::StrAppend(&experts, ", EP ", e.ep_degree, " for ", e.module);
  }
  std::string memory;
  if (!cpu_rank_peak_bytes.has_value()) {
    memory = absl::StrFormat("peak %.2f of %.2f GiB per GPU", plan.peak.Total() / (1 << 30),
                             plan.hbm_usable_bytes / (1 << 30));
  } else if (*cpu_rank_peak_bytes > 0) {
    memory = absl::StrFormat("peak %.1f MiB resident per CPU rank", *cpu_rank_peak_bytes / (1 << 20));
  } else {
    memory = "peak per CPU rank not predicted";
  }
  return absl::StrFormat(
      "plan: FSDP %d x %d replicas%s; %s tables over groups of %d (%d copies); %s; predicted step %.2f ms "
      "(scaling %.2f)",
      plan.dense.fsdp_group, plan.dense.replicas, experts, planner::SparseSchemeName(plan.sparse.scheme),
      plan.sparse.mp_group, plan.sparse.table_copies, memory, plan.step.total_s * 1e3, plan.step.scaling_ratio);
}

v1::Plan PlanToProto(const planner::Plan& plan, std::optional<double> cpu_rank_peak_bytes) {
  v1::Plan p;
  p.set_world_size(plan.world);
  p.set_local_batch_size(plan.local_batch);
  v1::DenseMeshPlan* dense = p.mutable_dense();
  dense->set_fsdp_group_size(plan.dense.fsdp_group);
  dense->set_replicas(plan.dense.replicas);
  for (const planner::ExpertChoice& e : plan.dense.experts) {
    v1::DenseMeshPlan::Expert* x = dense->add_experts();
    x->set_module(e.module);
    x->set_ep_degree(e.ep_degree);
    x->set_reason(e.reason);
  }
  const planner::SparseLayout& s = plan.sparse;
  v1::SparseLayoutPlan* sparse = p.mutable_sparse();
  sparse->set_scheme(planner::SparseSchemeName(s.scheme));
  sparse->set_model_parallel_group_size(s.mp_group);
  sparse->set_model_parallel_stride(s.mp_stride);
  sparse->set_v3_shard_degree(s.v3_shard_degree);
  sparse->set_num_model_parallel_groups(s.num_mp_groups);
  sparse->set_table_copies(s.table_copies);
  for (const planner::TableSharding& t : s.sharding.tables) {
    v1::TableShardingPlan* x = sparse->add_tables();
    x->set_table(t.name);
    x->set_sharding(planner::ShardingTypeName(t.type));
    x->set_num_shards(t.num_shards);
    for (int r : t.ranks) x->add_ranks(r);
    x->set_rows_per_shard(t.rows_per_shard);
    x->set_cols_per_shard(t.cols_per_shard);
    x->set_shard_bytes(t.shard_bytes);
    x->set_reason(t.reason);
  }
  for (const std::string& line : plan.placement) p.add_placement(line);
  *p.mutable_peak_memory() = MemoryToProto(plan.peak);
  p.set_hbm_usable_bytes(plan.hbm_usable_bytes);
  v1::StepTimePlan* step = p.mutable_step();
  step->set_sparse_compute_seconds(plan.step.sparse_compute_s);
  step->set_dense_compute_seconds(plan.step.dense_compute_s);
  step->set_recompute_seconds(plan.step.recompute_s);
  step->set_optimizer_seconds(plan.step.optimizer_s);
  step->set_other_compute_seconds(plan.step.other_compute_s);
  for (double e : plan.step.exposed_s) step->add_exposed_seconds(e);
  step->set_rank_sync_seconds(plan.step.rank_sync_s);
  step->set_total_seconds(plan.step.total_s);
  step->set_model_flops(plan.step.model_flops);
  step->set_local_mfu(plan.step.local_mfu);
  step->set_e2e_mfu(plan.step.e2e_mfu);
  step->set_scaling_ratio(plan.step.scaling_ratio);
  for (double b : plan.traffic_bytes_per_level) p.add_traffic_bytes_per_level(b);
  for (const planner::Decision& d : plan.decisions) {
    v1::PlanDecision* x = p.add_decisions();
    x->set_dimension(d.dimension);
    x->set_chosen(d.chosen);
    x->set_reason(d.reason);
    for (const planner::Alternative& a : d.alternatives) {
      v1::PlanAlternative* y = x->add_alternatives();
      y->set_option(a.option);
      y->set_feasible(a.feasible);
      y->set_step_seconds(a.step_s);
      y->set_peak_bytes(a.peak_bytes);
      y->set_note(a.note);
    }
  }
  p.set_candidates_evaluated(plan.candidates_evaluated);
  p.set_summary(PlanSummary(plan, cpu_rank_peak_bytes));
  for (const planner::RegionBudget& rb : plan.checkpoint) {
    v1::RegionCheckpointPlan* x = p.add_checkpoint();
    x->set_region(rb.region);
    x->set_full_bytes(rb.full_bytes);
    x->set_kept_bytes(rb.budget_bytes);
    x->set_recompute_seconds(rb.recompute_s);
    x->set_units(rb.units);
    x->set_recomputed_units(rb.recomputed_units);
  }
  return p;
}

absl::StatusOr<planner::Plan> PlanPlacement(const JobSpec& spec, const Placement& placement,
                                            const planner::Topology& hardware,
                                            const engine::StepRates* rates,
                                            const engine::StepCounts* counts) {
  const planner::Topology hw = rates != nullptr ? WithMeasuredPeak(hardware, *rates) : hardware;
  absl::StatusOr<planner::PlanRequest> request = PlanRequestFromSpec(spec, rates, hw, counts);
  if (!request.ok()) return request.status();
  absl::StatusOr<planner::Topology> topology = TopologyFromPlacement(placement, hw);
  if (!topology.ok()) return topology.status();
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(*topology, *request);
  if (!plan.ok() && absl::IsResourceExhausted(plan.status())) {
    return absl::FailedPreconditionError(plan.status().message());
  }
  return plan;
}

absl::StatusOr<double> CpuRankPeakBytes(const JobSpec& spec, const engine::StepRates& rates,
                                        int64_t resident_bytes, const engine::StepCounts* counts) {
  absl::StatusOr<engine::StepCounts> counted;
  if (counts == nullptr) {
    counted = SpecStepCounts(spec);
    if (!counted.ok()) return counted.status();
    counts = &*counted;
  }
  // An eval file that is there but does not decode counts as an empty one.
  absl::StatusOr<std::optional<double>> eval = EvalSetBytes(spec);
  return CpuPeak(spec, rates, resident_bytes, *counts, eval.ok() ? *eval : std::optional<double>(0.0));
}

absl::StatusOr<v1::Plan> PlanOneGpu(const JobSpec& spec, const planner::Topology& hardware) {
  Placement one;
  one.workers.push_back({"local", 1, {}});
  absl::StatusOr<planner::Plan> plan = PlanPlacement(spec, one, hardware);
  if (!plan.ok()) return plan.status();
  return PlanToProto(*plan);
}

const engine::StepRates* RatesForJob(const JobSpec& spec, const std::vector<engine::StepRates>& rates) {
  const std::string device = spec.resources().gpus_per_worker() > 0 ? "cuda" : "cpu";
  for (const engine::StepRates& r : rates) {
    if (r.device == device) return &r;
  }
  return nullptr;
}

JobSpec SpecForPlanning(const JobSpec& spec, const std::string& data_root) {
  if (data_root.empty()) return spec;
  JobSpec out = spec;
  out.mutable_data()->set_dataset(dataloader::DatasetPath(spec.data().dataset(), data_root));
  out.mutable_data()->set_eval_dataset(dataloader::DatasetPath(spec.data().eval_dataset(), data_root));
  return out;
}

absl::Status CheckDatasetsUnderRoot(const JobSpec& spec, const std::string& data_root) {
  const std::pair<const char*, const std::string*> fields[] = {{"dataset", &spec.data().dataset()},
                                                                {"eval_dataset", &spec.data().eval_dataset()}};
  for (const auto& [field, location] : fields) {
    if (location->empty()) continue;
    if (absl::Status s = dataloader::CheckDatasetUnderRoot(*location, data_root); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("spec.data.", field, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanningData> ReadPlanningData(const JobSpec& spec, const engine::StepRates* rates) {
  PlanningData out;
  if (rates == nullptr) return out;  // The shape estimates read no data.
  absl::StatusOr<engine::JobModel> model = engine::BuildJobModel(spec);
  if (!model.ok()) return model.status();
  absl::StatusOr<std::vector<int64_t>> sampled = SampledLengths(spec, *model);
  if (!sampled.ok()) return sampled.status();
  out.counts = engine::CountStep(*model, CappedLengths(*std::move(sampled), *model));
  absl::StatusOr<std::optional<double>> eval = EvalSetBytes(spec);
  if (!eval.ok()) return eval.status();
  out.eval_set_bytes = *eval;
  return out;
}

double CpuJobPeakBytes(const JobSpec& spec, const Placement& placement, const engine::StepRates* rates,
                       const PlanningData& data) {
  int64_t resident = 0;
  for (const WorkerView& w : placement.workers) resident = std::max(resident, w.resident_memory_bytes);
  if (rates == nullptr || resident <= 0 || !data.counts.has_value()) return 0;
  absl::StatusOr<double> cpu = CpuPeak(spec, *rates, resident, *data.counts, data.eval_set_bytes);
  return cpu.ok() ? *cpu : 0;
}

PlanningDataReader PlanningDatasetReader(std::vector<engine::StepRates> rates, std::string data_root) {
  return [rates = std::move(rates), data_root = std::move(data_root)](const JobSpec& user_spec) {
    const JobSpec spec = SpecForPlanning(user_spec, data_root);
    return ReadPlanningData(spec, RatesForJob(spec, rates));
  };
}

DataGroupPlanner PlanningDataGroupPlanner(planner::Topology hardware, std::vector<engine::StepRates> rates,
                                          std::string data_root) {
  return [hardware = std::move(hardware), rates = std::move(rates), data_root = std::move(data_root)](
             const JobSpec& user_spec, const Placement& placement,
             const PlanningData& data) -> absl::StatusOr<GroupPlan> {
    const JobSpec spec = SpecForPlanning(user_spec, data_root);
    const engine::StepRates* job_rates = RatesForJob(spec, rates);
    // Priced by a rate table, the plan needs the counts read with it: never
    // read here, where the caller may hold a lock.
    if (job_rates != nullptr && !data.counts.has_value()) {
      return absl::InternalError("the job's planning data was read without its rate table");
    }
    const engine::StepCounts* counts = data.counts.has_value() ? &*data.counts : nullptr;
    absl::StatusOr<planner::Plan> plan = PlanPlacement(spec, placement, hardware, job_rates, counts);
    if (!plan.ok()) return plan.status();
    if (spec.resources().gpus_per_worker() > 0) {
      return GroupPlan{PlanGroups(*plan), PlanSummary(*plan), PlanToProto(*plan), plan->peak.Total()};
    }
    const double peak = CpuJobPeakBytes(spec, placement, job_rates, data);
    return GroupPlan{PlanGroups(*plan), PlanSummary(*plan, peak), PlanToProto(*plan, peak), peak};
  };
}

GroupPlanner PlanningGroupPlanner(planner::Topology hardware, std::vector<engine::StepRates> rates,
                                  std::string data_root) {
  PlanningDataReader read = PlanningDatasetReader(rates, data_root);
  DataGroupPlanner plan = PlanningDataGroupPlanner(std::move(hardware), std::move(rates), std::move(data_root));
  return [read = std::move(read), plan = std::move(plan)](
             const JobSpec& spec, const Placement& placement) -> absl::StatusOr<GroupPlan> {
    absl::StatusOr<PlanningData> data = read(spec);
    if (!data.ok()) return data.status();
    return plan(spec, placement, *data);
  };
}

}  // namespace recfleet::coordinator
