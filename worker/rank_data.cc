#include "worker/rank_data.h"

#include <optional>
#include <utility>

#include "data/dataset_file.h"
#include "worker/batch_plan.h"

namespace recfleet::worker {
namespace {

class DatasetRankData : public RankData {
 public:
  DatasetRankData(data::Batch rows, BatchPlan plan, int rank)
      : rows_(std::move(rows)), plan_(std::move(plan)), rank_(rank) {}

  const data::Schema& schema() const override { return rows_.schema(); }

  absl::StatusOr<const data::Batch*> Step(int64_t step, std::vector<int64_t>* rows) override {
    *rows = plan_.Rows(step, rank_);
    return &rows_;
  }

 private:
  const data::Batch rows_;
  const BatchPlan plan_;
  const int rank_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RankData>> OpenDatasetRankData(const std::string& path, int rank, int world_size,
                                                              int64_t local_batch, uint64_t seed) {
  absl::StatusOr<data::Batch> rows = data::ReadAll(path);
  if (!rows.ok()) return rows.status();
  absl::StatusOr<BatchPlan> plan =
      BatchPlan::Create(static_cast<int64_t>(rows->num_rows()), world_size, local_batch, seed);
  if (!plan.ok()) return plan.status();
  return std::make_unique<DatasetRankData>(std::move(*rows), std::move(*plan), rank);
}

}  // namespace recfleet::worker
