// `recfleet plan JOB.yaml --topology TOPO.yaml [--json] [--html OUT.html]`:
// plans a job offline (a dry run; nothing is scheduled) and prints why.

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "cli/command.h"
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
    "\n"
    "  --topology FILE  the fleet (see deploy/examples/topology-*.yaml)\n"
    "  --json           print the plan as JSON instead of tables\n"
    "  --html FILE      also write a one-page HTML report (memory bars, traffic per level)\n"
    "  --max-rows N     rows per table in the text output (default 40)\n"
    "\n"
    "Exit codes: 0 planned, 1 nothing fits (the message says what is over and how to fix\n"
    "it), 2 bad arguments or input files.";

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
  absl::StatusOr<PlanRequest> request = LoadJobYaml(job_path);
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
