#ifndef RECFLEET_SERVICES_COORDINATOR_STATUS_PAGE_H_
#define RECFLEET_SERVICES_COORDINATOR_STATUS_PAGE_H_

// The coordinator's read-only status page (GET /status on its metrics
// address): every job with its state, progress and plan, and per job the
// curves of loss, eval AUC, samples/s and straggler gap over its steps,
// drawn as inline SVG. One self-contained HTML document (no scripts, no
// external resources), for operators without Grafana at hand.
//
// Everything a user wrote (names, labels, messages) is HTML-escaped: a
// hostile display name renders as text. Pure functions and a small value
// class; thread-compatible.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "recfleet/v1/job.pb.h"

namespace recfleet::coordinator {

// One progress report as the page draws it.
struct ProgressPoint {
  int64_t step = 0;
  double loss = 0;
  int64_t eval_step = 0;  // 0: no evaluation yet
  double eval_auc = 0;
  double samples_per_second = 0;
  double straggler_gap = 0;
};

// A job's progress over its run, bounded: past kMaxPoints, every other
// point is dropped, so a long run keeps its whole shape at half the
// resolution (memory stays O(kMaxPoints) per job).
class ProgressHistory {
 public:
  static constexpr size_t kMaxPoints = 512;

  // Appends `p` when its step is past the last one's (repeated reports of a
  // step replace it).
  void Add(const ::recfleet::v1::JobProgress& p);
  const std::vector<ProgressPoint>& points() const { return points_; }

 private:
  std::vector<ProgressPoint> points_;
};

// The page for `jobs` (newest first) with the histories by job name.
std::string RenderStatusPage(const std::vector<::recfleet::v1::Job>& jobs,
                             const std::map<std::string, ProgressHistory>& history,
                             absl::Time now);

// `text` with &, <, >, " and ' as character references.
std::string HtmlEscape(const std::string& text);

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_STATUS_PAGE_H_
