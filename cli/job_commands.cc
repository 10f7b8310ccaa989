// `recfleet submit|get|list|cancel|delete|watch|events|workers`: the job
// commands, talking to the coordinator's JobService. Registered into the recfleet command table.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/jobs/job_client.h"
#include "cli/jobs/job_format.h"
#include "cli/jobs/spec_file.h"
#include "services/common/flags.h"
#include "services/common/rpc_status.h"
#include "services/common/tls.h"

namespace recfleet::cli {
namespace {

using ::recfleet::v1::Job;
using ::recfleet::v1::JobStatus;

constexpr char kConnectionFlags[] =
    "  --coordinator HOST:PORT  coordinator address (default: $RECFLEET_COORDINATOR)\n"
    "  --auth-token-file FILE   bearer token file (default: $RECFLEET_AUTH_TOKEN)\n"
    "  --tls-ca FILE            CA that verifies the coordinator; TLS on when set\n"
    "                           (default: $RECFLEET_TLS_CA)\n"
    "  --tls-cert FILE, --tls-key FILE  client certificate for mutual TLS\n"
    "                           (default: $RECFLEET_TLS_CERT, $RECFLEET_TLS_KEY)\n"
    "  --timeout SECONDS        deadline of each call (default 10)\n";
// Commands that print a job or a list of jobs.
constexpr char kOutputFlags[] =
    "  -o, --output FORMAT      table (default), json or yaml; --json is -o json\n";
// Commands that print a stream of lines.
constexpr char kJsonFlag[] = "  --json                   print JSON instead of text\n";

// Reconnection backoff of `watch` after losing the coordinator.
constexpr absl::Duration kWatchMinBackoff = absl::Milliseconds(250);
constexpr absl::Duration kWatchMaxBackoff = absl::Seconds(8);

// Parses a job command's flags: the connection flags, `values` and
// `switches`; "-o" is --output and "-l" --selector where the command has
// them. Prints what is wrong (and deprecations).
absl::StatusOr<Flags> Parse(const std::string& command, const std::vector<std::string>& words,
                            const std::set<std::string>& values, const std::set<std::string>& switches) {
  FlagSpec spec;
  spec.values = values;
  spec.values.insert({"coordinator", "auth-token-file", "tls-ca", "tls-cert", "tls-key", "timeout"});
  spec.switches = switches;
  if (values.count("output") > 0) spec.short_names['o'] = "output";
  if (values.count("selector") > 0) spec.short_names['l'] = "selector";  // kubectl's.
  spec.positional = true;
  return ParseCommandFlags(command, words, spec);
}

enum class Output { kTable, kJson, kYaml };

// The output format of a command that takes -o / --output / --json.
// Returns false (after printing why) for an unknown format.
bool OutputOf(const std::string& command, const Flags& args, Output* out) {
  const std::string f = args.Bool("json") ? "json" : args.Str("output", "table");
  if (f == "table" || f == "text") {
    *out = Output::kTable;
  } else if (f == "json") {
    *out = Output::kJson;
  } else if (f == "yaml") {
    *out = Output::kYaml;
  } else {
    std::fprintf(stderr, "recfleet %s: -o must be table, json or yaml; got '%s'\n", command.c_str(),
                 f.c_str());
    return false;
  }
  return true;
}

// `message` as JSON or YAML (for Output::kTable the caller prints its own).
void PrintStructured(Output out, const google::protobuf::Message& message) {
  if (out == Output::kYaml) {
    std::printf("%s", ToYaml(message).c_str());
  } else {
    std::printf("%s\n", ToJson(message, true).c_str());
  }
}

int ExitCodeFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnavailable;
    case absl::StatusCode::kNotFound:
      return kExitNotFound;
    default:
      return kExitFailure;
  }
}

