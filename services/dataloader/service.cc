#include "services/dataloader/service.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "services/dataloader/convert.h"
#include "spdlog/spdlog.h"

namespace recfleet::dataloader {
namespace {

// A job no stream reads and no request named for this long is closed (its
// data and metrics series released); a later request opens it again.
constexpr absl::Duration kIdleClose = absl::Minutes(30);

// A bounded FIFO between a stream's producer and its writer.
template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity) {}
  // False if the queue was closed while waiting for room.
  bool Push(T item) {
    std::unique_lock<std::mutex> l(mu_);
    not_full_.wait(l, [&] { return closed_ || items_.size() < capacity_; });
    if (closed_) return false;
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return true;
  }
  // False once closed and drained.
  bool Pop(T* item) {
    std::unique_lock<std::mutex> l(mu_);
    not_empty_.wait(l, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return false;
    *item = std::move(items_.front());
    items_.pop_front();
    not_full_.notify_one();
    return true;
  }
  void Close() {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
    not_full_.notify_all();
    not_empty_.notify_all();
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu_);
    return items_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable not_full_, not_empty_;
  std::deque<T> items_;
  size_t capacity_;
  bool closed_ = false;
};

}  // namespace

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

DataLoaderService::DataLoaderService(DatasetOptions datasets, ServiceOptions options, LoaderMetrics* metrics)
    : options_(options),
      metrics_(metrics),
      jobs_(std::move(datasets), kIdleClose, [metrics](const std::string& job) {
        spdlog::info("closed {}: no request for {}", job, absl::FormatDuration(kIdleClose));
        metrics->EndJob(job);
      }) {}

absl::StatusOr<std::shared_ptr<JobLoader>> DataLoaderService::Job(const recfleet::v1::DataConfig& config) {
  absl::StatusOr<std::shared_ptr<JobLoader>> job = jobs_.Get(config);
  metrics_->SetOpenJobs(jobs_.open_jobs());
  if (!job.ok()) spdlog::warn("cannot open {}: {}", config.job(), job.status().ToString());
  return job;
}

grpc::Status DataLoaderService::GetInfo(grpc::ServerContext*, const recfleet::v1::GetInfoRequest* req,
                                        recfleet::v1::LoaderInfo* out) {
  absl::StatusOr<std::shared_ptr<JobLoader>> job = Job(req->config());
  if (!job.ok()) return ToGrpc(job.status());
  *out = (*job)->info();
  return grpc::Status::OK;
}

grpc::Status DataLoaderService::StreamBatches(grpc::ServerContext* ctx,
                                              const recfleet::v1::StreamBatchesRequest* req,
                                              grpc::ServerWriter<recfleet::v1::RankBatch>* writer) {
  absl::StatusOr<std::shared_ptr<JobLoader>> job_or = Job(req->config());
  if (!job_or.ok()) return ToGrpc(job_or.status());
  JobLoader& job = **job_or;
  const int64_t steps_per_epoch = job.steps_per_epoch();
  const int rank = req->rank();
  if (rank < 0 || rank >= req->config().num_ranks()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("rank ", rank, " is not a rank of ", req->config().job(), " (",
                                     req->config().num_ranks(), " ranks)"));
  }
  if (req->epoch() < 0 || req->start_step() < 0 || req->end_step() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "epoch, start_step and end_step must be >= 0");
  }
  const int64_t end =
      req->end_step() == 0 ? steps_per_epoch : std::min(req->end_step(), steps_per_epoch);
  if (req->start_step() >= steps_per_epoch) {
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                        absl::StrCat("start_step ", req->start_step(), " is past the epoch's ",
                                     steps_per_epoch, " steps"));
  }
  using Item = absl::StatusOr<std::unique_ptr<recfleet::v1::RankBatch>>;
  BoundedQueue<Item> queue(static_cast<size_t>(std::max(1, options_.prefetch)));
  std::thread producer([&] {
    for (int64_t s = req->start_step(); s < end; ++s) {
      bool first_time = false;
      auto plan = job.TakePlan(req->epoch(), s, rank, &first_time);
      if (plan.ok() && first_time) metrics_->RecordStep(req->config().job(), (*plan)->gap, (*plan)->naive_gap);
      if (!plan.ok()) {
        queue.Push(plan.status());
        break;
      }
      auto msg = std::make_unique<recfleet::v1::RankBatch>();
      RankBatchToProto(data::GatherRank(**plan, rank), (*plan)->gap,
                       (*plan)->naive_gap, msg.get());
      if (!queue.Push(std::move(msg))) break;
    }
    queue.Close();
  });
  grpc::Status result = grpc::Status::OK;
  Item item;
  while (queue.Pop(&item)) {
    metrics_->SetQueueDepth(req->config().job(), rank, static_cast<int>(queue.size()));
    if (!item.ok()) {
      result = ToGrpc(item.status());
      break;
    }
    const recfleet::v1::RankBatch& msg = **item;
    if (ctx->IsCancelled() || !writer->Write(msg)) {
      result = grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      break;
    }
    int64_t bytes = 0;
    for (const auto& c : msg.columns()) bytes += c.values().size() + c.offsets().size();
    metrics_->RecordSent(req->config().job(), rank, msg.num_samples(), bytes);
  }
  queue.Close();
  producer.join();
  metrics_->EndStream(req->config().job(), rank);
  if (!result.ok() && result.error_code() != grpc::StatusCode::CANCELLED) {
    spdlog::warn("{} rank {} epoch {}: stream ended: {}", req->config().job(), rank, req->epoch(),
                 result.error_message());
  }
  return result;
}

}  // namespace recfleet::dataloader
