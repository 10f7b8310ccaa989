#include "planner/topology.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace recfleet::planner {

const char* LinkLevelName(int level) {
  switch (level) {
    case kNvlink:
      return "nvlink";
    case kZone:
      return "zone";
    case kCrossZone:
      return "cross-zone";
  }
  return "none";
}

int Topology::DomainSize(int level) const {
  switch (level) {
    case kNvlink:
      return NvlinkDomainSize();
    case kZone:
      return ZoneSize();
    default:
      return WorldSize();
  }
}

absl::Status ValidateTopology(const Topology& t) {
  auto positive = [](const char* field, double v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("topology: '", field, "' must be > 0, got ", v));
  };
  for (auto s : {positive("nodes", t.num_nodes), positive("gpus_per_node", t.gpus_per_node),
                 positive("nodes_per_nvlink_domain", t.nodes_per_nvlink_domain),
                 positive("nodes_per_zone", t.nodes_per_zone),
                 positive("gpu.hbm_gib", t.hbm_bytes_per_gpu),
                 positive("gpu.peak_tflops", t.peak_flops_per_gpu),
                 positive("gpu.hbm_bandwidth_gbps", t.hbm_bandwidth_bytes_per_s)}) {
    if (!s.ok()) return s;
  }
  if (t.cpu_cores_per_node < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: 'cpu_cores_per_node' must be >= 0 (0: one device per rank), got ",
        t.cpu_cores_per_node));
  }
  if (t.nodes_per_zone % t.nodes_per_nvlink_domain != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: 'nodes_per_zone' (", t.nodes_per_zone,
        ") must be a multiple of 'nodes_per_nvlink_domain' (", t.nodes_per_nvlink_domain, ")"));
  }
  if (t.num_nodes % t.nodes_per_zone != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology: 'nodes' (", t.num_nodes, ") must be a multiple of 'nodes_per_zone' (",
                     t.nodes_per_zone, ")"));
  }
  for (int l = 0; l < kNumLevels; ++l) {
    // A level that no group can cross (one zone, one-node domains) may be
    // left unset; the others need a bandwidth.
    bool used = (l == kNvlink && t.NvlinkDomainSize() > 1) ||
                (l == kZone && t.ZoneSize() > t.NvlinkDomainSize()) ||
                (l == kCrossZone && t.NumZones() > 1);
    if (used && !(t.links[l].bandwidth_bytes_per_s > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology: 'links.", l == kCrossZone ? "cross_zone" : LinkLevelName(l),
          ".bandwidth_gbps' must be > 0"));
    }
    if (t.links[l].latency_s < 0) {
      return absl::InvalidArgumentError(absl::StrCat("topology: 'links.", LinkLevelName(l),
                                                     ".latency_us' must be >= 0"));
    }
  }
  return absl::OkStatus();
}

int GroupShape::HighestLevel() const {
  for (int l = kNumLevels - 1; l >= 0; --l) {
    if (factors[l] > 1) return l;
  }
  return -1;
}

GroupShape MakeGroup(const Topology& topology, int size, int stride) {
  GroupShape g;
  g.size = size;
  g.stride = stride;
  // Members of the group inside one domain of each level, innermost first.
  int inner = 1;
  for (int l = 0; l < kNumLevels; ++l) {
    int domain = topology.DomainSize(l);
    int within = l == kNumLevels - 1
                     ? size
                     : std::min(size, std::max(1, (domain + stride - 1) / stride));
    within = std::max(within, inner);
    g.factors[l] = within / inner;
    inner = within;
  }
  return g;
}

std::string DescribeGroup(const GroupShape& g) {
  if (g.size <= 1) return "a single rank";
  std::string out;
  for (int l = 0; l < kNumLevels; ++l) {
    if (g.factors[l] > 1) {
      absl::StrAppend(&out, out.empty() ? "" : ", ", LinkLevelName(l), " x", g.factors[l]);
    }
  }
  return out;
}

RankLocation LocateRank(const Topology& topology, int rank) {
  RankLocation loc;
  loc.node = rank / topology.gpus_per_node;
  loc.gpu = rank % topology.gpus_per_node;
  loc.zone = loc.node / topology.nodes_per_zone;
  return loc;
}

}  // namespace recfleet::planner