// Prints a server or client error; the field violations of a
// google.rpc.BadRequest detail one per line.
int Fail(const std::string& command, const absl::Status& s) {
  const std::vector<FieldViolation> violations = FieldViolationsOf(s);
  if (!violations.empty()) {
    std::fprintf(stderr, "recfleet %s: %s: %zu problem%s:\n", command.c_str(),
                 absl::StatusCodeToString(s.code()).c_str(), violations.size(),
                 violations.size() == 1 ? "" : "s");
    for (const auto& [field, description] : violations) {
      std::fprintf(stderr, "  %s %s\n", field.c_str(), description.c_str());
    }
  } else {
    std::fprintf(stderr, "recfleet %s: %s: %s\n", command.c_str(),
                 absl::StatusCodeToString(s.code()).c_str(), std::string(s.message()).c_str());
  }
  if (s.code() == absl::StatusCode::kUnauthenticated) {
    std::fprintf(stderr, "hint: set RECFLEET_AUTH_TOKEN or pass --auth-token-file\n");
  }
  return ExitCodeFor(s);
}

// Connects using the common flags; prints and returns nullptr on error.
std::unique_ptr<JobClient> Connect(const std::string& command, const Flags& args, int* exit_code) {
  std::string address = args.Str("coordinator");
  if (address.empty()) {
    const char* env = std::getenv("RECFLEET_COORDINATOR");
    address = env != nullptr ? env : "";
  }
  absl::StatusOr<std::string> token =
      LoadAuthToken(args.Str("auth-token-file"), std::getenv("RECFLEET_AUTH_TOKEN"));
  if (!token.ok()) {
    *exit_code = kExitUsage;
    Fail(command, token.status());
    return nullptr;
  }
  double timeout = 10;
  if (args.Has("timeout") && (!absl::SimpleAtod(args.Str("timeout"), &timeout) || timeout <= 0)) {
    std::fprintf(stderr, "recfleet %s: --timeout must be a number of seconds > 0, got '%s'\n",
                 command.c_str(), args.Str("timeout").c_str());
    *exit_code = kExitUsage;
    return nullptr;
  }
  // A flag wins over its environment variable.
  auto flag_or_env = [&args](const char* flag, const char* env) {
    if (args.Has(flag)) return args.Str(flag);
    const char* value = std::getenv(env);
    return std::string(value != nullptr ? value : "");
  };
  TlsOptions tls;
  tls.ca_file = flag_or_env("tls-ca", "RECFLEET_TLS_CA");
  tls.cert_file = flag_or_env("tls-cert", "RECFLEET_TLS_CERT");
  tls.key_file = flag_or_env("tls-key", "RECFLEET_TLS_KEY");
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(tls);
  if (!credentials.ok()) {
    *exit_code = kExitUsage;
    Fail(command, credentials.status());
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<JobClient>> client =
      JobClient::Connect(address, *token, absl::Seconds(timeout), *credentials);
  if (!client.ok()) {
    Fail(command, client.status());
    *exit_code = kExitUsage;
    return nullptr;
  }
  return *std::move(client);
}

// "abc" or "jobs/abc" -> "jobs/abc".
std::string JobArg(const std::string& word) {
  return absl::StartsWith(word, "jobs/") ? word : "jobs/" + word;
}

bool OnePositional(const std::string& command, const Flags& args, const char* what) {
  if (args.positional().size() == 1) return true;
  std::fprintf(stderr, "recfleet %s: expected exactly one %s, got %zu; see `recfleet help %s`\n",
               command.c_str(), what, args.positional().size(), command.c_str());
  return false;
}

// Follows the job until it ends. A coordinator that goes away after the
// watch began (a restart) is reconnected to with backoff; the snapshot it
// starts with is printed only when the state moved meanwhile. Failing to
// reach it at the start is an error (exit 3), as for every command.
int Watch(JobClient& client, const std::string& name, bool progress, bool json) {
  JobStatus::State last = JobStatus::STATE_UNSPECIFIED;
  bool seen = false;
  absl::Duration backoff = kWatchMinBackoff;
  while (true) {
    bool fresh = false;
    absl::Status s = client.WatchJob(name, progress, [&](const ::recfleet::v1::WatchJobResponse& e) {
      const JobStatus::State state = e.job().status().state();
      const bool repeat =
          seen && e.kind() == ::recfleet::v1::WatchJobResponse::SNAPSHOT && state == last;
      last = state;
      seen = fresh = true;
      if (repeat) return;
      std::printf("%s\n", json ? ToJson(e, false).c_str() : FormatWatchEvent(e).c_str());
      std::fflush(stdout);
    });
    if (last >= JobStatus::SUCCEEDED) break;  // Terminal.
    const bool lost = s.ok() || s.code() == absl::StatusCode::kUnavailable ||
                      s.code() == absl::StatusCode::kDeadlineExceeded;
    if (!seen || !lost) return Fail("watch", s);
    if (fresh) backoff = kWatchMinBackoff;
    std::fprintf(stderr, "recfleet watch: lost the coordinator (%s); reconnecting in %s\n",
                 s.ok() ? "stream ended" : std::string(s.message()).c_str(),
                 absl::FormatDuration(backoff).c_str());
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, kWatchMaxBackoff);
  }
  // The exit code tells scripts how the job ended.
  return last == JobStatus::SUCCEEDED ? kExitOk : kExitFailure;
}

