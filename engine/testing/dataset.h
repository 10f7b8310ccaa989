#ifndef RECFLEET_ENGINE_TESTING_DATASET_H_
#define RECFLEET_ENGINE_TESTING_DATASET_H_

// What the trainer reads: a fixed training set and evaluation set in one
// feature schema, materialized into batches on demand. Implementations must
// make MakeBatch a pure function of its arguments (determinism) and safe to
// call from several threads at once.

#include <cstdint>

#include "absl/types/span.h"
#include "engine/batch.h"

namespace recfleet::engine {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual const FeatureSchema& schema() const = 0;
  virtual int64_t num_train() const = 0;
  virtual int64_t num_eval() const = 0;
  // The samples `indices` (into the train or eval set) as one batch.
  virtual Batch MakeBatch(bool eval, absl::Span<const int64_t> indices) const = 0;
};

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_TESTING_DATASET_H_
