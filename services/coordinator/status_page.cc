#include "services/coordinator/status_page.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::Job;
using ::recfleet::v1::JobStatus;

constexpr int kChartWidth = 320, kChartHeight = 120, kPad = 30;

// A line chart of (x, y) pairs with the y range and the last value written
// beside it; "no data" when there are fewer than one point.
std::string LineChart(const std::string& title,
                      const std::vector<std::pair<double, double>>& xy, const char* y_format) {
  std::string svg = absl::StrFormat(
      "<figure class=\"chart\"><figcaption>%s</figcaption>"
      "<svg width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"%s\">"
      "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" stroke=\"#ccc\"/>",
      HtmlEscape(title), kChartWidth, kChartHeight, kChartWidth, kChartHeight, HtmlEscape(title),
      kChartWidth, kChartHeight);
  std::vector<std::pair<double, double>> pts;
  for (const auto& p : xy) {
    if (std::isfinite(p.first) && std::isfinite(p.second)) pts.push_back(p);
  }
  if (pts.empty()) {
    absl::StrAppendFormat(&svg,
                          "<text x=\"%d\" y=\"%d\" font-size=\"12\" fill=\"#888\">no data yet</text>"
                          "</svg></figure>",
                          kPad, kChartHeight / 2);
    return svg;
  }
  double x0 = pts.front().first, x1 = pts.back().first, y0 = pts[0].second, y1 = pts[0].second;
  for (const auto& p : pts) y0 = std::min(y0, p.second), y1 = std::max(y1, p.second);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + (y0 == 0 ? 1 : std::abs(y0) * 0.1);
  const double w = kChartWidth - 2 * kPad, h = kChartHeight - 2 * 12;
  std::vector<std::string> coords;
  for (const auto& [x, y] : pts) {
    coords.push_back(absl::StrFormat("%.1f,%.1f", kPad + (x - x0) / (x1 - x0) * w,
                                     12 + (1 - (y - y0) / (y1 - y0)) * h));
  }
  absl::StrAppendFormat(
      &svg,
      "<polyline fill=\"none\" stroke=\"#3465a4\" stroke-width=\"1.5\" points=\"%s\"/>"
      "<text x=\"2\" y=\"14\" font-size=\"10\">%s</text>"
      "<text x=\"2\" y=\"%d\" font-size=\"10\">%s</text>"
      "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"end\">step %.0f</text>"
      "<text x=\"%d\" y=\"14\" font-size=\"11\" text-anchor=\"end\" class=\"last\">%s</text>"
      "</svg></figure>",
      absl::StrJoin(coords, " "), absl::StrFormat(y_format, y1), kChartHeight - 4,
      absl::StrFormat(y_format, y0), kChartWidth - 2, kChartHeight - 2, x1, kChartWidth - 2,
      absl::StrFormat(y_format, pts.back().second));
  return svg;
}

std::string Cell(const std::string& text) { return absl::StrCat("<td>", HtmlEscape(text), "</td>"); }

std::string Time(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0) return "";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixSeconds(t.seconds()),
                          absl::UTCTimeZone());
}

}  // namespace

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

void ProgressHistory::Add(const ::recfleet::v1::JobProgress& p) {
  ProgressPoint point;
  point.step = p.step();
  point.loss = p.loss();
  point.eval_step = p.eval_step();
  point.eval_auc = p.eval_auc();
  point.samples_per_second = p.samples_per_second();
  point.straggler_gap = p.straggler_gap();
  if (!points_.empty() && point.step <= points_.back().step) {
    if (point.step == points_.back().step) points_.back() = point;
    return;
  }
  points_.push_back(point);
  if (points_.size() > kMaxPoints) {
    // Keep every other point (the newest always stays).
    std::vector<ProgressPoint> kept;
    kept.reserve(kMaxPoints / 2 + 1);
    for (size_t i = points_.size() % 2 == 0 ? 1 : 0; i < points_.size(); i += 2) {
      kept.push_back(points_[i]);
    }
    points_ = std::move(kept);
  }
}