std::string NewRequestId() {
  absl::BitGen gen;
  return absl::StrFormat("cli-%016x", absl::Uniform<uint64_t>(gen));
}

int Submit(const std::vector<std::string>& words) {
  absl::StatusOr<Flags> parsed = Parse("submit", words, {"request-id", "job-id"}, {"json", "watch", "progress"});
  if (!parsed.ok()) return kExitUsage;
  const Flags& args = *parsed;
  if (!OnePositional("submit", args, "job file")) {
    return kExitUsage;
  }
  absl::StatusOr<::recfleet::v1::JobSpec> spec = LoadJobSpec(args.positional()[0]);
  if (!spec.ok()) {
    Fail("submit", spec.status());
    return kExitUsage;
  }
  int code = kExitOk;
  std::unique_ptr<JobClient> client = Connect("submit", args, &code);
  if (client == nullptr) return code;
  ::recfleet::v1::CreateJobRequest request;
  *request.mutable_spec() = *std::move(spec);
  // A request id makes the client's own retries idempotent.
  request.set_request_id(args.Has("request-id") ? args.Str("request-id") : NewRequestId());
  request.set_job_id(args.Str("job-id"));
  absl::StatusOr<Job> job = client->CreateJob(request);
  if (!job.ok()) return Fail("submit", job.status());
  const bool json = args.Bool("json");
  if (json) {
    std::printf("%s\n", ToJson(*job, !args.Bool("watch")).c_str());
  } else {
    std::printf("%s submitted (%s). Follow it with: recfleet watch %s\n", job->name().c_str(),
                JobStatus::State_Name(job->status().state()).c_str(), job->name().c_str());
  }
  std::fflush(stdout);
  if (args.Bool("watch")) return Watch(*client, job->name(), args.Bool("progress"), json);
  return kExitOk;
}

int Get(const std::vector<std::string>& words) {
  Output out;
  absl::StatusOr<Flags> parsed = Parse("get", words, {"output"}, {"json"});
  if (!parsed.ok()) return kExitUsage;
  const Flags& args = *parsed;
  if (!OnePositional("get", args, "job name") || !OutputOf("get", args, &out)) {
    return kExitUsage;
  }
  int code = kExitOk;
  std::unique_ptr<JobClient> client = Connect("get", args, &code);
  if (client == nullptr) return code;
  absl::StatusOr<Job> job = client->GetJob(JobArg(args.positional()[0]));
  if (!job.ok()) return Fail("get", job.status());
  if (out == Output::kTable) {
    std::printf("%s", FormatJobDetail(*job).c_str());
  } else {
    PrintStructured(out, *job);
  }
  return kExitOk;
}

