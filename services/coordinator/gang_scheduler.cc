#include "services/coordinator/gang_scheduler.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace recfleet::coordinator {

using ::recfleet::v1::JobSpec;
using ::recfleet::v1::ProcessGroup;

namespace {

auto TopologyKey(const WorkerView& w) {
  return std::tie(w.topology.zone(), w.topology.nvlink_domain(), w.topology.node(), w.id);
}

// Takes `n` workers from `pool`, grouped so that same-node workers are
// adjacent, preferring the smallest group (domain or zone) that fits whole.
template <typename KeyFn>
std::optional<std::vector<WorkerView>> BestFit(const std::vector<WorkerView>& pool, size_t n,
                                               KeyFn key) {
  std::map<std::string, std::vector<WorkerView>> groups;
  for (const WorkerView& w : pool) groups[key(w)].push_back(w);
  const std::vector<WorkerView>* best = nullptr;
  for (const auto& [k, members] : groups) {
    if (members.size() >= n && (best == nullptr || members.size() < best->size())) {
      best = &members;
    }
  }
  if (best == nullptr) return std::nullopt;
  return std::vector<WorkerView>(best->begin(), best->begin() + n);
}

}  // namespace

std::optional<Placement> PlaceGang(const JobSpec& spec, std::vector<WorkerView> idle) {
  const size_t need = static_cast<size_t>(std::max(spec.resources().workers(), 0));
  const int gpus = spec.resources().gpus_per_worker();
  if (need == 0) return std::nullopt;
  idle.erase(std::remove_if(idle.begin(), idle.end(),
                            [gpus](const WorkerView& w) { return w.gpus < gpus; }),
             idle.end());
  if (idle.size() < need) return std::nullopt;
  std::sort(idle.begin(), idle.end(),
            [](const WorkerView& a, const WorkerView& b) { return TopologyKey(a) < TopologyKey(b); });
  std::optional<std::vector<WorkerView>> chosen = BestFit(
      idle, need, [](const WorkerView& w) { return w.topology.zone() + "\n" + w.topology.nvlink_domain(); });
  if (!chosen) chosen = BestFit(idle, need, [](const WorkerView& w) { return w.topology.zone(); });
  if (!chosen) chosen = std::vector<WorkerView>(idle.begin(), idle.begin() + need);
  Placement p;
  p.workers = *std::move(chosen);
  p.ranks_per_worker = std::max(gpus, 1);
  return p;
}

absl::StatusOr<GroupPlan> DefaultGroups(const JobSpec& spec, const Placement& placement) {
  std::vector<ProcessGroup> groups(1);
  groups[0].set_name("world");
  std::map<std::string, ProcessGroup> nodes;
  for (size_t i = 0; i < placement.workers.size(); ++i) {
    const std::string& node = placement.workers[i].topology.node();
    for (int r = 0; r < placement.ranks_per_worker; ++r) {
      int rank = static_cast<int>(i) * placement.ranks_per_worker + r;
      groups[0].add_ranks(rank);
      if (!node.empty()) nodes[node].add_ranks(rank);
    }
  }
  for (auto& [node, g] : nodes) {
    g.set_name("node/" + node);
    groups.push_back(std::move(g));
  }
  return GroupPlan{std::move(groups), "world and per-node groups"};
}

}  // namespace recfleet::coordinator
