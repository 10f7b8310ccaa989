#include "services/dataloader/service.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/dataloader/convert.h"

namespace recfleet::dataloader {
namespace {

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

DataLoaderService::DataLoaderService(std::unique_ptr<data::Loader> loader, ServiceOptions options,
                                     LoaderMetrics* metrics)
    : options_(options),
      metrics_(metrics),
      first_rank_(loader->options().first_rank),
      num_ranks_(loader->options().deal.ranks),
      steps_per_epoch_(loader->steps_per_epoch()),
      loader_(std::move(loader)),
      cache_capacity_(2 * static_cast<size_t>(std::max(1, options.prefetch)) + 2) {
  const data::LoaderOptions& o = loader_->options();
  SchemaToProto(*loader_->schema(), &info_);
  info_.set_first_rank(first_rank_);
  info_.set_num_ranks(num_ranks_);
  info_.set_steps_per_epoch(steps_per_epoch_);
  info_.set_samples_per_epoch(loader_->samples_per_epoch());
  info_.set_base_batch_size(o.deal.base_batch);
  info_.set_base_batches_per_rank(o.deal.base_batches_per_rank);
  info_.set_policy(std::string(data::PolicyName(o.policy)));
  info_.set_cost_model(o.cost.ToString());
  info_.set_seed(o.seed);
  info_.set_instance(o.instance);
  info_.set_num_instances(o.num_instances);
  for (int r = 0; r < num_ranks_; ++r) metrics_->SetQueueDepth(first_rank_ + r, 0);
}

grpc::Status DataLoaderService::GetInfo(grpc::ServerContext*, const recfleet::v1::GetInfoRequest*,
                                        recfleet::v1::LoaderInfo* out) {
  *out = info_;
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<const data::StepPlan>> DataLoaderService::TakePlan(int64_t epoch,
                                                                                  int64_t step,
                                                                                  int rank) {
  absl::MutexLock l(&mu_);
  const auto key = std::make_pair(epoch, step);
  auto it = cache_.begin();
  while (it != cache_.end() && it->key != key) ++it;
  if (it == cache_.end()) {
    auto plan = loader_->Plan(epoch, step);
    if (!plan.ok()) return plan.status();
    // Count each step once in the gap metrics, even if recomputed.
    if (key > last_recorded_) {
      metrics_->RecordStep((*plan)->gap, (*plan)->naive_gap);
      last_recorded_ = key;
    }
    cache_.push_front({key, *std::move(plan), std::vector<bool>(num_ranks_, false), 0});
    if (cache_.size() > cache_capacity_) cache_.pop_back();
    it = cache_.begin();
  } else {
    cache_.splice(cache_.begin(), cache_, it);
    it = cache_.begin();
  }
  std::shared_ptr<const data::StepPlan> plan = it->plan;
  const int local = rank - first_rank_;
  if (!it->taken[local]) {
    it->taken[local] = true;
    if (++it->taken_count == num_ranks_) cache_.erase(it);  // Every rank has it.
  }
  return plan;
}

grpc::Status DataLoaderService::StreamBatches(grpc::ServerContext* ctx,
                                              const recfleet::v1::StreamBatchesRequest* req,
                                              grpc::ServerWriter<recfleet::v1::RankBatch>* writer) {
  const int rank = req->rank();
  if (rank < first_rank_ || rank >= first_rank_ + num_ranks_) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("rank ", rank, " is not served here; this loader serves ranks ", first_rank_,
                     "..", first_rank_ + num_ranks_ - 1));
  }
  if (req->epoch() < 0 || req->start_step() < 0 || req->end_step() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "epoch, start_step and end_step must be >= 0");
  }
  const int64_t end =
      req->end_step() == 0 ? steps_per_epoch_ : std::min(req->end_step(), steps_per_epoch_);
  if (req->start_step() >= steps_per_epoch_) {
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                        absl::StrCat("start_step ", req->start_step(), " is past the epoch's ",
                                     steps_per_epoch_, " steps"));
  }
  using Item = absl::StatusOr<std::unique_ptr<recfleet::v1::RankBatch>>;
  BoundedQueue<Item> queue(static_cast<size_t>(std::max(1, options_.prefetch)));
  std::thread producer([&] {
    for (int64_t s = req->start_step(); s < end; ++s) {
      auto plan = TakePlan(req->epoch(), s, rank);
      if (!plan.ok()) {
        queue.Push(plan.status());
        break;
      }
      auto msg = std::make_unique<recfleet::v1::RankBatch>();
      RankBatchToProto(data::GatherRank(**plan, rank - first_rank_), (*plan)->gap,
                       (*plan)->naive_gap, msg.get());
      if (!queue.Push(std::move(msg))) break;
    }
    queue.Close();
  });
  grpc::Status result = grpc::Status::OK;
  Item item;
  while (queue.Pop(&item)) {
    metrics_->SetQueueDepth(rank, static_cast<int>(queue.size()));
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
    metrics_->RecordSent(rank, msg.num_samples(), bytes);
  }
  queue.Close();
  producer.join();
  metrics_->SetQueueDepth(rank, 0);
  return result;
}

}  // namespace recfleet::dataloader
