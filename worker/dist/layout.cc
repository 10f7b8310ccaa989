#include "worker/dist/layout.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recfleet {
namespace dist {

namespace {

// Groups named "<prefix><index>", by index; they must split the world into
// groups of one size.
absl::StatusOr<std::map<int, std::vector<int>>> GroupsWithPrefix(const std::vector<NamedGroup>& groups,
                                                                 absl::string_view prefix, int world_size) {
  std::map<int, std::vector<int>> out;
  for (const NamedGroup& g : groups) {
    if (!absl::StartsWith(g.name, prefix)) continue;
    int index = 0;
    if (!absl::SimpleAtoi(g.name.substr(prefix.size()), &index) || index < 0 || out.count(index) > 0) {
      return absl::InvalidArgumentError(absl::StrCat("plan group \"", g.name, "\": expected a unique \"", prefix,
                                                     "<index>\""));
    }
    out[index] = g.ranks;
  }
  if (out.empty()) return out;
  std::vector<int> seen(world_size, 0);
  const size_t size = out.begin()->second.size();
  for (const auto& [index, ranks] : out) {
    if (ranks.size() != size) {
      return absl::InvalidArgumentError(absl::StrCat("plan groups ", prefix, "*: sizes differ (", size, " and ",
                                                     ranks.size(), ")"));
    }
    for (int r : ranks) {
      if (r < 0 || r >= world_size || seen[r]++ > 0) {
        return absl::InvalidArgumentError(absl::StrCat("plan groups ", prefix, "*: rank ", r,
                                                       " is out of range or in two groups of world ", world_size));
      }
    }
  }
  if (size * out.size() != static_cast<size_t>(world_size)) {
    return absl::InvalidArgumentError(absl::StrCat("plan groups ", prefix, "*: ", out.size(), " groups of ", size,
                                                   " do not cover the world of ", world_size));
  }
  return out;
}

// `rank`'s group among `groups` (named `name`), and the group of the ranks
// at its position in every group (named `across`).
absl::Status AppendGroupAndAcross(int rank, const std::map<int, std::vector<int>>& groups, const std::string& name,
                                  const std::string& across, std::vector<comm::ProcessGroupSpec>* out) {
  for (const auto& [index, ranks] : groups) {
    auto it = std::find(ranks.begin(), ranks.end(), rank);
    if (it == ranks.end()) continue;
    const int position = static_cast<int>(it - ranks.begin());
    comm::ProcessGroupSpec across_spec{across, position, {}};
    for (const auto& [other_index, other] : groups) across_spec.ranks.push_back(other[position]);
    out->push_back(comm::ProcessGroupSpec{name, index, ranks});
    out->push_back(std::move(across_spec));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is in no ", name, " group of the plan"));
}

std::map<int, std::vector<int>> Consecutive(int world_size, int group_size) {
  std::map<int, std::vector<int>> out;
  for (int r = 0; r < world_size; ++r) out[r / group_size].push_back(r);
  return out;
}

}  // namespace

absl::StatusOr<ParallelLayout> ParallelLayout::FromHints(int world_size, const ParallelismHints& hints) {
  if (world_size < 1) return absl::InvalidArgumentError(absl::StrCat("layout: world_size ", world_size, " < 1"));
  if (hints.fsdp_group_size < 0 || hints.replicas < 0 || hints.table_group_size < 0) {
    return absl::InvalidArgumentError("layout: parallelism hints must be >= 0 (0 = unset)");
  }
  ParallelLayout l;
  if (hints.fsdp_group_size > 0 && hints.replicas > 0) {
    l.fsdp_group_size = hints.fsdp_group_size;
    l.replicas = hints.replicas;
  } else if (hints.fsdp_group_size > 0) {
    l.fsdp_group_size = hints.fsdp_group_size;
    l.replicas = world_size / hints.fsdp_group_size;
  } else if (hints.replicas > 0) {
    l.replicas = hints.replicas;
    l.fsdp_group_size = world_size / hints.replicas;
  } else {
    l.fsdp_group_size = world_size;
  }
  if (l.fsdp_group_size * l.replicas != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("layout: fsdp_group_size ", l.fsdp_group_size, " x replicas ",
                                                   l.replicas, " must equal the world size ", world_size));
  }
  l.table_group_size = hints.table_group_size > 0 ? hints.table_group_size : l.fsdp_group_size;
  if (world_size % l.table_group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("layout: table_group_size ", l.table_group_size,
                                                   " does not divide the world size ", world_size));
  }
  return l;
}

absl::StatusOr<std::vector<comm::ProcessGroupSpec>> ParallelLayout::GroupSpecs(int rank) const {
  const int world_size = fsdp_group_size * replicas;
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside the world of ", world_size));
  }
  std::vector<comm::ProcessGroupSpec> specs;
  if (absl::Status s = AppendGroupAndAcross(rank, Consecutive(world_size, fsdp_group_size), "fsdp", "replica", &specs);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          AppendGroupAndAcross(rank, Consecutive(world_size, table_group_size), "tables", "table_replica", &specs);
      !s.ok()) {
    return s;
  }
  return specs;
}

