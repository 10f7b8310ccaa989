#include "worker/loader_rank_data.h"

#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/dataloader/client.h"

namespace recfleet::worker {
namespace {

class LoaderRankData : public RankData {
 public:
  LoaderRankData(std::unique_ptr<dataloader::DataLoaderClient> client, int rank)
      : client_(std::move(client)), rank_(rank), steps_per_epoch_(client_->info().steps_per_epoch()) {}

  const data::Schema& schema() const override { return *client_->schema(); }

  absl::StatusOr<const data::Batch*> Step(int64_t step, std::vector<int64_t>* rows) override {
    const int64_t epoch = (step - 1) / steps_per_epoch_;
    const int64_t in_epoch = (step - 1) % steps_per_epoch_;
    if (stream_ == nullptr || epoch != epoch_ || in_epoch != next_) {
      absl::StatusOr<std::unique_ptr<dataloader::BatchStream>> stream =
          client_->StreamBatches(rank_, epoch, in_epoch);
      if (!stream.ok()) return stream.status();
      stream_ = std::move(*stream);
      epoch_ = epoch;
    }
    absl::StatusOr<bool> more = stream_->Next(&batch_);
    if (!more.ok()) return more.status();
    if (!*more || batch_.step != in_epoch || batch_.epoch != epoch) {
      return absl::DataLossError(absl::StrCat("data-loader stream for rank ", rank_, " ended or skipped: wanted epoch ",
                                              epoch, " step ", in_epoch, ", got epoch ", batch_.epoch, " step ",
                                              batch_.step));
    }
    next_ = in_epoch + 1;
    if (next_ == steps_per_epoch_) stream_.reset();
    rows->resize(batch_.samples.num_rows());
    std::iota(rows->begin(), rows->end(), 0);
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

}  // namespace

absl::StatusOr<std::unique_ptr<RankData>> OpenLoaderRankData(const std::string& address, int rank,
                                                             int64_t local_batch,
                                                             const dataloader::ConnectOptions& connect) {
  absl::StatusOr<std::unique_ptr<dataloader::DataLoaderClient>> client =
      dataloader::DataLoaderClient::Connect(address, connect);
  if (!client.ok()) return client.status();
  const v1::LoaderInfo& info = (*client)->info();
  if (rank < info.first_rank() || rank >= info.first_rank() + info.num_ranks()) {
    return absl::FailedPreconditionError(absl::StrCat("data-loader ", address, " serves ranks ", info.first_rank(),
                                                      "..", info.first_rank() + info.num_ranks() - 1, ", not rank ",
                                                      rank));
  }
  const int64_t batch = int64_t{info.base_batch_size()} * info.base_batches_per_rank();
  if (batch != local_batch) {
    return absl::FailedPreconditionError(absl::StrCat("data-loader ", address, " deals ", batch,
                                                      " samples per rank-step, spec.data.local_batch_size is ",
                                                      local_batch, "; start the loader with --batch-size ",
                                                      local_batch));
  }
  if (info.steps_per_epoch() < 1) {
    return absl::FailedPreconditionError(absl::StrCat("data-loader ", address, " has no full step of data"));
  }
  return std::unique_ptr<RankData>(new LoaderRankData(std::move(*client), rank));
}

}  // namespace recfleet::worker
