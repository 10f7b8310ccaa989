#include "data/loader.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace recfleet::data {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A generator seeded from several values, independent of the platform.
std::mt19937_64 Rng(uint64_t seed, uint64_t a, uint64_t b = 0) {
  return std::mt19937_64(Mix(Mix(Mix(seed) ^ a) ^ b));
}

// Fisher-Yates with our own index draws (std::shuffle's use of the
// generator is implementation-defined; recorded plans must not change with
// the standard library).
template <typename T>
void Shuffle(std::vector<T>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng() % i);
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandDatasetPaths(const std::string& spec) {
  std::vector<std::string> out;
  namespace fs = std::filesystem;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    std::string p(part);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(p, ec)) {
        if (e.path().extension() == ".rfd") found.push_back(e.path().string());
      }
      std::sort(found.begin(), found.end());
      if (found.empty()) return absl::NotFoundError(absl::StrCat(p, ": no .rfd files inside"));
      out.insert(out.end(), found.begin(), found.end());
    } else {
      out.push_back(p);
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("no dataset files given");
  return out;
}

absl::StatusOr<std::unique_ptr<Loader>> Loader::Open(const LoaderOptions& options) {
  const DealOptions& d = options.deal;
  if (d.ranks < 1 || d.base_batch < 1 || d.base_batches_per_rank < 1 ||
      d.micro_batch_base_batches < 1 || options.shuffle_blocks < 1 || options.num_instances < 1 ||
      options.instance < 0 || options.instance >= options.num_instances || options.first_rank < 0) {
    return absl::InvalidArgumentError(
        "loader: need ranks, base_batch, base_batches_per_rank, micro-batch and shuffle_blocks "
        ">= 1, and 0 <= instance < num_instances");
  }
  if (options.files.empty()) return absl::InvalidArgumentError("loader: no dataset files");
  std::unique_ptr<Loader> l(new Loader(options));
  uint64_t global_block = 0;
  for (size_t f = 0; f < options.files.size(); ++f) {
    auto file = DatasetFile::Open(options.files[f]);
    if (!file.ok()) return file.status();
    if (f == 0) {
      l->schema_ = (*file)->schema();
    } else if (!((*file)->schema()->features == l->schema_->features)) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.files[f], ": features differ from ", options.files[0], "'s"));
    }
    for (size_t b = 0; b < (*file)->num_blocks(); ++b, ++global_block) {
      if (global_block % options.num_instances != static_cast<uint64_t>(options.instance)) continue;
      l->blocks_.push_back(
          {static_cast<uint32_t>(f), static_cast<uint32_t>(b), (*file)->block_rows(b)});
      l->num_samples_ += (*file)->block_rows(b);
    }
    l->files_.push_back(*std::move(file));
  }
  std::string length = options.length_feature;
  if (length.empty()) {
    auto it = l->schema_->metadata.find("length_feature");
    length = it != l->schema_->metadata.end() ? it->second : "history_items";
  }
  l->length_col_ = l->schema_->Find(length);
  if (l->length_col_ < 0 || l->schema_->features[l->length_col_].layout != Layout::kJagged) {
    return absl::InvalidArgumentError(absl::StrCat(options.files[0], ": no jagged feature '",
                                                   length, "' to price samples by length"));
  }
  l->cache_capacity_ = 2 * static_cast<size_t>(options.shuffle_blocks) + 2;
  return l;
}

int64_t Loader::steps_per_epoch() const {
  const int64_t w = options_.deal.WindowSize();
  return options_.drop_remainder ? num_samples_ / w : (num_samples_ + w - 1) / w;
}

void Loader::PrepareEpoch(int64_t epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
  block_perm_.resize(blocks_.size());
  std::iota(block_perm_.begin(), block_perm_.end(), 0);
  std::mt19937_64 rng = Rng(options_.seed, static_cast<uint64_t>(epoch), 0xB10C);
  Shuffle(block_perm_, rng);
  group_start_.assign(1, 0);
  for (size_t i = 0; i < block_perm_.size(); i += options_.shuffle_blocks) {
    int64_t rows = 0;
    for (size_t j = i; j < std::min(block_perm_.size(), i + options_.shuffle_blocks); ++j) {
      rows += blocks_[block_perm_[j]].rows;
    }
    group_start_.push_back(group_start_.back() + rows);
  }
  group_orders_.clear();
}

const std::vector<Loader::RowRef>& Loader::GroupOrder(size_t group) {
  for (auto it = group_orders_.begin(); it != group_orders_.end(); ++it) {
    if (it->first == group) {
      group_orders_.splice(group_orders_.begin(), group_orders_, it);
      return group_orders_.front().second;
    }
  }
  std::vector<RowRef> order;
  order.reserve(group_start_[group + 1] - group_start_[group]);
  size_t first = group * options_.shuffle_blocks;
  size_t last = std::min(block_perm_.size(), first + options_.shuffle_blocks);
  for (size_t j = first; j < last; ++j) {
    uint32_t b = block_perm_[j];
    for (uint32_t r = 0; r < blocks_[b].rows; ++r) order.push_back({b, r});
  }
  std::mt19937_64 rng = Rng(options_.seed, static_cast<uint64_t>(epoch_), 0x6000 + group);
  Shuffle(order, rng);
  group_orders_.emplace_front(group, std::move(order));
  if (group_orders_.size() > 2) group_orders_.pop_back();
  return group_orders_.front().second;
}

