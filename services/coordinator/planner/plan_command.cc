// `recfleet plan JOB.yaml --topology TOPO.yaml [--json] [--html OUT.html]`:
// plans a job offline (a dry run; nothing is scheduled) and prints why.
// JOB.yaml is either the planner's own model format or a JobSpec file (what
// `recfleet submit` takes), which goes through the coordinator's adapter.

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "yaml-cpp/yaml.h"
#include "cli/command.h"
#include "cli/jobs/spec_file.h"
#include "services/coordinator/plan_adapter.h"
#include "services/coordinator/spec_validation.h"
#include "services/coordinator/planner/planner.h"
#include "services/coordinator/planner/report.h"
#include "services/coordinator/planner/yaml_io.h"

namespace recfleet::planner {
namespace {

constexpr char kUsage[] =
    "usage: recfleet plan JOB.yaml --topology TOPO.yaml [--json] [--html OUT.html] "
    "[--max-rows N]\n"
    "\n"
    "Plans how the job spreads over the fleet (FSDP group, expert parallelism, V1/V2/V3\n"
    "embedding layout, table sharding, rank placement, activation checkpointing) and\n"
    "predicts per-GPU memory and step time, with the reason for every choice.\n"
    "JOB.yaml is a job file as `recfleet submit` takes (YAML or JSON; parameters and\n"
    "FLOPs are estimated from its dims) or the planner's model format\n"
    "(deploy/examples/plan-model-*.yaml, with explicit counts).\n"
    "\n"
    "  --topology FILE  the fleet (see deploy/examples/topology-*.yaml)\n"
    "  --json           print the plan as JSON instead of tables\n"
    "  --html FILE      also write a one-page HTML report (memory bars, traffic per level)\n"
    "  --max-rows N     rows per table in the text output (default 40)\n"
    "\n"
    "Exit codes: 0 planned, 1 nothing fits (the message says what is over and how to fix\n"
    "it), 2 bad arguments or input files.";

// JobSpec files carry top-level keys the planner's own format does not.
bool IsJobSpecFile(const std::string& path) {
  if (absl::EndsWith(path, ".json")) return true;
  try {
    YAML::Node root = YAML::LoadFile(path);
    if (!root.IsMap()) return false;
    for (const char* key : {"display_name", "data", "resources", "parallelism", "training"}) {
      if (root[key]) return true;
    }
  } catch (const YAML::Exception&) {
    // Not readable as YAML: the planner's loader reports why.
  }
  return false;
}

absl::StatusOr<PlanRequest> LoadJob(const std::string& path) {
  if (!IsJobSpecFile(path)) return LoadJobYaml(path);
  absl::StatusOr<::recfleet::v1::JobSpec> spec = cli::LoadJobSpec(path);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = coordinator::ValidateJobSpec(*spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return coordinator::PlanRequestFromSpec(*spec);
}

int Usage(const std::string& problem) {
  std::fprintf(stderr, "recfleet plan: %s\n\n%s\n", problem.c_str(), kUsage);
  return cli::kExitUsage;
}

int Run(const std::vector<std::string>& args) {
  std::string job_path, topology_path, html_path;
  bool json = false;
  TextOptions text;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* flag, std::string* out) {
      const std::string eq = std::string(flag) + "=";
      if (absl::StartsWith(a, eq)) {
        *out = a.substr(eq.size());
        return true;
      }
      if (a == flag && i + 1 < args.size()) {
        *out = args[++i];
        return true;
      }
      return false;
    };
    std::string rows;
    if (a == "--json") {
      json = true;
    } else if (a == "--help" || a == "-h") {
      std::printf("%s\n", kUsage);
      return cli::kExitOk;
    } else if (value("--topology", &topology_path) || value("--html", &html_path)) {
    } else if (value("--max-rows", &rows)) {
      if (!absl::SimpleAtoi(rows, &text.max_rows) || text.max_rows < 1) {
        return Usage("--max-rows takes a whole number >= 1");
      }
    } else if (absl::StartsWith(a, "-")) {
      return Usage("unknown or incomplete flag '" + a + "'");
    } else if (job_path.empty()) {
      job_path = a;
    } else {
      return Usage("one job file only; got '" + job_path + "' and '" + a + "'");
    }
  }
  if (job_path.empty()) return Usage("missing JOB.yaml");
  if (topology_path.empty()) return Usage("missing --topology TOPO.yaml");

  absl::StatusOr<Topology> topology = LoadTopologyYaml(topology_path);
  if (!topology.ok()) return Usage(std::string(topology.status().message()));
  absl::StatusOr<PlanRequest> request = LoadJob(job_path);
  if (!request.ok()) return Usage(std::string(request.status().message()));
  absl::StatusOr<Plan> plan = MakePlan(*topology, *request);
  if (!plan.ok()) {
    std::fprintf(stderr, "recfleet plan: %s\n", std::string(plan.status().message()).c_str());
    return cli::kExitFailure;
  }
  const std::string out = json ? FormatJson(*plan) : FormatText(*plan, text);
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (!html_path.empty()) {
    std::ofstream html(html_path);
    html << FormatHtml(*plan);
    if (!html.good()) {
      std::fprintf(stderr, "recfleet plan: cannot write '%s'\n", html_path.c_str());
      return cli::kExitFailure;
    }
    std::fprintf(stderr, "wrote %s\n", html_path.c_str());
  }
  return cli::kExitOk;
}

}  // namespace

RECFLEET_REGISTER_COMMAND({"plan", "plan a job's parallelism, memory and step time (dry run)",
                           kUsage, Run});

}  // namespace recfleet::planner
