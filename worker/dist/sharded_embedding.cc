#include "worker/dist/sharded_embedding.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "engine/layers/ops.h"
#include "kernels/embedding/bucket.h"
#include "worker/dist/staged.h"

namespace recfleet {
namespace dist {
std::vector<TablePlacement> BalancedTablePlacements(const std::vector<EmbeddingTableConfig>& tables, int group_size) {
  std::vector<TablePlacement> out(tables.size());
  if (group_size <= 1) return out;
  double total = 0;
  for (const EmbeddingTableConfig& t : tables) total += static_cast<double>(t.rows) * t.dim;
  std::vector<double> load(group_size, 0.0);
  std::vector<size_t> order;
  for (size_t t = 0; t < tables.size(); ++t) {
    const double bytes = static_cast<double>(tables[t].rows) * tables[t].dim;
    if (bytes > total / group_size) {
      out[t].sharding = TableSharding::kRowWise;
      for (double& l : load) l += bytes / group_size;
    } else {
      order.push_back(t);
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tables[a].rows * tables[a].dim > tables[b].rows * tables[b].dim;
  });
  for (size_t t : order) {
    const int owner = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    out[t] = {TableSharding::kTableWise, owner};
    load[owner] += static_cast<double>(tables[t].rows) * tables[t].dim;
  }
  return out;
}

absl::StatusOr<EmbeddingShardingPlan> EmbeddingShardingPlan::Create(std::vector<EmbeddingTableConfig> tables,
                                                                    std::vector<TablePlacement> placements,
                                                                    int group_size) {
  if (group_size < 1) return absl::InvalidArgumentError(absl::StrCat("sharding plan: group_size ", group_size, " < 1"));
  if (tables.size() != placements.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sharding plan: ", tables.size(), " tables but ",
                                                   placements.size(), " placements; need one per table"));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const EmbeddingTableConfig& c = tables[t];
    if (c.rows < 1 || c.dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat("sharding plan: table ", t, " ('", c.name, "') has rows=",
                                                     c.rows, " dim=", c.dim, "; both must be >= 1"));
    }
    if (placements[t].sharding == TableSharding::kTableWise &&
        (placements[t].owner < 0 || placements[t].owner >= group_size)) {
      return absl::InvalidArgumentError(absl::StrCat("sharding plan: table ", t, " ('", c.name, "') owner ",
                                                     placements[t].owner, " is not a group rank in [0, ",
                                                     group_size, ")"));
    }
    std::vector<bool> seen(group_size, false);
    for (int r : placements[t].ranks) {
      if (r < 0 || r >= group_size) {
        return absl::InvalidArgumentError(absl::StrCat("sharding plan: table ", t, " ('", c.name, "') lists rank ", r,
                                                       ", not a group rank in [0, ", group_size, ")"));
      }
      if (seen[r]) {
        return absl::InvalidArgumentError(
            absl::StrCat("sharding plan: table ", t, " ('", c.name, "') lists rank ", r, " twice"));
      }
      seen[r] = true;
    }
    if (placements[t].sharding == TableSharding::kColumnWise) {
      const int64_t slices = placements[t].ranks.empty() ? group_size : placements[t].ranks.size();
      if (c.dim % slices != 0) {
        return absl::InvalidArgumentError(absl::StrCat("sharding plan: table ", t, " ('", c.name, "') has ", c.dim,
                                                       " columns, not ", slices, " equal column slices"));
      }
    }
  }
  EmbeddingShardingPlan plan;
  plan.tables_ = std::move(tables);
  plan.placements_ = std::move(placements);
  plan.group_size_ = group_size;
  plan.tables_on_.resize(group_size);
  for (int r = 0; r < group_size; ++r) {
    for (int t = 0; t < plan.num_tables(); ++t) {
      const auto range = plan.RowRange(t, r);
      if (range.second > range.first) plan.tables_on_[r].push_back(t);
    }
  }
  return plan;
}

int EmbeddingShardingPlan::NumShards(int t) const {
  const TablePlacement& p = placements_[t];
  if (p.sharding == TableSharding::kTableWise) return 1;
  return p.ranks.empty() ? group_size_ : static_cast<int>(p.ranks.size());
}

int EmbeddingShardingPlan::ShardIndex(int t, int r) const {
  const TablePlacement& p = placements_[t];
  if (p.sharding == TableSharding::kTableWise) return r == p.owner ? 0 : -1;
  if (p.ranks.empty()) return r;
  const auto it = std::find(p.ranks.begin(), p.ranks.end(), r);
  return it == p.ranks.end() ? -1 : static_cast<int>(it - p.ranks.begin());
}

namespace {

// Block i of n contiguous blocks of ceil(size / n) over [0, size).
std::pair<int64_t, int64_t> ContiguousBlock(int64_t size, int i, int n) {
  const int64_t per = (size + n - 1) / n;
  const int64_t first = std::min(size, i * per);
  return {first, std::min(size, first + per)};
}

}  // namespace

std::pair<int64_t, int64_t> EmbeddingShardingPlan::RowRange(int t, int r) const {
  const int64_t rows = tables_[t].rows;
  const int i = ShardIndex(t, r);
  if (i < 0 || Columns(t, r) == 0) return {0, 0};
  if (placements_[t].sharding != TableSharding::kRowWise) return {0, rows};
  return ContiguousBlock(rows, i, NumShards(t));
}

std::pair<int64_t, int64_t> EmbeddingShardingPlan::ColumnRange(int t, int r) const {
  const int64_t dim = tables_[t].dim;
  const int i = ShardIndex(t, r);
  if (i < 0) return {0, 0};
  if (placements_[t].sharding != TableSharding::kColumnWise) return {0, dim};
  return ContiguousBlock(dim, i, NumShards(t));
}

