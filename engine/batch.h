#ifndef RECFLEET_ENGINE_BATCH_H_
#define RECFLEET_ENGINE_BATCH_H_

// What a dataset hands the model: the feature schema (tables and the
// features that look them up) and batches of samples in that schema.
// Plain host data; the model turns it into kernel views.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "kernels/embedding/embedding.h"

namespace recfleet::engine {

struct FeatureSchema {
  struct Table {
    std::string name;
    int64_t rows = 0;
  };
  // A variable-length id list pooled into one token per sample.
  struct IdListFeature {
    std::string name;
    int table = 0;  // Index into `tables`.
    Pooling pooling = Pooling::kSum;
  };
  // One field of the event sequence; an event's token is the sum of its
  // fields' embeddings (e.g. item + action + time bucket).
  struct SequenceField {
    std::string name;
    int table = 0;
  };

  std::vector<Table> tables;
  std::vector<IdListFeature> id_lists;
  std::vector<SequenceField> sequence_fields;
  int num_dense = 0;  // Numeric features per sample.
};

// Ids of one feature for a whole batch: sample b owns
// ids[offsets[b], offsets[b+1]).
struct IdList {
  std::vector<int64_t> offsets = {0};
  std::vector<int64_t> ids;

  void Append(absl::Span<const int64_t> sample_ids) {
    ids.insert(ids.end(), sample_ids.begin(), sample_ids.end());
    offsets.push_back(static_cast<int64_t>(ids.size()));
  }
};

struct Batch {
  int64_t size = 0;
  std::vector<IdList> id_lists;    // One per schema id-list feature.
  std::vector<IdList> sequence;    // One per sequence field, same offsets.
  std::vector<float> dense;        // [size, num_dense] row-major.
  std::vector<float> ctr_labels;   // [size], or empty when the data has none.
  std::vector<float> cvr_labels;   // [size], or empty when the data has none.
};

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_BATCH_H_
