#include "planner/model.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace recfleet::planner {
namespace {

double Moment(const std::vector<SeqLengthBucket>& hist, int power) {
  double total = 0, sum = 0;
  for (const auto& b : hist) {
    total += b.fraction;
    sum += b.fraction * (power == 1 ? b.length : b.length * b.length);
  }
  return total > 0 ? sum / total : 0;
}

absl::Status NonNegative(const std::string& where, const char* field, double v) {
  if (v >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(where, ": '", field, "' must be >= 0, got ", v));
}

}  // namespace

const char* OpKindName(OpKind op) {
  switch (op) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kElementwise:
      return "elementwise";
  }
  return "?";
}

double Model::MeanLength() const { return Moment(sequence_lengths, 1); }
double Model::MeanSquaredLength() const { return Moment(sequence_lengths, 2); }

double Model::ForwardFlopsPerSample(const DenseModule& m) const {
  return m.flops_per_sample + m.flops_per_token * MeanLength() +
         m.flops_per_token_sq * MeanSquaredLength();
}

double Model::ActivationBytesPerSample(const DenseModule& m) const {
  return m.activation_bytes_per_sample + m.activation_bytes_per_token * MeanLength();
}

absl::Status ValidateRequest(const PlanRequest& r) {
  if (r.local_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job: 'batch.local' must be > 0 samples per GPU, got ", r.local_batch));
  }
  if (r.rank_sync_fraction < 0) return absl::InvalidArgumentError("rank_sync_fraction must be >= 0");
  if (r.other_compute_s < 0 || r.other_memory_bytes < 0) {
    return absl::InvalidArgumentError("other_compute_s and other_memory_bytes must be >= 0");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < r.model.modules.size(); ++i) {
    const DenseModule& m = r.model.modules[i];
    std::string where = absl::StrCat("model.dense[", i, "]");
    if (m.name.empty()) return absl::InvalidArgumentError(where + ": 'name' is required");
    where = absl::StrCat(where, " '", m.name, "'");
    if (!names.insert(m.name).second) {
      return absl::InvalidArgumentError(where + ": duplicate module name");
    }
    for (auto s : {NonNegative(where, "params", m.params),
                   NonNegative(where, "num_experts", m.num_experts),
                   NonNegative(where, "flops_per_sample", m.flops_per_sample),
                   NonNegative(where, "flops_per_token", m.flops_per_token),
                   NonNegative(where, "flops_per_token_sq", m.flops_per_token_sq),
                   NonNegative(where, "activation_bytes_per_sample", m.activation_bytes_per_sample),
                   NonNegative(where, "activation_bytes_per_token", m.activation_bytes_per_token),
                   NonNegative(where, "io_bytes_per_sample", m.io_bytes_per_sample),
                   NonNegative(where, "recompute_units", m.recompute_units),
                   NonNegative(where, "backward_scratch_bytes_per_sample",
                               m.backward_scratch_bytes_per_sample)}) {
      if (!s.ok()) return s;
    }
  }
  if (r.activation_budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation_budget_bytes must be >= 0 (0: no budget), got ", r.activation_budget_bytes));
  }
  for (const std::string& region : r.recompute_regions) {
    bool found = false, recomputable = true;
    for (const DenseModule& m : r.model.modules) {
      if (m.RegionName() != region) continue;
      found = true;
      recomputable = recomputable && m.recomputable;
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("recompute_regions: no checkpoint region named '", region, "'"));
    }
    if (!recomputable) {
      return absl::InvalidArgumentError(
          absl::StrCat("recompute_regions: region '", region, "' cannot be recomputed"));
    }
  }
  for (const std::string& name : r.precision.fp8_modules) {
    if (!names.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("precision.fp8_modules: no dense module named '", name, "'"));
    }
  }
  std::set<std::string> tables;
  for (size_t i = 0; i < r.model.tables.size(); ++i) {
    const Table& t = r.model.tables[i];
    std::string where = absl::StrCat("model.tables[", i, "]");
    if (t.name.empty()) return absl::InvalidArgumentError(where + ": 'name' is required");
    where = absl::StrCat(where, " '", t.name, "'");
    if (!tables.insert(t.name).second) {
      return absl::InvalidArgumentError(where + ": duplicate table name");
    }
    if (t.rows <= 0 || t.dim <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": 'rows' and 'dim' must be > 0, got ", t.rows, " x ", t.dim));
    }
    if (t.access_frequency < 0 || t.access_frequency > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": 'access_frequency' must be in [0, 1], got ", t.access_frequency));
    }
    if (auto s = NonNegative(where, "pooling_factor", t.pooling_factor); !s.ok()) return s;
  }
  for (size_t i = 0; i < r.model.sequence_lengths.size(); ++i) {
    const auto& b = r.model.sequence_lengths[i];
    if (b.length < 0 || b.fraction < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.sequence_lengths[", i, "]: 'length' and 'fraction' must be >= 0"));
    }
  }
  const Efficiencies& e = r.efficiency;
  for (auto [field, v] : {std::pair<const char*, double>{"gemm", e.gemm},
                          {"attention", e.attention},
                          {"elementwise", e.elementwise},
                          {"embedding", e.embedding}}) {
    if (!(v > 0 && v <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("efficiency.", field, " must be in (0, 1], got ", v));
    }
  }
  if (r.options.hbm_reserve_fraction < 0 || r.options.hbm_reserve_fraction >= 1) {
    return absl::InvalidArgumentError("planner.hbm_reserve must be in [0, 1)");
  }
  if (r.options.max_model_parallel_group < 0) {
    return absl::InvalidArgumentError("planner.max_model_parallel_group must be >= 0");
  }
  if (r.options.embedding_sync_interval < 1) {
    return absl::InvalidArgumentError("planner.embedding_sync_interval must be >= 1");
  }
  for (auto [field, v] : {std::pair<const char*, int>{"fsdp_group_size", r.hints.fsdp_group_size},
                          {"replicas", r.hints.replicas},
                          {"table_sharding_group_size", r.hints.table_sharding_group_size}}) {
    if (v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parallelism.", field, " must be >= 0 (0: the planner decides), got ", v));
    }
  }
  return absl::OkStatus();
}

}  // namespace recfleet::planner
