#include "planner/cost_model.h"

namespace recfleet::planner {
namespace {

void AddLevel(const Topology& t, int level, double messages, double bytes, CommCost* cost) {
  const LinkSpec& link = t.links[level];
  double s = messages * link.latency_s;
  if (bytes > 0) s += bytes / link.bandwidth_bytes_per_s;
  // Inside a CPU node the "link" is the cores copying through loopback:
  // ranks sharing fewer cores than they are share its speed too.
  if (level == kNvlink) s /= t.ComputeShare();
  cost->seconds_per_level[level] += s;
  cost->bytes_per_level[level] += bytes;
  cost->seconds += s;
}

}  // namespace

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllGather:
      return "all-gather";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kAllReduce:
      return "all-reduce";
    case Collective::kAllToAll:
      return "all-to-all";
  }
  return "?";
}

CommCost CollectiveCost(const Topology& t, const GroupShape& group, Collective collective,
                        double bytes) {
  CommCost cost;
  if (group.size <= 1 || bytes <= 0) return cost;
  double inner = 1;  // Product of the factors of the levels inside this one.
  for (int l = 0; l < kNumLevels; ++l) {
    const int f = group.factors[l];
    if (f > 1) {
      if (collective == Collective::kAllToAll) {
        const double peers = inner * f - inner;
        AddLevel(t, l, peers, bytes * peers / group.size, &cost);
      } else {
        const double passes = collective == Collective::kAllReduce ? 2 : 1;
        AddLevel(t, l, passes * (f - 1), passes * bytes * (f - 1) / (inner * f), &cost);
      }
    }
    inner *= f;
  }
  return cost;
}

double ComputeSeconds(double flops, double peak_flops, double efficiency) {
  if (flops <= 0) return 0;
  return flops / (peak_flops * efficiency);
}

}  // namespace recfleet::planner
