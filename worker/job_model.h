#ifndef RECFLEET_WORKER_JOB_MODEL_H_
#define RECFLEET_WORKER_JOB_MODEL_H_

// From a job's spec to what the engine trains, and from dataset rows to the
// engine's batches.
//
// JobModelFromSpec maps spec.model onto the engine's GEM-lite: tables become
// the feature schema's tables; ID_LIST and CANDIDATE features become pooled
// id-list tokens; SEQUENCE features become the fields of the history events
// (one token per event, the sum of its fields' embeddings); NUMERIC features
// feed the dense input; the sequence/cross/dense/head sub-specs set the
// network's sizes. The engine uses one embedding width, so every table must
// have the same dim.
//
// BatchConverter binds the spec's feature and label names to the columns
// of a dataset (data/schema.h) and turns dataset rows into engine batches:
// a scalar int64 column is a one-id list, a jagged int64 column a list;
// ids are taken modulo the table's rows (EmbeddingTable.rows: "hash
// buckets"); a NUMERIC feature of width 1 reads a scalar float column and
// of width w a jagged float column of exactly w values per row.
//
// Pure functions and immutable objects; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "data/batch.h"
#include "data/schema.h"
#include "engine/batch.h"
#include "engine/model_config.h"
#include "recfleet/v1/job.pb.h"

namespace recfleet::worker {

struct JobModel {
  engine::FeatureSchema schema;
  engine::GemLiteConfig config;
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
};

// InvalidArgument naming the spec field ("spec.model.features[3].table ...")
// when the spec asks for something GEM-lite cannot build.
absl::StatusOr<JobModel> JobModelFromSpec(const v1::JobSpec& spec);

class BatchConverter {
 public:
  // FailedPrecondition naming the missing column and its required form when
  // `dataset` lacks a column the model reads.
  static absl::StatusOr<BatchConverter> Create(const JobModel& model, const data::Schema& dataset);

  // Rows `rows` of `source` (same schema as at Create) as one engine batch.
  engine::Batch Convert(const data::Batch& source, absl::Span<const int64_t> rows) const;
  // Every row of `source`.
  engine::Batch ConvertAll(const data::Batch& source) const;

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

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_JOB_MODEL_H_
