#include "worker/comm/process_groups.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recfleet {
namespace comm {

int ProcessGroupSpec::GroupRank(int world_rank) const {
  auto it = std::find(ranks.begin(), ranks.end(), world_rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

std::string ProcessGroupSpec::StoreNamespace() const { return absl::StrCat("group/", name, "/", index, "/"); }

absl::StatusOr<DeviceMesh> DeviceMesh::Create(int world_size, std::vector<MeshDim> dims) {
  if (world_size < 1) return absl::InvalidArgumentError(absl::StrCat("mesh: world_size ", world_size, " < 1"));
  if (dims.empty()) return absl::InvalidArgumentError("mesh: needs at least one dimension");
  int64_t product = 1;
  absl::flat_hash_set<std::string> seen;
  for (const MeshDim& d : dims) {
    if (d.name.empty() || d.name.find_first_of("+/") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh: dimension name '", d.name, "' must be non-empty and contain no '+' or '/'"));
    }
    if (!seen.insert(d.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("mesh: dimension '", d.name, "' appears twice"));
    }
    if (d.size < 1) return absl::InvalidArgumentError(absl::StrCat("mesh: dimension '", d.name, "' has size ", d.size));
    product *= d.size;
  }
  if (product != world_size) {
    std::vector<std::string> parts;
    for (const MeshDim& d : dims) parts.push_back(absl::StrCat(d.name, "=", d.size));
    return absl::InvalidArgumentError(absl::StrCat("mesh: dimensions {", absl::StrJoin(parts, ", "),
                                                   "} multiply to ", product, " but world_size is ", world_size));
  }
  return DeviceMesh(world_size, std::move(dims));
}

std::vector<int> DeviceMesh::Coordinates(int rank) const {
  std::vector<int> coords(dims_.size());
  for (int i = static_cast<int>(dims_.size()) - 1; i >= 0; --i) {
    coords[i] = rank % dims_[i].size;
    rank /= dims_[i].size;
  }
  return coords;
}

absl::StatusOr<std::vector<bool>> DeviceMesh::Select(absl::Span<const std::string> dims) const {
  if (dims.empty()) return absl::InvalidArgumentError("process group: name at least one mesh dimension");
  std::vector<bool> selected(dims_.size(), false);
  for (const std::string& name : dims) {
    auto it = std::find_if(dims_.begin(), dims_.end(), [&](const MeshDim& d) { return d.name == name; });
    if (it == dims_.end()) {
      std::vector<std::string> names;
      for (const MeshDim& d : dims_) names.push_back(d.name);
      return absl::InvalidArgumentError(absl::StrCat("process group: '", name, "' is not a mesh dimension (have ",
                                                     absl::StrJoin(names, ", "), ")"));
    }
    selected[it - dims_.begin()] = true;
  }
  return selected;
}

absl::StatusOr<ProcessGroupSpec> DeviceMesh::GroupOf(int rank, absl::Span<const std::string> dims) const {
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("process group: rank ", rank, " not in [0, ", world_size_, ")"));
  }
  absl::StatusOr<std::vector<bool>> selected = Select(dims);
  if (!selected.ok()) return selected.status();
  const std::vector<int> mine = Coordinates(rank);
  ProcessGroupSpec spec;
  // Group names list dimensions in mesh order, whatever order was asked.
  std::vector<std::string> names;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if ((*selected)[i]) names.push_back(dims_[i].name);
  }
  spec.name = absl::StrJoin(names, "+");
  // The index is the row-major position of the unselected coordinates.
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (!(*selected)[i]) spec.index = spec.index * dims_[i].size + mine[i];
  }
  for (int r = 0; r < world_size_; ++r) {
    const std::vector<int> c = Coordinates(r);
    bool same = true;
    for (size_t i = 0; i < dims_.size() && same; ++i) same = (*selected)[i] || c[i] == mine[i];
    if (same) spec.ranks.push_back(r);
  }
  return spec;
}

absl::StatusOr<std::vector<ProcessGroupSpec>> DeviceMesh::AllGroups(absl::Span<const std::string> dims) const {
  std::vector<ProcessGroupSpec> groups;
  for (int r = 0; r < world_size_; ++r) {
    absl::StatusOr<ProcessGroupSpec> g = GroupOf(r, dims);
    if (!g.ok()) return g.status();
    if (g->index == static_cast<int>(groups.size())) groups.push_back(*std::move(g));
  }
  return groups;
}

absl::StatusOr<ProcessGroups> ProcessGroups::Build(const DeviceMesh& mesh, int rank,
                                                   const std::vector<std::vector<std::string>>& groups,
                                                   KvStore& store, const CommFactory& factory) {
  std::vector<ProcessGroupSpec> specs;
  for (const std::vector<std::string>& dims : groups) {
    absl::StatusOr<ProcessGroupSpec> spec = mesh.GroupOf(rank, dims);
    if (!spec.ok()) return spec.status();
    specs.push_back(*std::move(spec));
  }
  return BuildFromSpecs(rank, std::move(specs), store, factory);
}

absl::StatusOr<ProcessGroups> ProcessGroups::BuildFromSpecs(int rank, std::vector<ProcessGroupSpec> specs,
                                                            KvStore& store, const CommFactory& factory) {
  ProcessGroups result;
  for (ProcessGroupSpec& spec : specs) {
    const std::string label = absl::StrCat("process group '", spec.name, "' #", spec.index);
    if (spec.name.empty()) return absl::InvalidArgumentError("process groups: a group has an empty name");
    if (result.groups_.count(spec.name) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(label, " requested twice"));
    }
    const int group_rank = spec.GroupRank(rank);
    if (group_rank < 0) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": rank ", rank, " is not among its ranks [",
                                                     absl::StrJoin(spec.ranks, ", "), "]"));
    }
    absl::flat_hash_set<int> seen(spec.ranks.begin(), spec.ranks.end());
    if (seen.size() != spec.ranks.size()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": ranks [", absl::StrJoin(spec.ranks, ", "),
                                                     "] repeat a rank"));
    }
    PrefixKvStore group_store(&store, spec.StoreNamespace());
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        factory(group_store, group_rank, static_cast<int>(spec.ranks.size()));
    if (!comm.ok()) {
      return absl::Status(comm.status().code(), absl::StrCat(label, ": ", comm.status().message()));
    }
    std::string name = spec.name;
    result.groups_[name] = Group{std::move(spec), *std::move(comm)};
  }
  return result;
}

Communicator* ProcessGroups::Get(absl::string_view name) const {
  auto it = groups_.find(name);
  return it == groups_.end() ? nullptr : it->second.comm.get();
}

const ProcessGroupSpec* ProcessGroups::Spec(absl::string_view name) const {
  auto it = groups_.find(name);
  return it == groups_.end() ? nullptr : &it->second.spec;
}

}  // namespace comm
}  // namespace recfleet
