#ifndef RECFLEET_PLANNER_YAML_IO_H_
#define RECFLEET_PLANNER_YAML_IO_H_

// YAML front end of the planner: a topology file and a job file (model,
// batch, precision recipe, efficiencies, planner knobs). Formats are shown
// by deploy/examples/topology-*.yaml and deploy/examples/plan-model-*.yaml.
//
// Units in the files are the ones people quote: GiB of HBM, TFLOP/s, GB/s
// (1e9 bytes) per GPU and direction, microseconds of latency. Unknown keys
// are errors (a typo must not silently fall back to a default). Errors name
// the source, the key path and the expected form.

#include <string>

#include "absl/status/statusor.h"
#include "planner/model.h"
#include "planner/topology.h"

namespace recfleet::planner {

// `source` names the text in errors (usually the file path).
absl::StatusOr<Topology> ParseTopologyYaml(const std::string& text, const std::string& source);
absl::StatusOr<PlanRequest> ParseJobYaml(const std::string& text, const std::string& source);

absl::StatusOr<Topology> LoadTopologyYaml(const std::string& path);
absl::StatusOr<PlanRequest> LoadJobYaml(const std::string& path);

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_YAML_IO_H_
