#include "kernels/ops/multi_tensor_layout.h"

#include <utility>

namespace recfleet {

int64_t AssignChunks(std::vector<MultiTensorEntry>* entries, int64_t chunk) {
  std::vector<MultiTensorEntry> kept;
  int64_t next = 0;
  for (MultiTensorEntry e : *entries) {
    if (e.numel <= 0) continue;
    e.first_chunk = next;
    next += (e.numel + chunk - 1) / chunk;
    kept.push_back(e);
  }
  *entries = std::move(kept);
  return next;
}

}  // namespace recfleet