absl::StatusOr<std::vector<TablePlacement>> PlacementsFromPlan(const std::vector<EmbeddingTableConfig>& tables,
                                                               const std::vector<PlannedTable>& planned,
                                                               int group_size) {
  if (planned.size() != tables.size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", planned.size(), " table shardings for ", tables.size(),
                                                   " tables; the plan is for another model"));
  }
  std::vector<TablePlacement> out;
  for (size_t t = 0; t < tables.size(); ++t) {
    const PlannedTable& p = planned[t];
    const std::string what = absl::StrCat("plan: table ", t, " ('", tables[t].name, "')");
    if (p.table != tables[t].name) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is planned as '", p.table, "'; tables out of order"));
    }
    for (int r : p.ranks) {
      if (r < 0 || r >= group_size) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", p.sharding, " shard on rank ", r,
                                                       ", outside the model-parallel group of ", group_size));
      }
    }
    const bool every_rank = p.ranks.empty();
    const int listed = every_rank ? group_size : static_cast<int>(p.ranks.size());
    if (p.num_shards != listed) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", p.num_shards, " ", p.sharding, " shards but ",
                                                     listed, " ranks hold them"));
    }
    if (p.sharding == "TW") {
      if (p.ranks.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": table-wise on ", p.ranks.size(), " ranks, need one"));
      }
      out.push_back({TableSharding::kTableWise, p.ranks[0]});
    } else if (p.sharding == "CW") {
      out.push_back({TableSharding::kColumnWise, 0, p.ranks});
    } else if (p.sharding == "RW" || p.sharding == "TWRW") {
      out.push_back({TableSharding::kRowWise, 0, p.ranks});
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": unknown sharding '", p.sharding, "' (TW, CW, TWRW or RW)"));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ShardedEmbeddingCollection>> ShardedEmbeddingCollection::Create(
    EmbeddingShardingPlan plan, comm::Communicator* table_group, comm::Communicator* replica_group,
    RowwiseAdagradConfig optimizer, comm::Communicator* shard_group) {
  if (table_group == nullptr) return absl::InvalidArgumentError("sharded embeddings: table_group is null");
  if (table_group->size() != plan.group_size()) {
    return absl::InvalidArgumentError(absl::StrCat("sharded embeddings: the plan is for a group of ",
                                                   plan.group_size(), " ranks but table_group has ",
                                                   table_group->size()));
  }
  for (comm::Communicator* other : {replica_group, shard_group}) {
    if (other != nullptr && other->device() != table_group->device()) {
      return absl::InvalidArgumentError("sharded embeddings: the table, replica and shard groups live on different devices");
    }
  }
  if (shard_group != nullptr && shard_group->size() < 2) shard_group = nullptr;
  std::unique_ptr<ShardedEmbeddingCollection> c(
      new ShardedEmbeddingCollection(std::move(plan), table_group, replica_group, optimizer, shard_group));
  // Stored rows only (padded to equal parts for the all-gather under V3).
  for (int t = 0; t < c->plan_.num_tables(); ++t) {
    const int64_t cols = c->plan_.Columns(t, table_group->rank());
    const int64_t rows = c->ShardDegree() > 1 ? c->PartRows(t) : c->StoredRows(t).second - c->StoredRows(t).first;
    absl::StatusOr<DeviceBuffer> shard = DeviceBuffer::Zeros(c->device_, rows * cols * sizeof(float));
    if (!shard.ok()) return shard.status();
    absl::StatusOr<DeviceBuffer> momentum = DeviceBuffer::Zeros(c->device_, rows * sizeof(float));
    if (!momentum.ok()) return momentum.status();
    c->shards_.push_back(*std::move(shard));
    c->momenta_.push_back(*std::move(momentum));
  }
  return c;
}

ShardedEmbeddingCollection::ShardedEmbeddingCollection(EmbeddingShardingPlan plan, comm::Communicator* table_group,
                                                       comm::Communicator* replica_group,
                                                       RowwiseAdagradConfig optimizer, comm::Communicator* shard_group)
    : plan_(std::move(plan)),
      table_group_(table_group),
      replica_group_(replica_group),
      shard_group_(shard_group),
      optimizer_(optimizer),
      device_(table_group->device()) {}

int64_t ShardedEmbeddingCollection::PartRows(int t) const {
  const auto [first, end] = plan_.RowRange(t, table_group_->rank());
  return (end - first + ShardDegree() - 1) / ShardDegree();
}

std::pair<int64_t, int64_t> ShardedEmbeddingCollection::StoredRows(int t) const {
  const auto [first, end] = plan_.RowRange(t, table_group_->rank());
  if (ShardDegree() == 1) return {first, end};
  const auto part = ContiguousBlock(end - first, shard_group_->rank(), ShardDegree());
  return {first + part.first, first + part.second};
}

TensorView ShardedEmbeddingCollection::shard(int t) {
  const auto [first, end] = StoredRows(t);
  const int64_t cols = plan_.Columns(t, table_group_->rank());
  // While the block is gathered, this rank's part sits at its offset in it.
  const int64_t offset = gathered_ ? shard_group_->rank() * PartRows(t) : 0;
  return MakeView(static_cast<float*>(shards_[t].data()) + offset * cols, DType::kFloat32, {end - first, cols},
                  device_);
}

TensorView ShardedEmbeddingCollection::momentum(int t) {
  const auto [first, end] = StoredRows(t);
  const int64_t offset = gathered_ ? shard_group_->rank() * PartRows(t) : 0;
  return MakeView(static_cast<float*>(momenta_[t].data()) + offset, DType::kFloat32, {end - first}, device_);
}

TensorView ShardedEmbeddingCollection::Block(int t) {
  const auto [first, end] = plan_.RowRange(t, table_group_->rank());
  return shards_[t].View(DType::kFloat32, {end - first, plan_.Columns(t, table_group_->rank())});
}

