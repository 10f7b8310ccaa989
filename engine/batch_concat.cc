#include "engine/batch_concat.h"

namespace recfleet::engine {

Batch ConcatBatches(const std::vector<Batch>& parts) {
  Batch out = parts[0];
  auto append = [](IdList& to, const IdList& from) {
    const int64_t base = static_cast<int64_t>(to.ids.size());
    to.ids.insert(to.ids.end(), from.ids.begin(), from.ids.end());
    for (size_t i = 1; i < from.offsets.size(); ++i) to.offsets.push_back(base + from.offsets[i]);
  };
  for (size_t p = 1; p < parts.size(); ++p) {
    const Batch& b = parts[p];
    out.size += b.size;
    for (size_t f = 0; f < out.id_lists.size(); ++f) append(out.id_lists[f], b.id_lists[f]);
    for (size_t f = 0; f < out.sequence.size(); ++f) append(out.sequence[f], b.sequence[f]);
    out.dense.insert(out.dense.end(), b.dense.begin(), b.dense.end());
    out.ctr_labels.insert(out.ctr_labels.end(), b.ctr_labels.begin(), b.ctr_labels.end());
    out.cvr_labels.insert(out.cvr_labels.end(), b.cvr_labels.begin(), b.cvr_labels.end());
  }
  return out;
}

}  // namespace recfleet::engine