int List(const std::vector<std::string>& words) {
  Output out;
  absl::StatusOr<Flags> parsed = Parse("list", words, {"state", "page-size", "page-token", "output", "filter", "selector"}, {"json", "all"});
  if (!parsed.ok()) return kExitUsage;
  const Flags& args = *parsed;
  if (!OutputOf("list", args, &out)) {
    return kExitUsage;
  }
  if (!args.positional().empty()) {
    std::fprintf(stderr, "recfleet list: takes no arguments, got '%s'\n",
                 args.positional()[0].c_str());
    return kExitUsage;
  }
  ::recfleet::v1::ListJobsRequest request;
  for (const std::string& s : args.All("state")) {
    JobStatus::State state;
    if (!JobStatus::State_Parse(absl::AsciiStrToUpper(s), &state) ||
        state == JobStatus::STATE_UNSPECIFIED) {
      std::fprintf(stderr,
                   "recfleet list: --state must be one of QUEUED, SCHEDULING, RUNNING, "
                   "RESTARTING, SUCCEEDED, FAILED, CANCELLED; got '%s'\n",
                   s.c_str());
      return kExitUsage;
    }
    request.add_states(state);
  }
  int page_size = 0;
  if (args.Has("page-size") && !absl::SimpleAtoi(args.Str("page-size"), &page_size)) {
    std::fprintf(stderr, "recfleet list: --page-size must be an integer, got '%s'\n",
                 args.Str("page-size").c_str());
    return kExitUsage;
  }
  request.set_page_size(page_size);
  request.set_page_token(args.Str("page-token"));
  absl::StatusOr<std::string> filter = ListFilter(args.Str("filter"), args.Str("selector"));
  if (!filter.ok()) {
    std::fprintf(stderr, "recfleet list: %s\n", std::string(filter.status().message()).c_str());
    return kExitUsage;
  }
  request.set_filter(*filter);
  int code = kExitOk;
  std::unique_ptr<JobClient> client = Connect("list", args, &code);
  if (client == nullptr) return code;
  std::vector<Job> jobs;
  std::string next;
  do {
    absl::StatusOr<::recfleet::v1::ListJobsResponse> page = client->ListJobs(request);
    if (!page.ok()) return Fail("list", page.status());
    jobs.insert(jobs.end(), page->jobs().begin(), page->jobs().end());
    next = page->next_page_token();
    request.set_page_token(next);
  } while (args.Bool("all") && !next.empty());
  if (out != Output::kTable) {
    ::recfleet::v1::ListJobsResponse all;
    for (const Job& j : jobs) *all.add_jobs() = j;
    all.set_next_page_token(next);
    PrintStructured(out, all);
    return kExitOk;
  }
  if (jobs.empty()) {
    std::printf("no jobs\n");
    return kExitOk;
  }
  std::printf("%s", FormatJobTable(jobs).c_str());
  if (!next.empty()) {
    std::printf("(more: recfleet list --page-token %s, or --all)\n", next.c_str());
  }
  return kExitOk;
}

int Cancel(const std::vector<std::string>& words) {
  Output out;
  absl::StatusOr<Flags> parsed = Parse("cancel", words, {"reason", "output"}, {"json"});
  if (!parsed.ok()) return kExitUsage;
  const Flags& args = *parsed;
  if (!OnePositional("cancel", args, "job name") || !OutputOf("cancel", args, &out)) {
    return kExitUsage;
  }
  int code = kExitOk;
  std::unique_ptr<JobClient> client = Connect("cancel", args, &code);
  if (client == nullptr) return code;
  absl::StatusOr<Job> job = client->CancelJob(JobArg(args.positional()[0]), args.Str("reason"));
  if (!job.ok()) return Fail("cancel", job.status());
  if (out != Output::kTable) {
    PrintStructured(out, *job);
  } else {
    std::printf("%s %s\n", job->name().c_str(), JobStatus::State_Name(job->status().state()).c_str());
  }
  return kExitOk;
}