TensorView ShardedEmbeddingCollection::BlockMomentum(int t) {
  const auto [first, end] = plan_.RowRange(t, table_group_->rank());
  return momenta_[t].View(DType::kFloat32, {end - first});
}

absl::Status ShardedEmbeddingCollection::GatherBlocks() {
  if (ShardDegree() == 1) return absl::OkStatus();
  if (absl::Status s = ReleaseBlocks(); !s.ok()) return s;
  const int d = ShardDegree();
  for (int t : plan_.TablesOn(table_group_->rank())) {
    const int64_t part = PartRows(t), cols = plan_.Columns(t, table_group_->rank());
    for (auto [buffer, width] : {std::pair<DeviceBuffer*, int64_t>{&shards_[t], cols}, {&momenta_[t], 1}}) {
      absl::StatusOr<DeviceBuffer> block = DeviceBuffer::Zeros(device_, d * part * width * sizeof(float));
      if (!block.ok()) return block.status();
      if (absl::Status s = shard_group_->AllGather(buffer->View(DType::kFloat32, {part * width}),
                                                   block->View(DType::kFloat32, {d * part * width}));
          !s.ok()) {
        return s;
      }
      *buffer = *std::move(block);
    }
  }
  gathered_ = true;
  return absl::OkStatus();
}

absl::Status ShardedEmbeddingCollection::ReleaseBlocks() {
  if (!gathered_) return absl::OkStatus();
  const int me = shard_group_->rank();
  for (int t : plan_.TablesOn(table_group_->rank())) {
    const int64_t part = PartRows(t), cols = plan_.Columns(t, table_group_->rank());
    for (auto [buffer, width] : {std::pair<DeviceBuffer*, int64_t>{&shards_[t], cols}, {&momenta_[t], 1}}) {
      std::vector<float> block(buffer->size() / sizeof(float));
      if (absl::Status s = buffer->CopyToHost(block.data(), buffer->size()); !s.ok()) return s;
      absl::StatusOr<DeviceBuffer> own =
          DeviceBuffer::FromHost(device_, block.data() + me * part * width, part * width * sizeof(float));
      if (!own.ok()) return own.status();
      *buffer = *std::move(own);
    }
  }
  gathered_ = false;
  return absl::OkStatus();
}

