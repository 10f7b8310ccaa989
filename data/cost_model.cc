#include "data/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace recfleet::data {

absl::StatusOr<CostModel> CostModel::Parse(absl::string_view spec) {
  CostModel m;
  m.linear = 0;
  if (spec == "linear") {
    m.linear = 1;
    return m;
  }
  if (spec == "quadratic") {
    m.quadratic = 1;
    return m;
  }
  if (spec == "windowed") {
    m.windowed = 1;
    return m;
  }
  if (spec == "block") {
    m.block = 1;
    return m;
  }
  const std::string expected =
      "expected linear|quadratic|windowed|block or a list like "
      "linear=1,quadratic=0.002,windowed=0,window=1024,block=0,block_size=64,per_sample=0";
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    double v = 0;
    if (!absl::SimpleAtod(kv.second, &v) || !std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost spec '", spec, "': bad value in '", part, "'; ", expected));
    }
    const std::string& k = kv.first;
    if (k == "linear") {
      m.linear = v;
    } else if (k == "quadratic") {
      m.quadratic = v;
    } else if (k == "windowed") {
      m.windowed = v;
    } else if (k == "window" && v >= 1) {
      m.window = static_cast<int64_t>(v);
    } else if (k == "block") {
      m.block = v;
    } else if (k == "block_size" && v >= 1) {
      m.block_size = static_cast<int64_t>(v);
    } else if (k == "per_sample") {
      m.per_sample = v;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("cost spec '", spec, "': unknown term '", k, "'; ", expected));
    }
  }
  if (m.linear + m.quadratic + m.windowed + m.block + m.per_sample <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost spec '", spec, "' gives every sample cost 0; ", expected));
  }
  return m;
}

std::string CostModel::ToString() const {
  return absl::StrCat("linear=", linear, ",quadratic=", quadratic, ",windowed=", windowed,
                      ",window=", window, ",block=", block, ",block_size=", block_size,
                      ",per_sample=", per_sample);
}

namespace {

// Solves the n x n system a x = b (n <= 3) by Gaussian elimination with
// partial pivoting; false when it is singular.
bool Solve(double a[3][3], double b[3], int n, double x[3]) {
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    for (int r = col + 1; r < n; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    }
    if (std::fabs(a[pivot][col]) < 1e-12) return false;
    std::swap(a[col], a[pivot]);
    std::swap(b[col], b[pivot]);
    for (int r = col + 1; r < n; ++r) {
      const double f = a[r][col] / a[col][col];
      for (int c = col; c < n; ++c) a[r][c] -= f * a[col][c];
      b[r] -= f * b[col];
    }
  }
  for (int r = n - 1; r >= 0; --r) {
    double v = b[r];
    for (int c = r + 1; c < n; ++c) v -= a[r][c] * x[c];
    x[r] = v / a[r][r];
  }
  return true;
}

}  // namespace

absl::StatusOr<CostModel> FitCostModelToBatches(const std::vector<BatchTime>& batches) {
  std::set<int64_t> lengths;
  for (const BatchTime& b : batches) {
    if (b.lengths.empty() || !(b.seconds > 0) || !std::isfinite(b.seconds)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration: a batch of ", b.lengths.size(), " samples has time ", b.seconds,
          "; need non-empty batches and times > 0"));
    }
    for (int64_t l : b.lengths) {
      if (l < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("calibration: length ", l, " in a timed batch; need lengths >= 0"));
      }
      lengths.insert(l);
    }
  }
  if (lengths.size() < 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration: need measurements at 3 or more distinct lengths, got ", lengths.size()));
  }
  // Per batch, the three terms (samples, sum L, sum L^2), each scaled by
  // its largest value so the normal equations stay well conditioned; the
  // weights are scaled back at the end.
  std::vector<std::array<double, 3>> terms(batches.size(), {0, 0, 0});
  double scale[3] = {0, 0, 0};
  for (size_t i = 0; i < batches.size(); ++i) {
    for (int64_t length : batches[i].lengths) {
      const double l = static_cast<double>(length);
      terms[i][0] += 1;
      terms[i][1] += l;
      terms[i][2] += l * l;
    }
    for (int t = 0; t < 3; ++t) scale[t] = std::max(scale[t], terms[i][t]);
  }
  for (auto& row : terms) {
    for (int t = 0; t < 3; ++t) row[t] = scale[t] > 0 ? row[t] / scale[t] : 0;
  }
  double best_error = std::numeric_limits<double>::infinity();
  double best[3] = {0, 0, 0};
  for (int subset = 1; subset < 8; ++subset) {
    int in[3], n = 0;
    for (int t = 0; t < 3; ++t) {
      if (subset & (1 << t)) in[n++] = t;
    }
    double a[3][3] = {}, b[3] = {}, x[3] = {};
    for (size_t k = 0; k < batches.size(); ++k) {
      const double s = batches[k].seconds;
      const double w = 1.0 / (s * s);  // Relative error.
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) a[i][j] += w * terms[k][in[i]] * terms[k][in[j]];
        b[i] += w * terms[k][in[i]] * s;
      }
    }
    if (!Solve(a, b, n, x)) continue;
    bool feasible = true;
    for (int i = 0; i < n; ++i) feasible &= x[i] >= 0;
    if (!feasible) continue;
    double error = 0;
    for (size_t k = 0; k < batches.size(); ++k) {
      const double s = batches[k].seconds;
      double predicted = 0;
      for (int i = 0; i < n; ++i) predicted += x[i] * terms[k][in[i]];
      error += (predicted - s) * (predicted - s) / (s * s);
    }
    if (error < best_error) {
      best_error = error;
      for (int t = 0; t < 3; ++t) best[t] = 0;
      for (int i = 0; i < n; ++i) best[in[i]] = x[i];
    }
  }
  if (!std::isfinite(best_error)) {
    return absl::InvalidArgumentError("calibration: no non-negative fit of the measurements");
  }
  CostModel m;
  m.per_sample = scale[0] > 0 ? best[0] / scale[0] : 0;
  m.linear = scale[1] > 0 ? best[1] / scale[1] : 0;
  m.quadratic = scale[2] > 0 ? best[2] / scale[2] : 0;
  return m;
}

absl::StatusOr<CostModel> FitCostModel(const std::vector<CostMeasurement>& measurements) {
  std::vector<BatchTime> batches;
  batches.reserve(measurements.size());
  for (const CostMeasurement& m : measurements) batches.push_back({{m.length}, m.seconds});
  return FitCostModelToBatches(batches);
}

}  // namespace recfleet::data
