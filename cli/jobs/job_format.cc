#include "cli/jobs/job_format.h"

#include <algorithm>

#include "yaml-cpp/yaml.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"

namespace recfleet::cli {
namespace {

using ::recfleet::v1::Job;
using ::recfleet::v1::JobProgress;
using ::recfleet::v1::JobStatus;
using ::recfleet::v1::WatchJobResponse;

std::string Time(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                          absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos()),
                          absl::UTCTimeZone());
}

std::string StepText(const Job& job) {
  return absl::StrCat(job.status().progress().step(), "/", job.spec().training().steps());
}

std::string ProgressLine(const Job& job) {
  const JobProgress& p = job.status().progress();
  return absl::StrFormat("step %s, %d samples, loss %.4f, %.1f samples/s", StepText(job),
                         p.samples(), p.loss(), p.samples_per_second());
}

std::string Reason(const JobStatus& s) {
  if (s.message().empty()) return s.reason();
  return absl::StrCat(s.reason(), ": ", s.message());
}

// Columns padded to their widest cell plus two spaces; the first row is the
// header. Cells hold no spaces where a column tool must split them.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

}  // namespace

std::string FormatJobTable(const std::vector<Job>& jobs) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "DISPLAY_NAME", "STATE", "STEP", "WORKERS", "CREATED", "REASON"}};
  for (const Job& j : jobs) {
    rows.push_back({j.name(), OrDash(j.spec().display_name()),
                    JobStatus::State_Name(j.status().state()), StepText(j),
                    absl::StrCat(j.spec().resources().workers()), Time(j.status().create_time()),
                    j.status().reason()});
  }
  return FormatTable(rows);
}

std::string FormatEventTable(const std::vector<::recfleet::v1::JobTransition>& events) {
  std::vector<std::vector<std::string>> rows = {
      {"TIME", "FROM", "TO", "EPOCH", "REASON", "MESSAGE"}};
  for (const auto& e : events) {
    rows.push_back({Time(e.time()),
                    e.from() == JobStatus::STATE_UNSPECIFIED ? "-" : JobStatus::State_Name(e.from()),
                    JobStatus::State_Name(e.to()), absl::StrCat(e.restart_epoch()),
                    OrDash(e.reason()), OrDash(e.message())});
  }
  return FormatTable(rows);
}

std::string FormatWorkerTable(const std::vector<::recfleet::v1::WorkerInfo>& workers,
                              absl::Time now) {
  using ::recfleet::v1::TaskStatus;
  using ::recfleet::v1::WorkerInfo;
  std::vector<std::vector<std::string>> rows = {{"WORKER", "HOST", "GPUS", "NODE", "NVLINK", "ZONE",
                                                 "STATE", "JOB", "RANK", "TASK", "LEASE_LEFT"}};
  for (const WorkerInfo& w : workers) {
    // "8xH200": the count and the model of the first GPU, without spaces.
    std::string gpus = "cpu";
    if (w.gpus_size() > 0) {
      std::string model = w.gpus(0).name();
      if (absl::StartsWith(model, "NVIDIA ")) model = model.substr(7);
      absl::StrReplaceAll({{" ", "-"}}, &model);
      gpus = absl::StrCat(w.gpus_size(), "x", model.empty() ? "gpu" : model);
    }
    const bool assigned = w.state() == WorkerInfo::ASSIGNED;
    std::string task = "-";
    if (w.task().phase() != TaskStatus::PHASE_UNSPECIFIED) {
      task = TaskStatus::Phase_Name(w.task().phase());
    }
    const absl::Time expiry = absl::FromUnixSeconds(w.lease_expire_time().seconds()) +
                              absl::Nanoseconds(w.lease_expire_time().nanos());
    rows.push_back({w.worker_id(), w.host(), gpus, OrDash(w.topology().node()),
                    OrDash(w.topology().nvlink_domain()), OrDash(w.topology().zone()),
                    assigned ? "ASSIGNED" : "IDLE", assigned ? w.job() : "-",
                    assigned ? absl::StrCat(w.rank()) : "-", task,
                    absl::StrFormat("%.1fs", absl::ToDoubleSeconds(std::max(
                                                 expiry - now, absl::ZeroDuration())))});
  }
  return FormatTable(rows);
}