int Delete(const std::vector<std::string>& words) {
  absl::StatusOr<Flags> parsed = Parse("delete", words, {}, {});
  if (!parsed.ok()) return kExitUsage;
  const Flags& args = *parsed;
  if (!OnePositional("delete", args, "job name")) {
    return kExitUsage;
  }
  int code = kExitOk;
  std::unique_ptr<JobClient> client = Connect("delete", args, &code);
  if (client == nullptr) return code;
  const std::string name = JobArg(args.positional()[0]);
  if (absl::Status s = client->DeleteJob(name); !s.ok()) return Fail("delete", s);
  std::printf("%s deleted\n", name.c_str());
  return kExitOk;
}

int Events(const std::vector<std::string>& words) {
  Output out;
  absl::StatusOr<Flags> parsed = Parse("events", words, {"output"}, {"json"});
  if (!parsed.ok()) return kExitUsage;
  const Flags& args = *parsed;
  if (!OnePositional("events", args, "job name") || !OutputOf("events", args, &out)) {
    return kExitUsage;
  }
  int code = kExitOk;
  std::unique_ptr<JobClient> client = Connect("events", args, &code);
  if (client == nullptr) return code;
  absl::StatusOr<::recfleet::v1::ListJobEventsResponse> events =
      client->ListJobEvents(JobArg(args.positional()[0]));
  if (!events.ok()) return Fail("events", events.status());
  if (out != Output::kTable) {
    PrintStructured(out, *events);
  } else {
    std::printf("%s", FormatEventTable({events->events().begin(), events->events().end()}).c_str());
  }
  return kExitOk;
}

int Workers(const std::vector<std::string>& words) {
  Output out;
  absl::StatusOr<Flags> parsed = Parse("workers", words, {"output"}, {"json"});
  if (!parsed.ok()) return kExitUsage;
  const Flags& args = *parsed;
  if (!OutputOf("workers", args, &out)) {
    return kExitUsage;
  }
  if (!args.positional().empty()) {
    std::fprintf(stderr, "recfleet workers: takes no arguments, got '%s'\n",
                 args.positional()[0].c_str());
    return kExitUsage;
  }
  int code = kExitOk;
  std::unique_ptr<JobClient> client = Connect("workers", args, &code);
  if (client == nullptr) return code;
  absl::StatusOr<::recfleet::v1::ListWorkersResponse> workers = client->ListWorkers();
  if (!workers.ok()) return Fail("workers", workers.status());
  if (out != Output::kTable) {
    PrintStructured(out, *workers);
  } else if (workers->workers().empty()) {
    std::printf("no workers registered\n");
  } else {
    std::printf("%s", FormatWorkerTable({workers->workers().begin(), workers->workers().end()},
                                        absl::Now())
                          .c_str());
  }
  return kExitOk;
}

int WatchCommand(const std::vector<std::string>& words) {
  absl::StatusOr<Flags> parsed = Parse("watch", words, {}, {"json", "progress"});
  if (!parsed.ok()) return kExitUsage;
  const Flags& args = *parsed;
  if (!OnePositional("watch", args, "job name")) {
    return kExitUsage;
  }
  int code = kExitOk;
  std::unique_ptr<JobClient> client = Connect("watch", args, &code);
  if (client == nullptr) return code;
  return Watch(*client, JobArg(args.positional()[0]), args.Bool("progress"), args.Bool("json"));
}

RECFLEET_REGISTER_COMMAND({
    "submit",
    "Submit a job from a YAML or JSON JobSpec file",
    absl::StrCat("usage: recfleet submit JOB.yaml|JOB.json [--watch [--progress]] "
                 "[--job-id ID] [--request-id ID]\n\n"
                 "Validates and queues the job; prints its name (jobs/ID with --job-id:\n"
                 "1-63 of [a-z0-9-], starting with a letter). With --watch, follows it\n"
                 "like `recfleet watch`. Retries are safe: the same --request-id never\n"
                 "creates a second job (one is generated when not given).\n\nflags:\n",
                 kConnectionFlags, kJsonFlag,
                 "\nexit codes: 0 ok, 1 rejected/failed, 2 usage or unreadable file,\n"
                 "3 coordinator unreachable"),
    Submit,
});

