#ifndef RECFLEET_ENGINE_JOB_MODEL_H_
#define RECFLEET_ENGINE_JOB_MODEL_H_

// The one path from a JobSpec to what is trained: the model (GEM-lite's
// config and feature schema, with the dataset columns it reads), the data
// configuration (what the loader deals to every rank) and the conversion of
// dataset rows into engine batches. The coordinator's CreateJob, the planner
// adapter, the worker daemon and `recfleet train --local` all go through
// here, so a spec means the same thing everywhere.
//
// Every JobSpec field is either honored or rejected: a field GEM-lite does
// not build yet fails with "spec.<path>: not supported yet (...)" rather than
// being dropped. Structural rules (positive sizes, names that resolve) are
// services/coordinator/spec_validation.h's; BuildJobModel assumes them but
// never crashes on a spec that breaks them.
//
// The mapping: tables become the feature schema's tables (ids taken modulo
// rows); ID_LIST and CANDIDATE features become pooled id-list tokens;
// SEQUENCE features become the fields of the history events (one token per
// event, the sum of its fields' embeddings); NUMERIC features feed the dense
// input; the sequence / cross / dense / head sub-specs set the network's
// sizes. GEM-lite's dense part is an optional DCN module followed by one
// MoE (every expert gated) or one MLP (a single expert) of exactly two
// layers [hidden, out], then one tower per head of one hidden layer.
//
// Pure functions and immutable objects; thread-safe.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "data/batch.h"
#include "data/schema.h"
#include "engine/batch.h"
#include "engine/layers/attention.h"
#include "engine/model_config.h"
#include "recfleet/v1/dataloader.pb.h"
#include "recfleet/v1/job.pb.h"
#include "recfleet/v1/plan.pb.h"

namespace recfleet::engine {

// A job's eval batch: spec.data.eval_batch_size, or when unset (0) its
// local_batch_size, as job.proto documents; so an eval forward holds no more
// activations than a training step's, which the plan's peak covers.
inline int64_t EvalBatchSize(const v1::JobSpec& spec) {
  return spec.data().eval_batch_size() > 0 ? spec.data().eval_batch_size() : spec.data().local_batch_size();
}

struct JobModel {
  FeatureSchema schema;
  GemLiteConfig config;
  // Dataset column of each schema.id_lists / schema.sequence_fields entry.
  std::vector<std::string> id_list_columns;
  std::vector<std::string> sequence_columns;
  // Events beyond this many (the most recent kept) are dropped; 0 = all.
  std::vector<int> sequence_max_length;
  // NUMERIC features and their widths, in spec order.
  std::vector<std::pair<std::string, int>> numeric_columns;
  // Label columns of the CTR and CVR heads ("" when the head is absent).
  std::string ctr_label;
  std::string cvr_label;
  // model.precision.quality_gate (engine/quality_gate.h); disabled when
  // max_relative_ne_increase is 0.
  struct QualityGate {
    double max_relative_ne_increase = 0;
    int shadow_steps = 200;
    int64_t eval_samples = 65'536;
    int runs = 1;
    bool enabled() const { return max_relative_ne_increase > 0; }
  } quality_gate;
  // model.activation_memory: the level every self-attention block
  // recomputes ("sequence": kBlock, "sequence.projections": kProjections,
  // ...; kNone when none is named), or a per-GPU budget of kept activation
  // bytes (0: none) the planner meets, and whether recomputing blocks keep
  // FP8 copies.
  struct ActivationMemory {
    bool recompute_sequence = false;  // Any level named.
    layers::BlockCheckpoint level = layers::BlockCheckpoint::kNone;
    int64_t budget_bytes = 0;
    bool fp8_saved = false;
  } activation_memory;

  // Every derived setting, one per line: what tests compare to see whether
  // a spec field changed the model.
  std::string DebugString() const;
};

// The model `spec` trains. InvalidArgument listing every field GEM-lite
// does not build ("spec.model.dense[1].moe.top_k: not supported yet ..."),
// "; "-joined.
absl::StatusOr<JobModel> BuildJobModel(const v1::JobSpec& spec);

// The planner's checkpoint regions of the sequence blocks, in the order
// their levels nest (engine/layers/attention.h BlockCheckpoint kNorm,
// kProjections, kBlock): "sequence.norm", "sequence.projections",
// "sequence.attention".
extern const char* const kSequenceCheckpointRegions[3];

// ExecutionOptions::attention_checkpoint for `model`, one mode per block:
// every block at the level model.activation_memory.recompute names; else
// the planner's choice in `plan` (its sequence regions' recomputed units,
// chosen for the job's budget or forced by HBM: block l gets the deepest
// level whose region recomputes more than l blocks, since the engine's
// levels nest); else kNone everywhere. FailedPrecondition when the job has a
// budget and `plan` (may be null) carries no choice; InvalidArgument for a
// choice beyond the model's blocks.
absl::StatusOr<std::vector<layers::BlockCheckpoint>> AttentionCheckpointModes(const JobModel& model,
                                                                             const v1::Plan* plan);

// The data configuration of `spec` for a job named `job` on `world_size`
// ranks. InvalidArgument for data settings that are not supported yet
// (micro-batches, multi-step BBS windows).
absl::StatusOr<v1::DataConfig> BuildDataConfig(const v1::JobSpec& spec, const std::string& job, int world_size);

// Everything the spec asks that nothing builds yet, beyond the model and
// data: BuildJobModel's and BuildDataConfig's errors plus the spec's other
// sections (e.g. parallelism.expert_parallel). OK when the spec is
// buildable. What CreateJob calls after structural validation.
absl::Status CheckBuildable(const v1::JobSpec& spec);

// Binds the model's feature and label names to a dataset's columns
// (data/schema.h) and turns dataset rows into engine batches: a scalar int64
// column is a one-id list, a jagged int64 column a list; ids are taken
// modulo the table's rows; a NUMERIC feature of width 1 reads a scalar
// float column and of width w a jagged float column of w values per row.
class BatchConverter {
 public:
  // FailedPrecondition naming the missing column and its required form when
  // `dataset` lacks a column the model reads.
  static absl::StatusOr<BatchConverter> Create(const JobModel& model, const data::Schema& dataset);

  // Rows `rows` of `source` (same schema as at Create) as one engine batch.
  Batch Convert(const data::Batch& source, absl::Span<const int64_t> rows) const;
  // Every row of `source`.
  Batch ConvertAll(const data::Batch& source) const;

  // The sample id of row `row`: the "sample_id" column when the dataset has
  // one, else -1.
  int64_t SampleId(const data::Batch& source, int64_t row) const;

 private:
  struct IdColumn {
    int column = -1;
    bool jagged = false;
    int64_t rows = 1;    // Table rows: ids are taken modulo this.
    int max_length = 0;  // Sequence fields: keep the most recent events.
  };
  struct NumericColumn {
    int column = -1;
    int width = 1;
  };

  std::vector<IdColumn> id_lists_;
  std::vector<IdColumn> sequence_;
  std::vector<NumericColumn> numeric_;
  int num_dense_ = 0;
  int ctr_label_ = -1;
  int cvr_label_ = -1;
  int sample_id_ = -1;
};

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_JOB_MODEL_H_