std::string RenderStatusPage(const std::vector<Job>& jobs,
                             const std::map<std::string, ProgressHistory>& history,
                             absl::Time now) {
  std::map<std::string, int> by_state;
  for (const Job& j : jobs) ++by_state[JobStatus::State_Name(j.status().state())];
  std::string counts;
  for (const auto& [state, n] : by_state) absl::StrAppend(&counts, counts.empty() ? "" : ", ", n, " ", state);

  std::string html = absl::StrCat(
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<title>recfleet coordinator</title><style>"
      "body{font-family:sans-serif;margin:16px;color:#222}"
      "table{border-collapse:collapse;font-size:13px}"
      "td,th{border:1px solid #ddd;padding:3px 6px;text-align:left}"
      "th{background:#f0f0f0}.job{margin-top:18px;border-top:2px solid #3465a4}"
      ".charts{display:flex;flex-wrap:wrap;gap:12px}.chart{margin:0}"
      "figcaption{font-size:12px;color:#555}.plan{font-family:monospace;font-size:12px}"
      "</style></head><body>",
      "<h1>recfleet coordinator</h1><p id=\"summary\">",
      jobs.size(), " job", jobs.size() == 1 ? "" : "s", counts.empty() ? "" : ": ",
      HtmlEscape(counts), " &middot; ",
      HtmlEscape(absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", now, absl::UTCTimeZone())),
      "</p>");
  if (jobs.empty()) {
    absl::StrAppend(&html, "<p>No jobs. Submit one with <code>recfleet submit JOB.yaml</code>.</p>");
  } else {
    absl::StrAppend(&html,
                    "<table id=\"jobs\"><tr><th>job</th><th>name</th><th>state</th><th>step</th>"
                    "<th>samples</th><th>samples/s</th><th>loss</th><th>eval AUC</th>"
                    "<th>eval NE</th><th>straggler gap</th><th>workers</th><th>created</th></tr>");
    for (const Job& j : jobs) {
      const JobStatus& st = j.status();
      const auto& p = st.progress();
      const bool evaluated = p.eval_step() > 0;
      absl::StrAppend(
          &html, "<tr>", Cell(j.name()), Cell(j.spec().display_name()),
          Cell(absl::StrCat(JobStatus::State_Name(st.state()),
                            st.reason().empty() ? "" : absl::StrCat(" (", st.reason(), ")"))),
          Cell(absl::StrCat(p.step())), Cell(absl::StrCat(p.samples())),
          Cell(absl::StrFormat("%.1f", p.samples_per_second())),
          Cell(absl::StrFormat("%.4f", p.loss())),
          Cell(evaluated ? absl::StrFormat("%.4f", p.eval_auc()) : "-"),
          Cell(evaluated ? absl::StrFormat("%.4f", p.eval_ne()) : "-"),
          Cell(absl::StrFormat("%.1f%%", 100 * p.straggler_gap())),
          Cell(absl::StrCat(st.workers_size())), Cell(Time(st.create_time())), "</tr>");
    }
    absl::StrAppend(&html, "</table>");
  }
  for (const Job& j : jobs) {
    const JobStatus& st = j.status();
    absl::StrAppend(&html, "<section class=\"job\"><h2>", HtmlEscape(j.name()), " ",
                    HtmlEscape(j.spec().display_name()), "</h2><p>",
                    HtmlEscape(JobStatus::State_Name(st.state())), " &middot; ",
                    HtmlEscape(st.reason()), st.message().empty() ? "" : ": ",
                    HtmlEscape(st.message()), "</p>");
    if (!st.plan_summary().empty()) {
      absl::StrAppend(&html, "<p class=\"plan\">plan: ", HtmlEscape(st.plan_summary()), "</p>");
    }
    if (!j.spec().labels().empty()) {
      std::vector<std::string> labels;
      for (const auto& [k, v] : j.spec().labels()) labels.push_back(absl::StrCat(k, "=", v));
      std::sort(labels.begin(), labels.end());
      absl::StrAppend(&html, "<p>labels: ", HtmlEscape(absl::StrJoin(labels, ", ")), "</p>");
    }
    auto it = history.find(j.name());
    if (it == history.end() || it->second.points().empty()) {
      absl::StrAppend(&html, "<p>No progress reported yet.</p></section>");
      continue;
    }
    const std::vector<ProgressPoint>& pts = it->second.points();
    auto series = [&](const std::function<bool(const ProgressPoint&)>& keep,
                      const std::function<double(const ProgressPoint&)>& y) {
      std::vector<std::pair<double, double>> xy;
      for (const ProgressPoint& p : pts) {
        if (keep(p)) xy.emplace_back(static_cast<double>(p.step), y(p));
      }
      return xy;
    };
    auto all = [](const ProgressPoint&) { return true; };
    absl::StrAppend(
        &html, "<div class=\"charts\">",
        LineChart("training loss", series(all, [](const ProgressPoint& p) { return p.loss; }), "%.4f"),
        LineChart("eval AUC",
                  series([](const ProgressPoint& p) { return p.eval_step > 0; },
                         [](const ProgressPoint& p) { return p.eval_auc; }),
                  "%.4f"),
        LineChart("samples/s",
                  series(all, [](const ProgressPoint& p) { return p.samples_per_second; }), "%.0f"),
        LineChart("straggler gap (%)",
                  series(all, [](const ProgressPoint& p) { return 100 * p.straggler_gap; }), "%.1f"),
        "</div></section>");
  }
  absl::StrAppend(&html, "</body></html>\n");
  return html;
}

}  // namespace recfleet::coordinator
