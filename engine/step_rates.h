#ifndef RECFLEET_ENGINE_STEP_RATES_H_
#define RECFLEET_ENGINE_STEP_RATES_H_

// A rate table: how fast the engine's training step runs on one kind of
// device, measured there (`recfleet data calibrate --rates FILE`), so that
// a step's time and peak memory can be predicted from its counts
// (engine/step_cost.h) for any GEM-lite, before it runs. The table is
// versioned and records the machine, date and command that produced it.
//
// The model, with the counts of StepCounts:
//   seconds = 3 * linear / gemm_flops_per_s
//           + 3.5 * attention / attention_flops_per_s
//           + token_elements * seconds_per_token_element
//           + dense_elements * seconds_per_dense_element
//           + params * seconds_per_param          (AdamW streams them)
//           + seconds_per_step                    (launches, host work)
//   peak    = StaticBytes (fp32 parameters, gradients and AdamW moments:
//             16 bytes a parameter; fp32 tables and rowwise Adagrad:
//             4 * (dim + 1) bytes a row)
//           + token_elements * bytes_per_token_element
//           + dense_elements * bytes_per_dense_element
//           + fixed_bytes                         (workspaces, pool rounding)
// The coefficients are fitted (non-negative least squares on relative
// error) to steps of a family of probe models timed on the device; the
// rates are effective rates of the engine's kernels inside its real step,
// not datasheet peaks.
//
// Pure functions; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/step_cost.h"

namespace recfleet::engine {

inline constexpr int kStepRatesVersion = 1;

struct StepRates {
  int version = kStepRatesVersion;
  std::string device;     // "cuda" or "cpu".
  std::string precision;  // "bf16" or "fp32".
  std::string machine;    // e.g. "NVIDIA H200, driver 580.159.04".
  std::string date;       // UTC, ISO 8601.
  std::string command;    // The command line that measured it.

  double gemm_flops_per_s = 0;
  double attention_flops_per_s = 0;
  double seconds_per_token_element = 0;
  double seconds_per_dense_element = 0;
  double seconds_per_param = 0;
  double seconds_per_step = 0;
  double bytes_per_token_element = 0;
  double bytes_per_dense_element = 0;
  double fixed_bytes = 0;

  // How well the fit matches the probes it was fitted to: largest relative
  // error of time and of peak memory (0 when memory was not measured).
  int probes = 0;
  double time_fit_error = 0;
  double memory_fit_error = 0;

  // Ranks of one host training together (kCpu: Gloo over loopback, one
  // core each): their step, measured with the worker's distributed code,
  // is (1 + rank_sync_overhead) x one rank's step alone. What a single
  // rank's probes cannot see: ranks waiting for the slowest at every
  // collective, the collectives themselves, wake-ups, cores shared by
  // memory and cache. Measured at rank_sync_ranks ranks (0: not measured;
  // optional in the YAML).
  double rank_sync_overhead = 0;
  int rank_sync_ranks = 0;
};

struct StepPrediction {
  double seconds = 0;
  double gemm_s = 0, attention_s = 0, elementwise_s = 0, optimizer_s = 0, fixed_s = 0;
  double peak_bytes = 0;
  double static_bytes = 0, activation_bytes = 0;
};

// Parameters, gradients, AdamW moments and tables with their Adagrad state.
double StaticBytes(const StepCounts& counts);

StepPrediction PredictStep(const StepCounts& counts, const StepRates& rates);

// One probe step as measured on the device.
struct ProbeStep {
  StepCounts counts;
  double seconds = 0;
  // The device pool's peak (kCuda) or the resident growth (kCpu) over the
  // step; 0: not measured.
  double peak_bytes = 0;
};

// Fits the coefficients of `rates` to `probes` (keeps its description
// fields). InvalidArgument with fewer probes than time coefficients (6).
absl::StatusOr<StepRates> FitStepRates(const std::vector<ProbeStep>& probes, StepRates rates);

// The table as YAML (one "key: value" a line, the description first).
std::string StepRatesToYaml(const StepRates& rates);
// InvalidArgument naming the key for a missing or malformed value, or a
// version other than kStepRatesVersion.
absl::StatusOr<StepRates> StepRatesFromYaml(const std::string& text);
// NotFound naming the path when the file cannot be read.
absl::StatusOr<StepRates> ReadStepRates(const std::string& path);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_STEP_RATES_H_
