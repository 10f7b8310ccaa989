#include "worker/rank_data.h"

#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/dataloader/client.h"

namespace recfleet::worker {
namespace {

// Global step -> (epoch, step in epoch).
struct StepIndex {
  int64_t epoch;
  int64_t in_epoch;
};
StepIndex IndexOf(int64_t step, int64_t steps_per_epoch) {
  return {(step - 1) / steps_per_epoch, (step - 1) % steps_per_epoch};
}

void AllRows(const data::Batch& b, std::vector<int64_t>* rows) {
  rows->resize(b.num_rows());
  std::iota(rows->begin(), rows->end(), 0);
}

class LoaderRankData : public RankData {
 public:
  LoaderRankData(std::unique_ptr<dataloader::DataLoaderClient> client, int rank)
      : client_(std::move(client)), rank_(rank), steps_per_epoch_(client_->info().steps_per_epoch()) {}

  const data::Schema& schema() const override { return *client_->schema(); }
  int64_t steps_per_epoch() const override { return steps_per_epoch_; }

  absl::StatusOr<const data::Batch*> Step(int64_t step, std::vector<int64_t>* rows) override {
    const StepIndex at = IndexOf(step, steps_per_epoch_);
    if (stream_ == nullptr || at.epoch != epoch_ || at.in_epoch != next_) {
      absl::StatusOr<std::unique_ptr<dataloader::BatchStream>> stream =
          client_->StreamBatches(rank_, at.epoch, at.in_epoch);
      if (!stream.ok()) return stream.status();
      stream_ = std::move(*stream);
      epoch_ = at.epoch;
    }
    absl::StatusOr<bool> more = stream_->Next(&batch_);
    if (!more.ok()) return more.status();
    if (!*more || batch_.step != at.in_epoch || batch_.epoch != at.epoch) {
      return absl::DataLossError(absl::StrCat("data-loader stream for rank ", rank_, " ended or skipped: wanted epoch ",
                                              at.epoch, " step ", at.in_epoch, ", got epoch ", batch_.epoch, " step ",
                                              batch_.step));
    }
    next_ = at.in_epoch + 1;
    if (next_ == steps_per_epoch_) stream_.reset();
    AllRows(batch_.samples, rows);
    return &batch_.samples;
  }

 private:
  std::unique_ptr<dataloader::DataLoaderClient> client_;
  const int rank_;
  const int64_t steps_per_epoch_;
  std::unique_ptr<dataloader::BatchStream> stream_;
  int64_t epoch_ = -1;
  int64_t next_ = -1;
  data::RankBatch batch_;
};

class LocalRankData : public RankData {
 public:
  LocalRankData(std::shared_ptr<dataloader::JobLoader> job, int rank) : job_(std::move(job)), rank_(rank) {}

  const data::Schema& schema() const override { return *job_->schema(); }
  int64_t steps_per_epoch() const override { return job_->steps_per_epoch(); }

  absl::StatusOr<const data::Batch*> Step(int64_t step, std::vector<int64_t>* rows) override {
    const StepIndex at = IndexOf(step, job_->steps_per_epoch());
    absl::StatusOr<std::shared_ptr<const data::StepPlan>> plan = job_->TakePlan(at.epoch, at.in_epoch, rank_);
    if (!plan.ok()) return plan.status();
    batch_ = data::GatherRank(**plan, rank_);
    AllRows(batch_.samples, rows);
    return &batch_.samples;
  }

 private:
  const std::shared_ptr<dataloader::JobLoader> job_;
  const int rank_;
  data::RankBatch batch_;
};

absl::Status CheckRank(const v1::DataConfig& config, int rank) {
  if (rank < 0 || rank >= config.num_ranks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not a rank of ", config.job(), " (", config.num_ranks(), " ranks)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankData>> OpenLoaderRankData(const std::string& address,
                                                             const v1::DataConfig& config, int rank,
                                                             dataloader::ConnectOptions connect) {
  if (absl::Status s = CheckRank(config, rank); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<dataloader::DataLoaderClient>> client =
      dataloader::DataLoaderClient::Connect(address, config, std::move(connect));
  if (!client.ok()) {
    return absl::Status(client.status().code(),
                        absl::StrCat("data-loader ", address, ": ", client.status().message()));
  }
  return std::unique_ptr<RankData>(new LoaderRankData(std::move(*client), rank));
}

absl::StatusOr<std::unique_ptr<RankData>> OpenLocalRankData(const v1::DataConfig& config, int rank,
                                                            const dataloader::DatasetOptions& datasets) {
  if (absl::Status s = CheckRank(config, rank); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<dataloader::JobLoader>> job = dataloader::JobLoader::Open(config, datasets);
  if (!job.ok()) return job.status();
  return std::unique_ptr<RankData>(new LocalRankData(std::move(*job), rank));
}

}  // namespace recfleet::worker
