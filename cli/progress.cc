#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace recfleet::cli {
namespace {

constexpr int kBarWidth = 20;
constexpr std::chrono::milliseconds kRedraw(100);

// 950, 12.3k, 4.5M, 1.2G.
std::string Short(double v) {
  if (v < 1e3) return absl::StrFormat("%.0f", v);
  if (v < 1e6) return absl::StrFormat("%.1fk", v / 1e3);
  if (v < 1e9) return absl::StrFormat("%.1fM", v / 1e6);
  return absl::StrFormat("%.1fG", v / 1e9);
}

// 42s, 3m05s, 2h10m.
std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
}

}  // namespace

bool Interactive() { return isatty(STDOUT_FILENO) != 0 && isatty(STDERR_FILENO) != 0; }

Progress::Progress(std::string label, int64_t total, std::string unit, bool enabled)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      enabled_(enabled),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { Finish(); }

std::string Progress::Format(const std::string& label, int64_t done, int64_t total, const std::string& unit,
                             double seconds) {
  const double rate = seconds > 0 ? done / seconds : 0;
  if (total <= 0) {
    return absl::StrFormat("%s  %s %s  %s/s  %s", label, Short(done), unit, Short(rate), Duration(seconds));
  }
  const double fraction = std::clamp(static_cast<double>(done) / total, 0.0, 1.0);
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::string line = absl::StrFormat("%s [%s%s] %3.0f%%  %d/%d %s  %s/s", label, std::string(filled, '#'),
                                     std::string(kBarWidth - filled, '.'), 100 * fraction, done, total, unit,
                                     Short(rate));
  if (done >= total) {
    absl::StrAppend(&line, "  ", Duration(seconds));
  } else if (rate > 0) {
    absl::StrAppend(&line, "  ETA ", Duration((total - done) / rate));
  }
  return line;
}

void Progress::Update(int64_t done) {
  done_ = done;
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < kRedraw) return;
  last_draw_ = now;
  Draw();
}

void Progress::Finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  Draw();
  std::fputc('\n', stderr);
}

void Progress::Draw() {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // \r and "erase to end of line": the line is rewritten in place.
  std::fprintf(stderr, "\r\033[K%s", Format(label_, done_, total_, unit_, seconds).c_str());
  std::fflush(stderr);
}

}  // namespace recfleet::cli
