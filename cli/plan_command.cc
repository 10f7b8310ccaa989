// `recfleet plan JOB.yaml --topology TOPO.yaml [--json] [--html OUT.html]`:
// plans a job offline (a dry run; nothing is scheduled) and prints why.
// JOB.yaml is either the planner's own model format or a JobSpec file (what
// `recfleet submit` takes), which goes through the coordinator's adapter.
// `recfleet plan JOB.yaml --coordinator HOST:PORT [--json]` asks a running
// coordinator instead (JobService.PlanJob): the plan on the workers it would
// pick now, printed the same way.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/jobs/job_client.h"
#include "cli/jobs/spec_file.h"
#include "engine/job_model.h"
#include "engine/step_rates.h"
#include "planner/planner.h"
#include "planner/report.h"
#include "planner/yaml_io.h"
#include "services/common/flags.h"
#include "services/coordinator/plan_adapter.h"
#include "services/coordinator/spec_validation.h"
#include "yaml-cpp/yaml.h"

namespace recfleet::planner {
namespace {

constexpr char kUsage[] =
    "usage: recfleet plan JOB.yaml --topology TOPO.yaml [--json] [--html OUT.html] "
    "[--max-rows N]\n"
    "       recfleet plan JOB.yaml --coordinator HOST:PORT [--auth-token-file FILE] "
    "[--timeout S] [--json]\n"
    "\n"
    "Plans how the job spreads over the fleet (FSDP group, expert parallelism, V1/V2/V3\n"
    "embedding layout, table sharding, rank placement, activation checkpointing) and\n"
    "predicts per-GPU memory and step time, with the reason for every choice.\n"
    "JOB.yaml is a job file as `recfleet submit` takes (YAML or JSON; parameters and\n"
    "FLOPs are estimated from its dims) or the planner's model format\n"
    "(deploy/examples/plan-model-*.yaml, with explicit counts). The job's parallelism\n"
    "hints (fsdp_group_size, replicas, table_sharding_group_size) are honored, and the\n"
    "plan says what they cost against the planner's own choice.\n"
    "\n"
    "  --topology FILE          the fleet (see deploy/examples/topology-*.yaml)\n"
    "  --rates FILE             price the job's GEM-lite with a measured rate table\n"
    "                           (`recfleet data calibrate --rates`, e.g. bench/rates/*.yaml):\n"
    "                           real FLOPs and bytes, measured speeds; --topology only\n"
    "  --coordinator HOST:PORT  plan on a running coordinator instead, on the workers it\n"
    "                           would pick now (JOB.yaml must be a job file); default\n"
    "                           without --topology: $RECFLEET_COORDINATOR\n"
    "  --auth-token-file FILE   bearer token file (default: $RECFLEET_AUTH_TOKEN)\n"
    "  --timeout SECONDS        deadline of the call (default 10)\n"
    "  --json                   print the plan as JSON instead of tables\n"
    "  --html FILE              also write a one-page HTML report (memory bars, traffic\n"
    "                           per level; --topology only)\n"
    "  --what-if                plan a job file `recfleet submit` would refuse (e.g. several\n"
    "                           GPUs per worker, which recfleet does not run yet); without it\n"
    "                           a job file must pass the same checks as submission\n"
    "  --max-rows N             rows per table in the text output (default 40; --topology\n"
    "                           only)\n"
    "\n"
    "Exit codes: 0 planned, 1 nothing fits (the message says what is over and how to fix\n"
    "it) or the coordinator refused, 2 bad arguments or input files, 3 coordinator\n"
    "unreachable.";

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

// What `recfleet submit` meets at CreateJob after the structural checks:
// whether recfleet builds the job, so a plan never shows a job the
// coordinator would then refuse. OK with `what_if`.
absl::Status CheckBuildable(const std::string& path, const ::recfleet::v1::JobSpec& spec, bool what_if) {
  if (what_if) return absl::OkStatus();
  if (absl::Status s = engine::CheckBuildable(spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": `recfleet submit` would refuse this job: ", s.message(),
                                                   " (--what-if plans it anyway)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanRequest> LoadJob(const std::string& path, bool what_if,
                                    const engine::StepRates* rates, const Topology& topology) {
  if (!IsJobSpecFile(path)) return LoadJobYaml(path);
  absl::StatusOr<::recfleet::v1::JobSpec> spec = cli::LoadJobSpec(path);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = coordinator::ValidateJobSpec(*spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  if (absl::Status s = CheckBuildable(path, *spec, what_if); !s.ok()) return s;
  return coordinator::PlanRequestFromSpec(*spec, rates, topology);
}

int Usage(const std::string& problem) {
  std::fprintf(stderr, "recfleet plan: %s\n\n%s\n", problem.c_str(), kUsage);
  return cli::kExitUsage;
}

// A bad input file (job, topology, rates, token): the problem alone, since
// the flags were right and the usage would bury the field it names.
int BadInput(const std::string& problem) {
  std::fprintf(stderr, "recfleet plan: %s\n", problem.c_str());
  return cli::kExitUsage;
}

// Plans on the coordinator at `address` (JobService.PlanJob).
int RunRemote(const std::string& job_path, const std::string& address,
              const std::string& token_file, const std::string& timeout_text, bool json, bool what_if) {
  if (!IsJobSpecFile(job_path)) {
    return Usage("--coordinator plans job files (what `recfleet submit` takes); '" + job_path +
                 "' is in the planner's own format: plan it with --topology");
  }
  double timeout = 10;
  if (!timeout_text.empty() && (!absl::SimpleAtod(timeout_text, &timeout) || timeout <= 0)) {
    return Usage("--timeout must be a number of seconds > 0, got '" + timeout_text + "'");
  }
  absl::StatusOr<std::string> token =
      LoadAuthToken(token_file, std::getenv("RECFLEET_AUTH_TOKEN"));
  if (!token.ok()) return BadInput(std::string(token.status().message()));
  absl::StatusOr<::recfleet::v1::JobSpec> spec = cli::LoadJobSpec(job_path);
  if (!spec.ok()) return BadInput(std::string(spec.status().message()));
  // The coordinator's PlanJob checks the structure (and answers with the
  // field), not what recfleet builds: that is checked here, on a
  // well-formed spec, as CreateJob orders the two.
  if (coordinator::ValidateJobSpec(*spec).ok()) {
    if (absl::Status s = CheckBuildable(job_path, *spec, what_if); !s.ok()) return BadInput(std::string(s.message()));
  }
  absl::StatusOr<std::unique_ptr<cli::JobClient>> client =
      cli::JobClient::Connect(address, *token, absl::Seconds(timeout));
  if (!client.ok()) return Usage(std::string(client.status().message()));
  ::recfleet::v1::PlanJobRequest request;
  *request.mutable_spec() = *std::move(spec);
  absl::StatusOr<::recfleet::v1::PlanJobResponse> response = (*client)->PlanJob(request);
  if (!response.ok()) {
    const absl::Status& s = response.status();
    std::fprintf(stderr, "recfleet plan: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
                 std::string(s.message()).c_str());
    if (absl::IsUnauthenticated(s)) {
      std::fprintf(stderr, "hint: set RECFLEET_AUTH_TOKEN or pass --auth-token-file\n");
    }
    return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ? cli::kExitUnavailable
                                                                 : cli::kExitFailure;
  }
  if (json) {
    std::fwrite(response->report_json().data(), 1, response->report_json().size(), stdout);
    return cli::kExitOk;
  }
  std::printf("planned by the coordinator at %s on %d worker(s):\n", address.c_str(),
              response->workers_size());
  for (const std::string& w : response->workers()) std::printf("  %s\n", w.c_str());
  std::printf("\n");
  std::fwrite(response->report().data(), 1, response->report().size(), stdout);
  return cli::kExitOk;
}

int Run(const std::vector<std::string>& args) {
  cli::FlagSpec spec;
  spec.values = {"topology", "html", "coordinator", "auth-token-file", "timeout", "max-rows", "rates"};
  spec.switches = {"json", "what-if"};
  spec.positional = true;
  absl::StatusOr<cli::Flags> flags = cli::ParseCommandFlags("plan", args, spec);
  if (!flags.ok()) return cli::kExitUsage;
  std::string topology_path = flags->Str("topology"), html_path = flags->Str("html");
  std::string coordinator = flags->Str("coordinator"), token_file = flags->Str("auth-token-file");
  std::string timeout = flags->Str("timeout"), rows_flag = flags->Str("max-rows");
  const bool json = flags->Bool("json"), what_if = flags->Bool("what-if");
  TextOptions text;
  if (!rows_flag.empty() && (!absl::SimpleAtoi(rows_flag, &text.max_rows) || text.max_rows < 1)) {
    return Usage("--max-rows takes a whole number >= 1");
  }
  if (flags->positional().size() > 1) {
    return Usage("one job file only; got '" + flags->positional()[0] + "' and '" + flags->positional()[1] + "'");
  }
  const std::string job_path = flags->positional().empty() ? "" : flags->positional()[0];
  if (job_path.empty()) return Usage("missing JOB.yaml");
  if (!topology_path.empty() && !coordinator.empty()) {
    return Usage("--topology (plan here) and --coordinator (plan there) exclude each other");
  }
  if (topology_path.empty() && coordinator.empty()) {
    const char* env = std::getenv("RECFLEET_COORDINATOR");
    if (env == nullptr || *env == '\0') {
      return Usage("missing --topology TOPO.yaml or --coordinator HOST:PORT");
    }
    coordinator = env;
  }
  if (!coordinator.empty()) {
    if (!html_path.empty() || !rows_flag.empty()) {
      return Usage("--html and --max-rows need --topology (the coordinator returns the report)");
    }
    return RunRemote(job_path, coordinator, token_file, timeout, json, what_if);
  }

  absl::StatusOr<Topology> topology = LoadTopologyYaml(topology_path);
  if (!topology.ok()) return BadInput(std::string(topology.status().message()));
  std::optional<engine::StepRates> rates;
  if (flags->Has("rates")) {
    absl::StatusOr<engine::StepRates> r = engine::ReadStepRates(flags->Str("rates"));
    if (!r.ok()) return BadInput(std::string(r.status().message()));
    // A table prices the device it was measured on: a CPU table's rates
    // (and its rank synchronization term) mean nothing on GPUs, and a CUDA
    // table's nothing on CPU ranks. A CPU fleet is one with CPU cores.
    const bool cpu_fleet = topology->cpu_cores_per_node > 0;
    if ((r->device == "cpu") != cpu_fleet) {
      return BadInput(absl::StrCat("--rates ", flags->Str("rates"), " was measured on ", r->device, " (", r->machine,
                                   ") but ", topology_path, " describes ",
                                   cpu_fleet ? "CPU ranks (cpu_cores_per_node set)" : "GPUs (no cpu_cores_per_node)",
                                   ": pass a ", cpu_fleet ? "cpu" : "cuda", " rate table (bench/rates/",
                                   cpu_fleet ? "cpu-fp32" : "h200-bf16", ".yaml) or another topology"));
    }
    rates = *std::move(r);
    *topology = coordinator::WithMeasuredPeak(*std::move(topology), *rates);
  }
  absl::StatusOr<PlanRequest> request = LoadJob(job_path, what_if, rates ? &*rates : nullptr, *topology);
  if (!request.ok()) return BadInput(std::string(request.status().message()));
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

RECFLEET_REGISTER_COMMAND({"plan", "Plan a job's parallelism, memory and step time (dry run)",
                           kUsage, Run});

}  // namespace recfleet::planner
