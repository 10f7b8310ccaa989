#include "cli/jobs/job_format.h"

#include "yaml-cpp/yaml.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
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

}  // namespace

std::string FormatJobTable(const std::vector<Job>& jobs) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "DISPLAY_NAME", "STATE", "STEP", "WORKERS", "CREATED", "REASON"}};
  for (const Job& j : jobs) {
    rows.push_back({j.name(), j.spec().display_name().empty() ? "-" : j.spec().display_name(),
                    JobStatus::State_Name(j.status().state()), StepText(j),
                    absl::StrCat(j.spec().resources().workers()), Time(j.status().create_time()),
                    j.status().reason()});
  }
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