absl::StatusOr<std::vector<comm::ProcessGroupSpec>> TrainingGroupSpecs(int rank, int world_size,
                                                                       const std::vector<NamedGroup>& plan_groups,
                                                                       const ParallelismHints& hints) {
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside the world of ", world_size));
  }
  absl::StatusOr<std::map<int, std::vector<int>>> fsdp = GroupsWithPrefix(plan_groups, "fsdp/", world_size);
  if (!fsdp.ok()) return fsdp.status();
  absl::StatusOr<std::map<int, std::vector<int>>> tables = GroupsWithPrefix(plan_groups, "tables/", world_size);
  if (!tables.ok()) return tables.status();
  std::string expert_prefix;
  for (const NamedGroup& g : plan_groups) {
    if (absl::StartsWith(g.name, "expert/")) {
      const std::string prefix = g.name.substr(0, g.name.find_last_of('/') + 1);
      if (!expert_prefix.empty() && prefix != expert_prefix) {
        return absl::InvalidArgumentError(absl::StrCat("plan groups ", expert_prefix, "* and ", prefix,
                                                       "*: expert parallelism for more than one module; GEM-lite "
                                                       "has one mixture of experts"));
      }
      expert_prefix = prefix;
    }
  }
  absl::StatusOr<std::map<int, std::vector<int>>> table_shards =
      GroupsWithPrefix(plan_groups, "table_shards/", world_size);
  if (!table_shards.ok()) return table_shards.status();
  absl::StatusOr<std::map<int, std::vector<int>>> experts =
      expert_prefix.empty() ? std::map<int, std::vector<int>>() : GroupsWithPrefix(plan_groups, expert_prefix, world_size);
  if (!experts.ok()) return experts.status();
  if (fsdp->empty()) {
    absl::StatusOr<ParallelLayout> layout = ParallelLayout::FromHints(world_size, hints);
    if (!layout.ok()) return layout.status();
    return layout->GroupSpecs(rank);
  }
  if (tables->empty()) {
    *tables = *fsdp;
  }
  std::vector<comm::ProcessGroupSpec> specs;
  if (absl::Status s = AppendGroupAndAcross(rank, *fsdp, "fsdp", "replica", &specs); !s.ok()) return s;
  if (absl::Status s = AppendGroupAndAcross(rank, *tables, "tables", "table_replica", &specs); !s.ok()) return s;
  if (!experts->empty()) {
    if (absl::Status s = AppendGroupAndAcross(rank, *experts, "expert", "expert_replica", &specs); !s.ok()) return s;
  }
  // V3: the ranks splitting this rank's table shards must hold the same
  // shards (one position in several table groups): part of its table
  // replica group.
  const std::vector<int>& table_replicas = specs[3].ranks;
  for (const auto& [index, ranks] : *table_shards) {
    if (std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) continue;
    for (int r : ranks) {
      if (std::find(table_replicas.begin(), table_replicas.end(), r) == table_replicas.end()) {
        return absl::InvalidArgumentError(absl::StrCat("plan group table_shards/", index, ": rank ", r,
                                                       " holds other table shards than rank ", rank,
                                                       " (another position in its tables group)"));
      }
    }
    specs.push_back({"table_shards", index, ranks});
  }
  return specs;
}

absl::StatusOr<TrainingGroups> TrainingGroups::Build(const ParallelLayout& layout, int rank, comm::KvStore& store,
                                                     const comm::CommFactory& factory) {
  absl::StatusOr<std::vector<comm::ProcessGroupSpec>> specs = layout.GroupSpecs(rank);
  if (!specs.ok()) return specs.status();
  return BuildFromSpecs(rank, *specs, store, factory);
}

absl::StatusOr<TrainingGroups> TrainingGroups::BuildFromSpecs(int rank, const std::vector<comm::ProcessGroupSpec>& specs,
                                                              comm::KvStore& store, const comm::CommFactory& factory) {
  if (specs.size() < 4) {
    return absl::InvalidArgumentError(absl::StrCat("training groups: at least 4 specs expected, got ", specs.size()));
  }
  absl::StatusOr<comm::ProcessGroups> dense =
      comm::ProcessGroups::BuildFromSpecs(rank, {specs[0], specs[1]}, store, factory);
  if (!dense.ok()) return dense.status();
  absl::StatusOr<comm::ProcessGroups> sparse =
      comm::ProcessGroups::BuildFromSpecs(rank, {specs[2], specs[3]}, store, factory);
  if (!sparse.ok()) return sparse.status();
  TrainingGroups groups{*std::move(dense), *std::move(sparse), std::nullopt};
  if (specs.size() > 4) {
    absl::StatusOr<comm::ProcessGroups> extra =
        comm::ProcessGroups::BuildFromSpecs(rank, {specs.begin() + 4, specs.end()}, store, factory);
    if (!extra.ok()) return extra.status();
    groups.extra.emplace(*std::move(extra));
  }
  return groups;
}

}  // namespace dist
}  // namespace recfleet
