// CPU reference for embedding.h: simple loops, double accumulation.

#include <cmath>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/formats.h"
#include "kernels/embedding/embedding_internal.h"

namespace recfleet::embedding_internal {
namespace {

// Bag b covers ids [Begin(b), End(b)); without offsets every id is a bag.
struct Bags {
  const TensorView& ids;
  const TensorView& offsets;
  int64_t count() const { return offsets.data ? offsets.numel() - 1 : ids.numel(); }
  int64_t begin(int64_t b) const { return offsets.data ? LoadIndex(offsets, b) : b; }
  int64_t end(int64_t b) const { return offsets.data ? LoadIndex(offsets, b + 1) : b + 1; }
};

absl::Status CheckIdsInRange(const TensorView& ids, int64_t rows) {
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = LoadIndex(ids, i);
    if (id < 0 || id >= rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("ids[", i, "] = ", id, " is outside the table's rows [0, ", rows, ")"));
    }
  }
  return absl::OkStatus();
}

double BagScale(Pooling pooling, int64_t length) {
  return pooling == Pooling::kMean && length > 0 ? 1.0 / static_cast<double>(length) : 1.0;
}

}  // namespace

absl::Status ForwardCpu(const TensorView& table, const TensorView& ids, const TensorView& offsets,
                        Pooling pooling, const TensorView& out) {
  const int64_t rows = table.dim(0), dim = table.dim(1);
  if (auto s = CheckIdsInRange(ids, rows); !s.ok()) return s;
  const Bags bags{ids, offsets};
  std::vector<double> acc(dim);
  for (int64_t b = 0; b < bags.count(); ++b) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = bags.begin(b); i < bags.end(b); ++i) {
      const int64_t row = LoadIndex(ids, i);
      for (int64_t d = 0; d < dim; ++d) acc[d] += LoadAsDouble(table, row * dim + d);
    }
    const double scale = BagScale(pooling, bags.end(b) - bags.begin(b));
    for (int64_t d = 0; d < dim; ++d) StoreFromDouble(out, b * dim + d, acc[d] * scale);
  }
  return absl::OkStatus();
}

absl::Status BackwardAdagradCpu(const TensorView& grad_out, const TensorView& ids,
                                const TensorView& offsets, Pooling pooling,
                                const RowwiseAdagradConfig& config, const TensorView& table,
                                const TensorView& momentum) {
  const int64_t rows = table.dim(0), dim = table.dim(1);
  if (auto s = CheckIdsInRange(ids, rows); !s.ok()) return s;
  const Bags bags{ids, offsets};
  // Deduplicate: one summed gradient per distinct id (ordered map keeps the
  // reference deterministic and obviously correct, not fast).
  std::map<int64_t, std::vector<double>> grads;
  for (int64_t b = 0; b < bags.count(); ++b) {
    const double scale = BagScale(pooling, bags.end(b) - bags.begin(b));
    for (int64_t i = bags.begin(b); i < bags.end(b); ++i) {
      std::vector<double>& g = grads[LoadIndex(ids, i)];
      g.resize(dim, 0.0);
      for (int64_t d = 0; d < dim; ++d) g[d] += scale * LoadAsDouble(grad_out, b * dim + d);
    }
  }
  for (const auto& [row, g] : grads) {
    double sum_sq = 0;
    for (double v : g) sum_sq += v * v;
    const double m = LoadAsDouble(momentum, row) + sum_sq / static_cast<double>(dim);
    StoreFromDouble(momentum, row, m);
    // Use the stored (rounded) accumulator, as the CUDA kernel does.
    const double step = config.learning_rate / (std::sqrt(LoadAsDouble(momentum, row)) + config.eps);
    for (int64_t d = 0; d < dim; ++d) {
      const int64_t k = row * dim + d;
      StoreFromDouble(table, k, LoadAsDouble(table, k) - step * g[d]);
    }
  }
  return absl::OkStatus();
}

}  // namespace recfleet::embedding_internal