std::string FormatJobDetail(const Job& job) {
  const JobStatus& s = job.status();
  const auto& res = job.spec().resources();
  std::vector<std::pair<std::string, std::string>> lines = {
      {"name", job.name()},
      {"display name", job.spec().display_name().empty() ? "-" : job.spec().display_name()},
      {"state", absl::StrCat(JobStatus::State_Name(s.state()), " (", Reason(s), ")")},
      {"restart epoch", absl::StrCat(s.restart_epoch())},
      {"resources", absl::StrCat(res.workers(), " worker(s) x ",
                                 res.gpus_per_worker() == 0 ? std::string("CPU")
                                                            : absl::StrCat(res.gpus_per_worker(), " GPU"))},
      {"workers", s.workers().empty() ? "-" : absl::StrJoin(s.workers(), ", ")},
      {"plan", s.plan_summary().empty() ? "-" : s.plan_summary()},
      {"dataset", job.spec().data().dataset()},
      {"created", Time(s.create_time())},
      {"started", Time(s.start_time())},
      {"ended", Time(s.end_time())},
      {"progress", ProgressLine(job)},
  };
  const JobProgress& p = s.progress();
  if (p.step_seconds() > 0) {
    lines.push_back(
        {"step time", absl::StrFormat("%.3f s (data wait %.3f, compute %.3f, comm %.3f); slowest "
                                      "rank %d, straggler gap %.1f%%",
                                      p.step_seconds(), p.data_wait_seconds(), p.compute_seconds(),
                                      p.comm_seconds(), p.slowest_rank(), 100 * p.straggler_gap())});
  }
  // The plan's prediction beside what the ranks measured.
  auto versus = [](double predicted, double measured, double unit, const char* unit_name) {
    std::string out = predicted > 0 ? absl::StrFormat("predicted %.1f %s", predicted / unit, unit_name)
                                    : std::string("predicted -");
    if (measured > 0) {
      absl::StrAppend(&out, absl::StrFormat(", measured %.1f %s", measured / unit, unit_name));
      if (predicted > 0) absl::StrAppend(&out, absl::StrFormat(" (error %+.1f%%)", 100 * (predicted / measured - 1)));
    }
    return out;
  };
  if (s.predicted_step_seconds() > 0 || p.step_seconds() > 0) {
    lines.push_back({"step vs plan", versus(s.predicted_step_seconds(), p.step_seconds(), 1e-3, "ms")});
  }
  if (s.predicted_peak_memory_bytes() > 0 || p.peak_memory_bytes() > 0) {
    // MiB below a GiB, where a CPU rank's peak lies.
    const bool gib = std::max(s.predicted_peak_memory_bytes(), p.peak_memory_bytes()) >= int64_t{1} << 30;
    lines.push_back({"memory vs plan",
                     versus(static_cast<double>(s.predicted_peak_memory_bytes()),
                            static_cast<double>(p.peak_memory_bytes()), gib ? 1 << 30 : 1 << 20,
                            gib ? "GiB peak per rank" : "MiB peak per rank")});
  }
  if (p.eval_step() > 0) {
    lines.push_back({"eval", absl::StrFormat("step %d: AUC %.4f, NE %.4f", p.eval_step(),
                                             p.eval_auc(), p.eval_ne())});
  }
  std::string out;
  for (const auto& [k, v] : lines) absl::StrAppend(&out, absl::StrFormat("%-14s %s\n", k + ":", v));
  return out;
}

std::string FormatWatchEvent(const WatchJobResponse& event) {
  const Job& job = event.job();
  switch (event.kind()) {
    case WatchJobResponse::STATE_CHANGE:
      return absl::StrFormat("%s  %-10s  %s", Time(event.transition().time()),
                             JobStatus::State_Name(event.transition().to()),
                             event.transition().message().empty()
                                 ? event.transition().reason()
                                 : absl::StrCat(event.transition().reason(), ": ",
                                                event.transition().message()));
    case WatchJobResponse::PROGRESS:
      return absl::StrFormat("%s  %-10s  %s, straggler gap %.1f%%",
                             Time(job.status().progress().update_time()), "progress",
                             ProgressLine(job), 100 * job.status().progress().straggler_gap());
    default:
      return absl::StrFormat("%s  %-10s  %s (%s)", Time(job.status().update_time()),
                             JobStatus::State_Name(job.status().state()), job.name(),
                             Reason(job.status()));
  }
}

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = pretty;
  std::string out;
  // Printing a well-formed message to JSON cannot fail.
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

namespace {

// Loaded JSON keeps the flow style of its braces; people read blocks.
void ToBlockStyle(YAML::Node node) {
  if (!node.IsMap() && !node.IsSequence()) return;
  node.SetStyle(YAML::EmitterStyle::Block);
  if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) ToBlockStyle(it->second);
  } else {
    for (auto it = node.begin(); it != node.end(); ++it) ToBlockStyle(*it);
  }
}

}  // namespace

std::string ToYaml(const google::protobuf::Message& message) {
  // JSON is YAML: load the canonical JSON and emit it in block style.
  YAML::Node node = YAML::Load(ToJson(message, false));
  ToBlockStyle(node);
  YAML::Emitter out;
  out << node;
  return std::string(out.c_str()) + "\n";
}

absl::StatusOr<std::string> ListFilter(const std::string& filter, const std::string& selector) {
  std::vector<std::string> terms;
  if (!absl::StripAsciiWhitespace(filter).empty()) terms.push_back(filter);
  for (absl::string_view pair : absl::StrSplit(selector, ',', absl::SkipWhitespace())) {
    std::vector<std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    const std::string key(absl::StripAsciiWhitespace(kv[0]));
    if (kv.size() != 2 || key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--selector/-l takes KEY=VALUE[,KEY=VALUE...], got '", pair, "'"));
    }
    std::string value;
    for (char c : absl::StripAsciiWhitespace(kv[1])) {
      if (c == '"' || c == '\\') value.push_back('\\');
      value.push_back(c);
    }
    terms.push_back(absl::StrCat("labels.", key, " = \"", value, "\""));
  }
  return absl::StrJoin(terms, " AND ");
}

}  // namespace recfleet::cli