absl::Status ShardedEmbeddingCollection::Initialize(const std::function<float(int, int64_t, int64_t)>& value) {
  if (absl::Status s = ReleaseBlocks(); !s.ok()) return s;
  for (int t = 0; t < plan_.num_tables(); ++t) {
    const int64_t first = StoredRows(t).first;
    const int64_t first_col = plan_.ColumnRange(t, table_group_->rank()).first;
    const int64_t cols = shard(t).dim(1);
    const int64_t rows = shard(t).dim(0);
    std::vector<float> rows_host(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) rows_host[r * cols + c] = value(t, first + r, first_col + c);
    }
    if (absl::Status s = shards_[t].CopyFromHost(rows_host.data(), rows_host.size() * sizeof(float)); !s.ok()) {
      return s;
    }
    const std::vector<float> zeros(rows, 0.0f);
    if (absl::Status s = momenta_[t].CopyFromHost(zeros.data(), zeros.size() * sizeof(float)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ShardedEmbeddingCollection::CheckIds(absl::Span<const JaggedView> ids) const {
  if (static_cast<int>(ids.size()) != plan_.num_tables()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sharded embeddings: got id lists for ", ids.size(), " tables, expected ", plan_.num_tables()));
  }
  for (int t = 0; t < plan_.num_tables(); ++t) {
    const std::string what = absl::StrCat("ids[", t, "] ('", plan_.table(t).name, "')");
    if (absl::Status s = CheckJagged(ids[t], what); !s.ok()) return s;
    if (absl::Status s = CheckDType(ids[t].values, what, {DType::kInt64}); !s.ok()) return s;
    if (absl::Status s = CheckDevice(ids[t].values, what, Device::kCpu); !s.ok()) return s;
    const int64_t* v = ids[t].values.as<int64_t>();
    for (int64_t i = 0; i < ids[t].total_length(); ++i) {
      if (v[i] < 0 || v[i] >= plan_.table(t).rows) {
        return absl::InvalidArgumentError(absl::StrCat(what, " value ", i, " = ", v[i], " is not a row in [0, ",
                                                       plan_.table(t).rows, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ShardedEmbeddingCollection::CheckPerTable(absl::Span<const TensorView> views,
                                                       absl::string_view what) const {
  if (static_cast<int>(views.size()) != plan_.num_tables()) {
    return absl::InvalidArgumentError(absl::StrCat("sharded embeddings: ", views.size(), " ", what,
                                                   " buffers, expected one per table (", plan_.num_tables(), ")"));
  }
  for (int t = 0; t < plan_.num_tables(); ++t) {
    const std::string name = absl::StrCat(what, "[", t, "] ('", plan_.table(t).name, "')");
    if (absl::Status s = CheckDType(views[t], name, {DType::kFloat32}); !s.ok()) return s;
    if (absl::Status s = CheckDevice(views[t], name, device_); !s.ok()) return s;
    if (absl::Status s = CheckRank(views[t], name, 2); !s.ok()) return s;
    if (absl::Status s = CheckDim(views[t], name, 1, plan_.table(t).dim); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ShardedEmbeddingCollection::Forward(absl::Span<const JaggedView> ids, absl::Span<const TensorView> out) {
  pending_.valid = false;
  if (absl::Status s = CheckIds(ids); !s.ok()) return s;
  if (absl::Status s = CheckPerTable(out, "out"); !s.ok()) return s;
  // V3: the whole block of every local table, from its parts (again after
  // any change to the stored parts, e.g. a restore).
  if (absl::Status s = GatherBlocks(); !s.ok()) return s;
  const int num_tables = plan_.num_tables();
  std::vector<int64_t> my_bags(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    my_bags[t] = ids[t].batch_size();
    if (absl::Status s = CheckDim(out[t], absl::StrCat("out[", t, "]"), 0, my_bags[t]); !s.ok()) return s;
  }

  const int group = table_group_->size();
  const int me = table_group_->rank();
  const std::vector<int>& mine = plan_.TablesOn(me);
  const int num_mine = static_cast<int>(mine.size());

  // Every rank's bag counts fix how many bags it sends each owner.
  pending_.bags.assign(group * num_tables, 0);
  absl::Status gathered = Staged(device_, my_bags, pending_.bags, [&](const TensorView& in, const TensorView& out) {
    return table_group_->AllGather(in, out);
  });
  if (!gathered.ok()) return gathered;

  // This rank's batch on the device in one copy: per table, its offsets (as
  // int64) then its ids.
  std::vector<int64_t> packed, ids_at(num_tables);
  pending_.own_offsets_at.assign(num_tables, 0);
  for (int t = 0; t < num_tables; ++t) {
    pending_.own_offsets_at[t] = static_cast<int64_t>(packed.size());
    for (int64_t b = 0; b <= my_bags[t]; ++b) packed.push_back(ids[t].offset(b));
    ids_at[t] = static_cast<int64_t>(packed.size());
    const int64_t* v = ids[t].values.as<int64_t>();
    packed.insert(packed.end(), v, v + ids[t].total_length());
  }
  absl::StatusOr<DeviceBuffer> input = Stage(device_, packed);
  if (!input.ok()) return input.status();
  pending_.input = *std::move(input);
  pending_.own_bags = my_bags;
  auto packed_view = [&](int64_t at, int64_t n) {
    return MakeView(static_cast<int64_t*>(pending_.input.data()) + at, DType::kInt64, {n}, device_);
  };

  // Bucketed on the device, per owner, per table it holds, per bag: how
  // many of the bag's ids the owner holds (the bag lengths it receives) and
  // those ids as its local rows. Row blocks split the ids; every column
  // slice holder gets them all.
  std::vector<IdBucketing> bucketing(num_tables);
  std::vector<int64_t> len_counts(group, 0);
  int64_t num_lengths = 0, num_routed = 0;
  for (int t = 0; t < num_tables; ++t) {
    bucketing[t].ids = {packed_view(ids_at[t], ids[t].total_length()),
                        packed_view(pending_.own_offsets_at[t], my_bags[t] + 1)};
  }
  for (int d = 0; d < group; ++d) {
    for (int t : plan_.TablesOn(d)) {
      const auto [first, end] = plan_.RowRange(t, d);
      bucketing[t].shards.push_back({first, end, num_lengths, static_cast<int64_t>(d) * num_tables + t});
      num_lengths += my_bags[t];
      len_counts[d] += my_bags[t];
    }
  }
  for (int t = 0; t < num_tables; ++t) {
    const bool sliced = plan_.placement(t).sharding == TableSharding::kColumnWise;
    num_routed += ids[t].total_length() * (sliced ? static_cast<int64_t>(bucketing[t].shards.size()) : 1);
  }
  // counts: the ids this rank sends each (rank, table), then those it
  // receives from each (rank, table).
  const int64_t num_counts = static_cast<int64_t>(group) * num_tables;
  absl::StatusOr<DeviceBuffer> counts = DeviceBuffer::Zeros(device_, 2 * num_counts * sizeof(int64_t));
  if (!counts.ok()) return counts.status();
  absl::StatusOr<DeviceBuffer> len_send = DeviceBuffer::Zeros(device_, num_lengths * sizeof(int64_t));
  if (!len_send.ok()) return len_send.status();
  absl::StatusOr<DeviceBuffer> id_send = DeviceBuffer::Zeros(device_, num_routed * sizeof(int64_t));
  if (!id_send.ok()) return id_send.status();
  const TensorView send_counts_view = View<int64_t>(*counts, num_counts);
  const TensorView recv_counts_view =
      MakeView(static_cast<int64_t*>(counts->data()) + num_counts, DType::kInt64, {num_counts}, device_);
  if (absl::Status s = BucketIdsByShard(bucketing, View<int64_t>(*len_send, num_lengths),
                                        View<int64_t>(*id_send, num_routed), send_counts_view);
      !s.ok()) {
    return s;
  }
  const std::vector<int64_t> per_rank(group, num_tables);
  if (absl::Status s = table_group_->AllToAll(send_counts_view, per_rank, recv_counts_view, per_rank); !s.ok()) {
    return s;
  }
  std::vector<int64_t> len_recv_counts(group, 0);
  for (int p = 0; p < group; ++p) {
    for (int t : mine) len_recv_counts[p] += Bags(p, t);
  }
  absl::StatusOr<DeviceBuffer> len_recv = DeviceBuffer::Zeros(device_, Sum(len_recv_counts) * sizeof(int64_t));
  if (!len_recv.ok()) return len_recv.status();
  if (absl::Status s = table_group_->AllToAll(View<int64_t>(*len_send, num_lengths), len_counts,
                                              View<int64_t>(*len_recv, Sum(len_recv_counts)), len_recv_counts);
      !s.ok()) {
    return s;
  }
  // The only copy back to the host: the id counts, which size the ids'
  // all-to-all and the regrouping below.
  std::vector<int64_t> id_matrix(2 * num_counts);
  if (absl::Status s = counts->CopyToHost(id_matrix.data(), id_matrix.size() * sizeof(int64_t)); !s.ok()) return s;
  auto received = [&](int p, int t) { return id_matrix[num_counts + static_cast<int64_t>(p) * num_tables + t]; };
  std::vector<int64_t> id_counts(group, 0), id_recv_counts(group, 0);
  for (int d = 0; d < group; ++d) {
    for (int t = 0; t < num_tables; ++t) {
      id_counts[d] += id_matrix[static_cast<int64_t>(d) * num_tables + t];
      id_recv_counts[d] += received(d, t);
    }
  }
  absl::StatusOr<DeviceBuffer> id_recv = DeviceBuffer::Zeros(device_, Sum(id_recv_counts) * sizeof(int64_t));
  if (!id_recv.ok()) return id_recv.status();
  if (absl::Status s = table_group_->AllToAll(View<int64_t>(*id_send, num_routed), id_counts,
                                              View<int64_t>(*id_recv, Sum(id_recv_counts)), id_recv_counts);
      !s.ok()) {
    return s;
  }

  // Regroup what arrived (source, table, bag) into one jagged batch per local
  // table, bags ordered by (source, bag), by device copies; the offsets are
  // the running sums of the received lengths.
  pending_.served_bags.assign(num_mine, 0);
  pending_.served_ids.assign(num_mine, 0);
  for (int k = 0; k < num_mine; ++k) {
    for (int p = 0; p < group; ++p) {
      pending_.served_bags[k] += Bags(p, mine[k]);
      pending_.served_ids[k] += received(p, mine[k]);
    }
  }
  std::vector<DeviceBuffer> lengths(num_mine);
  pending_.ids.clear();
  pending_.ids.resize(num_mine);
  pending_.offsets.clear();
  pending_.offsets.resize(num_mine);
  for (int k = 0; k < num_mine; ++k) {
    for (auto [buffer, n] : {std::pair<DeviceBuffer*, int64_t>{&lengths[k], pending_.served_bags[k]},
                             {&pending_.ids[k], pending_.served_ids[k]},
                             {&pending_.offsets[k], pending_.served_bags[k] + 1}}) {
      absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Zeros(device_, n * sizeof(int64_t));
      if (!b.ok()) return b.status();
      *buffer = *std::move(b);
    }
  }
  std::vector<int64_t> lengths_filled(num_mine, 0), ids_filled(num_mine, 0);
  int64_t len_pos = 0, id_pos = 0;
  for (int p = 0; p < group; ++p) {
    for (int k = 0; k < num_mine; ++k) {
      const int64_t bags = Bags(p, mine[k]), n = received(p, mine[k]);
      if (absl::Status s = CopyOnDevice(device_, static_cast<int64_t*>(lengths[k].data()) + lengths_filled[k],
                                        static_cast<const int64_t*>(len_recv->data()) + len_pos, bags * sizeof(int64_t));
          !s.ok()) {
        return s;
      }
      if (absl::Status s = CopyOnDevice(device_, static_cast<int64_t*>(pending_.ids[k].data()) + ids_filled[k],
                                        static_cast<const int64_t*>(id_recv->data()) + id_pos, n * sizeof(int64_t));
          !s.ok()) {
        return s;
      }
      lengths_filled[k] += bags;
      ids_filled[k] += n;
      len_pos += bags;
      id_pos += n;
    }
  }
  for (int k = 0; k < num_mine; ++k) {
    if (absl::Status s = OffsetsFromLengths(View<int64_t>(lengths[k], pending_.served_bags[k]),
                                            View<int64_t>(pending_.offsets[k], pending_.served_bags[k] + 1));
        !s.ok()) {
      return s;
    }
  }

  // Pool the local rows of every served bag (partial sums for row-wise)
  // into one buffer on the device: table after table, each table's bags in
  // (source, bag) order.
  std::vector<int64_t> partial_at(num_mine + 1, 0);
  for (int k = 0; k < num_mine; ++k) {
    partial_at[k + 1] = partial_at[k] + pending_.served_bags[k] * plan_.Columns(mine[k], me);
  }
  absl::StatusOr<DeviceBuffer> partial = DeviceBuffer::Zeros(device_, partial_at[num_mine] * sizeof(float));
  if (!partial.ok()) return partial.status();
  float* const partial_data = static_cast<float*>(partial->data());
  for (int k = 0; k < num_mine; ++k) {
    const int t = mine[k];
    const TensorView out_k = MakeView(partial_data + partial_at[k], DType::kFloat32,
                                      {pending_.served_bags[k], plan_.Columns(t, me)}, device_);
    if (absl::Status s = EmbeddingBagForward(Block(t), ServedBags(k), Pooling::kSum, out_k); !s.ok()) return s;
  }

  // Send each source its bags' vectors; receive ours from every owner. Each
  // served bag goes to exactly one source, so the message is as large as
  // the partial sums, packed by device copies.
  std::vector<int64_t> emb_counts(group, 0), emb_recv_counts(group, 0), next_bag(num_mine, 0);
  absl::StatusOr<DeviceBuffer> emb_send = DeviceBuffer::Zeros(device_, partial_at[num_mine] * sizeof(float));
  if (!emb_send.ok()) return emb_send.status();
  for (int p = 0, pos = 0; p < group; ++p) {
    for (int k = 0; k < num_mine; ++k) {
      const int64_t cols = plan_.Columns(mine[k], me);
      const int64_t n = Bags(p, mine[k]) * cols;
      if (absl::Status s = CopyOnDevice(device_, static_cast<float*>(emb_send->data()) + pos,
                                        partial_data + partial_at[k] + next_bag[k] * cols, n * sizeof(float));
          !s.ok()) {
        return s;
      }
      next_bag[k] += Bags(p, mine[k]);
      emb_counts[p] += n;
      pos += n;
    }
  }
  for (int d = 0; d < group; ++d) {
    for (int t : plan_.TablesOn(d)) emb_recv_counts[d] += my_bags[t] * plan_.Columns(t, d);
  }
  absl::StatusOr<DeviceBuffer> emb_recv = DeviceBuffer::Zeros(device_, Sum(emb_recv_counts) * sizeof(float));
  if (!emb_recv.ok()) return emb_recv.status();
  if (absl::Status s = table_group_->AllToAll(View<float>(*emb_send, partial_at[num_mine]), emb_counts,
                                              View<float>(*emb_recv, Sum(emb_recv_counts)), emb_recv_counts);
      !s.ok()) {
    return s;
  }

  // Row blocks add up; column slices land in their own columns.
  for (int t = 0; t < num_tables; ++t) {
    if (absl::Status s = ZeroOnDevice(device_, out[t].data, out[t].nbytes()); !s.ok()) return s;
  }
  for (int d = 0, pos = 0; d < group; ++d) {
    for (int t : plan_.TablesOn(d)) {
      const int64_t dim = plan_.table(t).dim;
      const auto [c0, c1] = plan_.ColumnRange(t, d);
      const int64_t n = my_bags[t] * (c1 - c0);
      const float* block = static_cast<const float*>(emb_recv->data()) + pos;
      pos += n;
      if (n == 0) continue;
      absl::Status s;
      if (c1 - c0 == dim) {
        const TensorView whole = MakeView(out[t].data, DType::kFloat32, {n}, device_);
        s = engine::ops::Add(whole, MakeView(const_cast<float*>(block), DType::kFloat32, {n}, device_), whole);
      } else {
        s = Copy2DOnDevice(device_, static_cast<float*>(out[t].data) + c0, dim * sizeof(float), block,
                           (c1 - c0) * sizeof(float), (c1 - c0) * sizeof(float), my_bags[t]);
      }
      if (!s.ok()) return s;
    }
  }
  for (int t = 0; t < num_tables; ++t) {
    if (plan_.table(t).pooling == Pooling::kMean) {
      if (absl::Status s = ScaleByBagLengths(t, out[t], out[t]); !s.ok()) return s;
    }
  }
  pending_.valid = true;
  return absl::OkStatus();
}

absl::Status ShardedEmbeddingCollection::BackwardAndUpdate(absl::Span<const TensorView> grads) {
  if (!pending_.valid) {
    return absl::FailedPreconditionError("sharded embeddings: BackwardAndUpdate needs a successful Forward first");
  }
  pending_.valid = false;
  if (absl::Status s = CheckPerTable(grads, "grads"); !s.ok()) return s;
  const int num_tables = plan_.num_tables();
  for (int t = 0; t < num_tables; ++t) {
    const int64_t bags = pending_.own_bags[t];
    if (absl::Status s = CheckDim(grads[t], absl::StrCat("grads[", t, "]"), 0, bags); !s.ok()) return s;
  }

  const int group = table_group_->size();
  const int me = table_group_->rank();
  const std::vector<int>& mine = plan_.TablesOn(me);
  const int num_mine = static_cast<int>(mine.size());

  // Each owner gets the gradient of every bag it served (its columns of
  // it), per table; mean pooling divides by the full bag length, which only
  // this rank knows. Packed on the device.
  std::vector<DeviceBuffer> scaled(num_tables);
  std::vector<TensorView> own_grads(grads.begin(), grads.end());
  for (int t = 0; t < num_tables; ++t) {
    if (plan_.table(t).pooling != Pooling::kMean) continue;
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Zeros(device_, grads[t].nbytes());
    if (!b.ok()) return b.status();
    scaled[t] = *std::move(b);
    own_grads[t] = scaled[t].View(DType::kFloat32, grads[t].shape);
    if (absl::Status s = ScaleByBagLengths(t, grads[t], own_grads[t]); !s.ok()) return s;
  }
  std::vector<int64_t> send_counts(group, 0), recv_counts(group, 0);
  for (int d = 0; d < group; ++d) {
    for (int t : plan_.TablesOn(d)) send_counts[d] += own_grads[t].dim(0) * plan_.Columns(t, d);
  }
  for (int p = 0; p < group; ++p) {
    for (int t : mine) recv_counts[p] += Bags(p, t) * plan_.Columns(t, me);
  }
  absl::StatusOr<DeviceBuffer> send = DeviceBuffer::Zeros(device_, Sum(send_counts) * sizeof(float));
  if (!send.ok()) return send.status();
  for (int d = 0, pos = 0; d < group; ++d) {
    for (int t : plan_.TablesOn(d)) {
      const int64_t dim = plan_.table(t).dim;
      const auto [c0, c1] = plan_.ColumnRange(t, d);
      const int64_t bags = own_grads[t].dim(0);
      if (absl::Status s = Copy2DOnDevice(device_, static_cast<float*>(send->data()) + pos, (c1 - c0) * sizeof(float),
                                          static_cast<const float*>(own_grads[t].data) + c0, dim * sizeof(float),
                                          (c1 - c0) * sizeof(float), bags);
          !s.ok()) {
        return s;
      }
      pos += bags * (c1 - c0);
    }
  }
  absl::StatusOr<DeviceBuffer> recv = DeviceBuffer::Zeros(device_, Sum(recv_counts) * sizeof(float));
  if (!recv.ok()) return recv.status();
  if (absl::Status s = table_group_->AllToAll(View<float>(*send, Sum(send_counts)), send_counts,
                                              View<float>(*recv, Sum(recv_counts)), recv_counts);
      !s.ok()) {
    return s;
  }

  // Per local table, gradients of the served bags in (source, bag) order:
  // the order of pending_.offsets.
  std::vector<DeviceBuffer> served(num_mine);
  std::vector<int64_t> filled(num_mine, 0);
  for (int k = 0; k < num_mine; ++k) {
    absl::StatusOr<DeviceBuffer> b =
        DeviceBuffer::Zeros(device_, pending_.served_bags[k] * plan_.Columns(mine[k], me) * sizeof(float));
    if (!b.ok()) return b.status();
    served[k] = *std::move(b);
  }
  for (int p = 0, pos = 0; p < group; ++p) {
    for (int k = 0; k < num_mine; ++k) {
      const int64_t n = Bags(p, mine[k]) * plan_.Columns(mine[k], me);
      if (absl::Status s = CopyOnDevice(device_, static_cast<float*>(served[k].data()) + filled[k],
                                        static_cast<const float*>(recv->data()) + pos, n * sizeof(float));
          !s.ok()) {
        return s;
      }
      filled[k] += n;
      pos += n;
    }
  }
  // Replicated shards and column slices exchange bags and per-row sums
  // with their peers on the host (the whole group takes this branch or
  // none: both conditions are the plan's). Slices alone only read their
  // own bags and gradients there; replicas replace every table's.
  const bool replicated = replica_group_ != nullptr && replica_group_->size() > 1;
  if (replicated || AnySliced()) {
    ServedOnHost host;
    std::vector<std::vector<float>> served_grads(num_mine);
    host.offsets.resize(num_mine);
    host.ids.resize(num_mine);
    for (int k = 0; k < num_mine; ++k) {
      if (!replicated && !Sliced(mine[k])) continue;
      host.offsets[k].resize(pending_.served_bags[k] + 1);
      host.ids[k].resize(pending_.served_ids[k]);
      for (auto [buffer, to] : {std::pair<const DeviceBuffer*, std::vector<int64_t>*>{&pending_.offsets[k],
                                                                                    &host.offsets[k]},
                                {&pending_.ids[k], &host.ids[k]}}) {
        if (absl::Status s = buffer->CopyToHost(to->data(), to->size() * sizeof(int64_t)); !s.ok()) return s;
      }
      served_grads[k].resize(served[k].size() / sizeof(float));
      if (absl::Status s = served[k].CopyToHost(served_grads[k].data(), served[k].size()); !s.ok()) return s;
    }
    if (replicated) {
      if (absl::Status s = GatherReplicas(host, served_grads); !s.ok()) return s;
    }
    if (absl::Status s = AlignColumnSliceAccumulators(host, served_grads); !s.ok()) return s;
    for (int k = 0; replicated && k < num_mine; ++k) {
      absl::StatusOr<DeviceBuffer> b = Stage(device_, served_grads[k]);
      if (!b.ok()) return b.status();
      served[k] = *std::move(b);
      absl::StatusOr<DeviceBuffer> ids_dev = Stage(device_, host.ids[k]);
      if (!ids_dev.ok()) return ids_dev.status();
      pending_.ids[k] = *std::move(ids_dev);
      absl::StatusOr<DeviceBuffer> offsets_dev = Stage(device_, host.offsets[k]);
      if (!offsets_dev.ok()) return offsets_dev.status();
      pending_.offsets[k] = *std::move(offsets_dev);
      pending_.served_bags[k] = static_cast<int64_t>(host.offsets[k].size()) - 1;
      pending_.served_ids[k] = static_cast<int64_t>(host.ids[k].size());
    }
  }
  for (int k = 0; k < num_mine; ++k) {
    const int t = mine[k];
    absl::Status s = EmbeddingBagBackwardAdagrad(
        served[k].View(DType::kFloat32, {pending_.served_bags[k], plan_.Columns(t, me)}), ServedBags(k),
        Pooling::kSum, optimizer_, Block(t), BlockMomentum(t));
    if (!s.ok()) return s;
  }
  // V3: every holder of the block applied the same update; each keeps its
  // part.
  return ReleaseBlocks();
}

bool ShardedEmbeddingCollection::Sliced(int t) const {
  return plan_.placement(t).sharding == TableSharding::kColumnWise && plan_.NumShards(t) > 1;
}

bool ShardedEmbeddingCollection::AnySliced() const {
  for (int t = 0; t < plan_.num_tables(); ++t) {
    if (Sliced(t)) return true;
  }
  return false;
}

JaggedView ShardedEmbeddingCollection::ServedBags(int k) const {
  return {View<int64_t>(pending_.ids[k], pending_.served_ids[k]),
          View<int64_t>(pending_.offsets[k], pending_.served_bags[k] + 1)};
}

absl::Status ShardedEmbeddingCollection::ScaleByBagLengths(int t, const TensorView& in, const TensorView& out) {
  const int64_t bags = pending_.own_bags[t];
  if (bags == 0) return absl::OkStatus();
  const TensorView offsets = MakeView(static_cast<int64_t*>(pending_.input.data()) + pending_.own_offsets_at[t],
                                      DType::kInt64, {bags + 1}, device_);
  // ScaleBags reads a bag's row before writing it, so `out` may be `in`.
  return engine::ops::ScaleBags(in, offsets, Pooling::kMean, out);
}

absl::Status ShardedEmbeddingCollection::GatherReplicas(ServedOnHost& served, std::vector<std::vector<float>>& grads) {
  const std::vector<int>& mine = plan_.TablesOn(table_group_->rank());
  const int num_mine = static_cast<int>(mine.size());
  const int replicas = replica_group_->size();
  // Pack, per local table: bag count, id count, bag lengths, ids.
  std::vector<int64_t> ints;
  std::vector<float> floats;
  for (int k = 0; k < num_mine; ++k) {
    const std::vector<int64_t>& off = served.offsets[k];
    ints.push_back(static_cast<int64_t>(off.size()) - 1);
    ints.push_back(static_cast<int64_t>(served.ids[k].size()));
    for (size_t b = 0; b + 1 < off.size(); ++b) ints.push_back(off[b + 1] - off[b]);
    ints.insert(ints.end(), served.ids[k].begin(), served.ids[k].end());
    floats.insert(floats.end(), grads[k].begin(), grads[k].end());
  }
  std::vector<int64_t> sizes = {static_cast<int64_t>(ints.size()), static_cast<int64_t>(floats.size())};
  std::vector<int64_t> all_sizes(2 * replicas);
  absl::Status gathered = Staged(device_, sizes, all_sizes, [&](const TensorView& in, const TensorView& out) {
    return replica_group_->AllGather(in, out);
  });
  if (!gathered.ok()) return gathered;

  // Every replica builds the same union, in replica-rank order.
  std::vector<std::vector<int64_t>> offsets(num_mine, std::vector<int64_t>{0}), ids(num_mine);
  std::vector<std::vector<float>> union_grads(num_mine);
  for (int q = 0; q < replicas; ++q) {
    const bool self = q == replica_group_->rank();
    std::vector<int64_t> q_ints = self ? ints : std::vector<int64_t>(all_sizes[2 * q]);
    std::vector<float> q_floats = self ? floats : std::vector<float>(all_sizes[2 * q + 1]);
    if (absl::Status s = StagedBroadcast(*replica_group_, q_ints, q); !s.ok()) return s;
    if (absl::Status s = StagedBroadcast(*replica_group_, q_floats, q); !s.ok()) return s;
    size_t pos = 0, fpos = 0;
    for (int k = 0; k < num_mine; ++k) {
      const int64_t bags = q_ints[pos++];
      const int64_t n_ids = q_ints[pos++];
      for (int64_t b = 0; b < bags; ++b) offsets[k].push_back(offsets[k].back() + q_ints[pos++]);
      ids[k].insert(ids[k].end(), q_ints.begin() + pos, q_ints.begin() + pos + n_ids);
      pos += n_ids;
      const int64_t n_floats = bags * plan_.Columns(mine[k], table_group_->rank());
      union_grads[k].insert(union_grads[k].end(), q_floats.begin() + fpos, q_floats.begin() + fpos + n_floats);
      fpos += n_floats;
    }
  }
  served.offsets = std::move(offsets);
  served.ids = std::move(ids);
  grads = std::move(union_grads);
  return absl::OkStatus();
}

absl::Status ShardedEmbeddingCollection::AlignColumnSliceAccumulators(const ServedOnHost& served,
                                                                      const std::vector<std::vector<float>>& grads) {
  const int group = table_group_->size();
  const int me = table_group_->rank();
  const std::vector<int>& mine = plan_.TablesOn(me);
  // Per local sliced table: its touched rows (ascending; every holder got
  // the same ids, so the same list) and this slice's sum of squares of each
  // row's summed gradient.
  std::vector<int> sliced;  // Indexes into `mine`.
  std::vector<std::vector<int64_t>> rows(mine.size());
  std::vector<std::vector<double>> own(mine.size());
  for (size_t k = 0; k < mine.size(); ++k) {
    const int t = mine[k];
    if (!Sliced(t)) continue;
    sliced.push_back(static_cast<int>(k));
    const int64_t cols = plan_.Columns(t, me);
    std::map<int64_t, std::vector<double>> summed;
    const std::vector<int64_t>& off = served.offsets[k];
    for (size_t b = 0; b + 1 < off.size(); ++b) {
      for (int64_t i = off[b]; i < off[b + 1]; ++i) {
        std::vector<double>& g = summed[served.ids[k][i]];
        g.resize(cols, 0.0);
        for (int64_t c = 0; c < cols; ++c) g[c] += grads[k][b * cols + c];
      }
    }
    for (const auto& [row, g] : summed) {
      rows[k].push_back(row);
      double sq = 0;
      for (double x : g) sq += x * x;
      own[k].push_back(sq);
    }
  }
  // The exchange is a collective of the whole group: every rank joins it
  // when any table is sliced, whether or not it holds a slice.
  if (!AnySliced()) return absl::OkStatus();

  // Every other holder of a sliced table gets this slice's sums, tables in
  // ascending order (the order both sides walk).
  std::vector<float> send;
  std::vector<int64_t> send_counts(group, 0), recv_counts(group, 0);
  for (int d = 0; d < group; ++d) {
    for (int k : sliced) {
      if (d == me || plan_.ShardIndex(mine[k], d) < 0) continue;
      send.insert(send.end(), own[k].begin(), own[k].end());
      send_counts[d] += static_cast<int64_t>(own[k].size());
      recv_counts[d] += static_cast<int64_t>(own[k].size());
    }
  }
  std::vector<float> recv(Sum(recv_counts));
  if (absl::Status s = StagedAllToAll(*table_group_, send, send_counts, recv, recv_counts); !s.ok()) return s;
  // Per sliced table, per slice index: the sums (own slice from `own`).
  std::vector<std::vector<std::vector<double>>> slices(mine.size());
  for (int k : sliced) {
    slices[k].resize(plan_.NumShards(mine[k]));
    slices[k][plan_.ShardIndex(mine[k], me)] = own[k];
  }
  for (int p = 0, pos = 0; p < group; ++p) {
    for (int k : sliced) {
      if (p == me || plan_.ShardIndex(mine[k], p) < 0) continue;
      slices[k][plan_.ShardIndex(mine[k], p)].assign(recv.begin() + pos, recv.begin() + pos + own[k].size());
      pos += static_cast<int>(own[k].size());
    }
  }
  for (int k : sliced) {
    const int t = mine[k];
    const double dim = static_cast<double>(plan_.table(t).dim);
    const double cols = static_cast<double>(plan_.Columns(t, me));
    // Slices summed in slice order, so every holder computes the same.
    std::vector<float> accumulators(momenta_[t].size() / sizeof(float));
    if (absl::Status s = momenta_[t].CopyToHost(accumulators.data(), accumulators.size() * sizeof(float)); !s.ok()) {
      return s;
    }
    for (size_t i = 0; i < rows[k].size(); ++i) {
      double whole = 0;
      for (const std::vector<double>& slice : slices[k]) whole += slice[i];
      accumulators[rows[k][i]] += static_cast<float>(whole / dim - own[k][i] / cols);
    }
    if (absl::Status s = momenta_[t].CopyFromHost(accumulators.data(), accumulators.size() * sizeof(float));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace dist
}  // namespace recfleet
