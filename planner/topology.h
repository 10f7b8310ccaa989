#ifndef RECFLEET_PLANNER_TOPOLOGY_H_
#define RECFLEET_PLANNER_TOPOLOGY_H_

// The fleet as the planner sees it: nodes of GPUs, NVLink domains of one or
// more nodes, zones of nodes joined by RoCE, and oversubscribed links between
// zones. Ranks are numbered in topology order (zone, node, GPU), so a block
// of consecutive ranks is as close together as the fleet allows; every
// communication group the planner forms is described by (size, stride) over
// that numbering and costed level by level.
//
// Plain values; safe to share between threads once built.

#include <array>
#include <string>

#include "absl/status/status.h"

namespace recfleet::planner {

// Link levels, innermost first. A collective over a group that spans several
// levels runs hierarchically: each level carries only its own share.
enum LinkLevel { kNvlink = 0, kZone = 1, kCrossZone = 2 };
inline constexpr int kNumLevels = 3;

// "nvlink", "zone" or "cross-zone".
const char* LinkLevelName(int level);

// Per-GPU, per-direction bandwidth and per-message latency of one level.
struct LinkSpec {
  double bandwidth_bytes_per_s = 0;
  double latency_s = 0;
};

struct Topology {
  std::string name;
  int num_nodes = 0;
  int gpus_per_node = 0;
  int nodes_per_nvlink_domain = 1;  // >1 for multi-node NVLink (e.g. NVL72).
  int nodes_per_zone = 0;           // Nodes joined by the zone (RoCE) fabric.
  double hbm_bytes_per_gpu = 0;
  double peak_flops_per_gpu = 0;          // Dense bf16 peak used for compute time and MFU.
  double hbm_bandwidth_bytes_per_s = 0;   // Bounds embedding lookups.
  std::array<LinkSpec, kNumLevels> links;  // Indexed by LinkLevel.
  // CPU fleets: cores a node's ranks share (the "GPU" figures above are then
  // one core's); fractional on a shared machine whose other users take part
  // of them. 0: every rank has its own device. With more ranks than cores,
  // each rank computes at cores / ranks of the per-core rates.
  double cpu_cores_per_node = 0;

  int WorldSize() const { return num_nodes * gpus_per_node; }
  int NvlinkDomainSize() const { return nodes_per_nvlink_domain * gpus_per_node; }
  int ZoneSize() const { return nodes_per_zone * gpus_per_node; }
  int NumZones() const { return num_nodes / nodes_per_zone; }
  // Fraction of a device (or core) one rank computes with: 1, or
  // cpu_cores_per_node / gpus_per_node on an oversubscribed CPU node.
  double ComputeShare() const {
    return cpu_cores_per_node > 0 && cpu_cores_per_node < gpus_per_node
               ? cpu_cores_per_node / gpus_per_node
               : 1.0;
  }
  // Ranks in one domain of `level`: NVLink domain, zone, or the whole world.
  int DomainSize(int level) const;
};

// Checks counts are positive, domains nest (NVLink domain divides the zone,
// the zone divides the fleet) and every link has bandwidth. Errors name the
// field.
absl::Status ValidateTopology(const Topology& topology);

// A communication group: member i is rank first + i * stride. The planner
// only forms groups whose members are spread evenly over domains, so the
// number of members sharing one domain of each level is the same for every
// member.
struct GroupShape {
  int size = 1;
  int stride = 1;
  // factors[l]: how many level-(l-1) sub-groups one level-l domain joins
  // (factors[kNvlink]: members inside one NVLink domain). Their product is
  // `size`.
  std::array<int, kNumLevels> factors = {1, 1, 1};

  // Outermost level with more than one sub-group; -1 for a group of one.
  int HighestLevel() const;
};

GroupShape MakeGroup(const Topology& topology, int size, int stride);

// The levels a group spans: "nvlink x8, zone x4", or "a single rank".
std::string DescribeGroup(const GroupShape& group);

// Where a rank lives.
struct RankLocation {
  int zone = 0;
  int node = 0;
  int gpu = 0;  // Index inside the node.
};
RankLocation LocateRank(const Topology& topology, int rank);

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_TOPOLOGY_H_
