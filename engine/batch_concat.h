#ifndef RECFLEET_ENGINE_BATCH_CONCAT_H_
#define RECFLEET_ENGINE_BATCH_CONCAT_H_

// Several batches of one schema as one: what a rank-0-holds-everything
// reference trains on when N ranks each train their own part, and how a
// benchmark builds a big batch from small ones.

#include <vector>

#include "engine/batch.h"

namespace recfleet::engine {

// The samples of parts[0], then parts[1]'s, ... (every part has the same
// id-list and sequence features and label columns). `parts` must not be
// empty.
Batch ConcatBatches(const std::vector<Batch>& parts);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_BATCH_CONCAT_H_
