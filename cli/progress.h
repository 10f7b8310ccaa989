#ifndef RECFLEET_CLI_PROGRESS_H_
#define RECFLEET_CLI_PROGRESS_H_

// Progress of a long `recfleet` command (data synth, data ingest, train
// --local) for a person watching it: one line on stderr, redrawn in place at
// most ten times a second, with the rate and, when the total is known, a bar
// and the time left:
//
//   synth [##########..........]  50%  5000/10000 samples  1.2k/s  ETA 4s
//   ingest: reading  1.3M events  1.1M/s  1.2s
//
// Only when stdout and stderr are both terminals (Interactive()); otherwise
// it prints nothing, so logs, pipes and scripts get the command's own
// summary lines alone. Not thread-safe: one thread updates it.

#include <chrono>
#include <cstdint>
#include <string>

namespace recfleet::cli {

// stdout and stderr are terminals.
bool Interactive();

class Progress {
 public:
  // `total` <= 0: unknown (no bar, no ETA). `unit` names what is counted.
  Progress(std::string label, int64_t total, std::string unit, bool enabled = Interactive());
  ~Progress();  // Finish()es.

  // `done` so far; redraws when 100 ms have passed since the last draw.
  void Update(int64_t done);
  // A new label for the next draws (a phase: "reading", "writing").
  void SetLabel(std::string label) { label_ = std::move(label); }
  // Draws the final state and ends the line; once.
  void Finish();

  // The line drawn for `done` of `total` after `seconds` (no terminal codes).
  static std::string Format(const std::string& label, int64_t done, int64_t total, const std::string& unit,
                            double seconds);

 private:
  void Draw();

  std::string label_;
  const int64_t total_;
  const std::string unit_;
  const bool enabled_;
  int64_t done_ = 0;
  bool finished_ = false;
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace recfleet::cli

#endif  // RECFLEET_CLI_PROGRESS_H_