RECFLEET_REGISTER_COMMAND({
    "get",
    "Show one job: state, workers, progress",
    absl::StrCat("usage: recfleet get JOB [-o table|json|yaml]\n\nJOB is jobs/ID or ID.\n\nflags:\n",
                 kConnectionFlags, kOutputFlags,
                 "\nexit codes: 0 ok, 3 coordinator unreachable, 4 no such job"),
    Get,
});

RECFLEET_REGISTER_COMMAND({
    "list",
    "List jobs, newest first",
    absl::StrCat("usage: recfleet list [--state STATE]... [-l KEY=VALUE,...] [--filter EXPR] "
                 "[--page-size N] [--page-token T] [--all] [-o table|json|yaml]\n\nflags:\n",
                 kConnectionFlags, kOutputFlags,
                 "  --state STATE            only jobs in STATE (repeatable)\n"
                 "  -l, --selector K=V,...   only jobs whose labels have these values\n"
                 "  --filter EXPR            the API's filter, e.g. 'labels.team = \"ranking\"'\n"
                 "                           (terms joined by AND; combined with -l)\n"
                 "  --all                    fetch every page\n"),
    List,
});

RECFLEET_REGISTER_COMMAND({
    "cancel",
    "Cancel a job (its workers are told to abort)",
    absl::StrCat("usage: recfleet cancel JOB [--reason TEXT] [-o table|json|yaml]\n\nflags:\n",
                 kConnectionFlags, kOutputFlags,
                 "\nexit codes: 0 cancelled (or already was), 1 already finished, 4 no such job"),
    Cancel,
});

RECFLEET_REGISTER_COMMAND({
    "delete",
    "Delete a finished job and its history",
    absl::StrCat("usage: recfleet delete JOB\n\nOnly SUCCEEDED, FAILED or CANCELLED jobs can be "
                 "deleted.\n\nflags:\n",
                 kConnectionFlags,
                 "\nexit codes: 0 deleted, 1 the job is not finished, 3 coordinator unreachable,\n"
                 "4 no such job"),
    Delete,
});

RECFLEET_REGISTER_COMMAND({
    "events",
    "Show a job's recorded state changes with times and reasons",
    absl::StrCat("usage: recfleet events JOB [-o table|json|yaml]\n\nJOB is jobs/ID or ID. Every "
                 "state change the coordinator recorded,\noldest first: when, from and to which "
                 "state, the restart epoch, the\nreason and its message.\n\nflags:\n",
                 kConnectionFlags, kOutputFlags,
                 "\nexit codes: 0 ok, 3 coordinator unreachable, 4 no such job"),
    Events,
});

RECFLEET_REGISTER_COMMAND({
    "workers",
    "List the registered workers: GPUs, topology, state, job, lease",
    absl::StrCat("usage: recfleet workers [-o table|json|yaml]\n\nEvery worker with a live "
                 "lease: its GPUs, where it sits (node, NVLink\ndomain, zone), whether it is "
                 "IDLE or ASSIGNED (job, first rank), the task\nit last reported and the time "
                 "left on its lease.\n\nflags:\n",
                 kConnectionFlags, kOutputFlags, "\nexit codes: 0 ok, 3 coordinator unreachable"),
    Workers,
});

RECFLEET_REGISTER_COMMAND({
    "watch",
    "Follow a job's state changes (and progress) until it ends",
    absl::StrCat("usage: recfleet watch JOB [--progress]\n\nPrints one line per state change "
                 "(JSON lines with --json)\nuntil the job ends, reconnecting (with backoff) when "
                 "the coordinator\nrestarts.\n\nflags:\n",
                 kConnectionFlags, kJsonFlag,
                 "  --progress               also print progress updates\n"
                 "\nexit codes: 0 the job SUCCEEDED, 1 it FAILED or was CANCELLED,\n"
                 "3 coordinator unreachable, 4 no such job"),
    WatchCommand,
});

}  // namespace
}  // namespace recfleet::cli