absl::StatusOr<std::shared_ptr<const BlockView>> Loader::GetBlock(uint32_t block) {
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if (it->first == block) {
      cache_.splice(cache_.begin(), cache_, it);
      return std::shared_ptr<const BlockView>(cache_.front().second);
    }
  }
  std::shared_ptr<BlockView> data;
  if (cache_.size() >= cache_capacity_) {
    // Reuse the evicted block's buffer unless a plan still holds it.
    if (cache_.back().second.use_count() == 1) data = std::move(cache_.back().second);
    cache_.pop_back();
  }
  if (data == nullptr) data = std::make_shared<BlockView>();
  const BlockId& id = blocks_[block];
  if (auto st = files_[id.file]->ReadBlockView(id.block, data.get()); !st.ok()) return st;
  cache_.emplace_front(block, data);
  return std::shared_ptr<const BlockView>(std::move(data));
}

absl::StatusOr<std::shared_ptr<const StepPlan>> Loader::Plan(int64_t epoch, int64_t step) {
  if (epoch < 0 || step < 0 || step >= steps_per_epoch()) {
    return absl::OutOfRangeError(
        absl::StrCat("step ", step, " of epoch ", epoch, " is outside 0..", steps_per_epoch() - 1));
  }
  PrepareEpoch(epoch);
  const int64_t w = options_.deal.WindowSize();
  const int64_t begin = step * w;
  const int64_t end = std::min(num_samples_, begin + w);
  const size_t n = static_cast<size_t>(end - begin);

  // Locate the window's rows (group by group), then load their blocks.
  std::vector<RowRef> refs(n);
  for (int64_t p = begin; p < end;) {
    size_t g =
        std::upper_bound(group_start_.begin(), group_start_.end(), p) - group_start_.begin() - 1;
    const std::vector<RowRef>& order = GroupOrder(g);
    int64_t stop = std::min(end, group_start_[g + 1]);
    for (; p < stop; ++p) refs[p - begin] = order[p - group_start_[g]];
  }
  std::vector<uint32_t> distinct;
  for (const RowRef& r : refs) distinct.push_back(r.block);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  auto plan = std::make_shared<StepPlan>();
  std::vector<std::pair<uint32_t, const BlockView*>> loaded;
  for (uint32_t b : distinct) {
    auto block = GetBlock(b);
    if (!block.ok()) return block.status();
    loaded.emplace_back(b, block->get());
    plan->pinned.push_back(*std::move(block));
  }
  auto block_of = [&](uint32_t b) {
    return std::lower_bound(loaded.begin(), loaded.end(),
                            std::make_pair(b, static_cast<const BlockView*>(nullptr)))
        ->second;
  };
  plan->samples.resize(n);
  std::vector<double> costs(n);
  for (size_t i = 0; i < n; ++i) {
    plan->samples[i] = {block_of(refs[i].block), refs[i].row};
    costs[i] =
        options_.cost.SampleCost(plan->samples[i].block->RowLength(length_col_, refs[i].row));
  }
  plan->epoch = epoch;
  plan->step = step;
  plan->first_rank = options_.first_rank;
  plan->schema = schema_;
  plan->length_col = length_col_;
  plan->deal = DealWindow(options_.policy, costs, options_.deal);
  plan->gap = plan->deal.Gap();
  plan->naive_gap = options_.policy == Policy::kNaive
                        ? plan->gap
                        : DealWindow(Policy::kNaive, costs, options_.deal).Gap();
  return std::shared_ptr<const StepPlan>(std::move(plan));
}

RankBatch GatherRank(const StepPlan& plan, int r) {
  RankBatch rb;
  rb.epoch = plan.epoch;
  rb.step = plan.step;
  rb.rank = plan.first_rank + r;
  rb.cost = plan.deal.rank_cost[r];
  rb.samples = Batch(plan.schema);
  size_t rows = 0, values = 0;
  for (const auto& bb : plan.deal.ranks[r]) {
    rows += bb.size();
    for (uint32_t i : bb)
      values += plan.samples[i].block->RowLength(plan.length_col, plan.samples[i].row);
  }
  rb.samples.Reserve(rows, values);
  rb.base_batch_offsets.push_back(0);
  for (const auto& bb : plan.deal.ranks[r]) {
    for (uint32_t i : bb) rb.samples.AppendRow(*plan.samples[i].block, plan.samples[i].row);
    rb.base_batch_offsets.push_back(static_cast<uint32_t>(rb.samples.num_rows()));
  }
  return rb;
}

std::vector<int64_t> WindowLengths(const StepPlan& plan) {
  std::vector<int64_t> lengths(plan.samples.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    lengths[i] = plan.samples[i].block->RowLength(plan.length_col, plan.samples[i].row);
  }
  return lengths;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> EpochWindows(Loader& loader, int epochs) {
  std::vector<std::vector<int64_t>> windows;
  const int64_t full = loader.samples_per_epoch() / loader.options().deal.WindowSize();
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    for (int64_t step = 0; step < full; ++step) {
      auto plan = loader.Plan(epoch, step);
      if (!plan.ok()) return plan.status();
      windows.push_back(WindowLengths(**plan));
    }
  }
  return windows;
}

absl::StatusOr<StepBatches> Loader::Step(int64_t epoch, int64_t step) {
  auto plan = Plan(epoch, step);
  if (!plan.ok()) return plan.status();
  StepBatches out;
  out.epoch = epoch;
  out.step = step;
  out.gap = (*plan)->gap;
  out.naive_gap = (*plan)->naive_gap;
  for (int r = 0; r < options_.deal.ranks; ++r) out.ranks.push_back(GatherRank(**plan, r));
  return out;
}

}  // namespace recfleet::data
