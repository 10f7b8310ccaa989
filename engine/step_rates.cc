#include "engine/step_rates.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "yaml-cpp/yaml.h"

namespace recfleet::engine {
namespace {

constexpr int kTimeTerms = 6;
constexpr int kMemoryTerms = 3;

// The regressors of the time model, in StepRates' order.
std::vector<double> TimeTerms(const StepCounts& c) {
  return {3.0 * c.LinearFlops(), 3.5 * c.AttentionFlops(), c.token_elements, c.dense_elements,
          static_cast<double>(c.DenseParams()), 1.0};
}

std::vector<double> MemoryTerms(const StepCounts& c) {
  return {c.token_elements, c.dense_elements, 1.0};
}

// Non-negative least squares of the relative error:
// min sum_i ((x_i . w) / y_i - 1)^2 over w >= 0, by cyclic coordinate
// descent on unit-norm columns (a handful of unknowns, tens of rows).
std::vector<double> FitRelative(const std::vector<std::vector<double>>& x, const std::vector<double>& y) {
  const size_t n = x.size(), k = x.front().size();
  std::vector<std::vector<double>> z(n, std::vector<double>(k));
  std::vector<double> scale(k, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < k; ++j) {
      z[i][j] = x[i][j] / y[i];
      scale[j] += z[i][j] * z[i][j];
    }
  }
  for (size_t j = 0; j < k; ++j) {
    scale[j] = scale[j] > 0 ? 1 / std::sqrt(scale[j]) : 0;
    for (size_t i = 0; i < n; ++i) z[i][j] *= scale[j];
  }
  std::vector<double> u(k, 0), r(n, -1.0);  // r = z u - 1.
  for (int sweep = 0; sweep < 20000; ++sweep) {
    double moved = 0;
    for (size_t j = 0; j < k; ++j) {
      if (scale[j] == 0) continue;
      double g = 0;
      for (size_t i = 0; i < n; ++i) g += z[i][j] * r[i];
      const double next = std::max(0.0, u[j] - g);  // Columns have unit norm.
      const double delta = next - u[j];
      if (delta == 0) continue;
      for (size_t i = 0; i < n; ++i) r[i] += z[i][j] * delta;
      u[j] = next;
      moved = std::max(moved, std::fabs(delta));
    }
    if (moved < 1e-12) break;
  }
  for (size_t j = 0; j < k; ++j) u[j] *= scale[j];
  return u;
}

double Inverse(double seconds_per_unit) { return seconds_per_unit > 0 ? 1 / seconds_per_unit : 0; }

}  // namespace

double StaticBytes(const StepCounts& c) {
  return 16.0 * static_cast<double>(c.DenseParams()) +
         4.0 * static_cast<double>(c.table_rows) * static_cast<double>(c.dim + 1);
}

StepPrediction PredictStep(const StepCounts& c, const StepRates& r) {
  StepPrediction p;
  auto per = [](double work, double rate) { return rate > 0 ? work / rate : 0; };
  p.gemm_s = per(3.0 * c.LinearFlops(), r.gemm_flops_per_s);
  p.attention_s = per(3.5 * c.AttentionFlops(), r.attention_flops_per_s);
  p.elementwise_s =
      c.token_elements * r.seconds_per_token_element + c.dense_elements * r.seconds_per_dense_element;
  p.optimizer_s = static_cast<double>(c.DenseParams()) * r.seconds_per_param;
  p.fixed_s = r.seconds_per_step;
  p.seconds = p.gemm_s + p.attention_s + p.elementwise_s + p.optimizer_s + p.fixed_s;
  p.static_bytes = StaticBytes(c);
  p.activation_bytes =
      c.token_elements * r.bytes_per_token_element + c.dense_elements * r.bytes_per_dense_element;
  p.peak_bytes = p.static_bytes + p.activation_bytes + r.fixed_bytes;
  return p;
}

absl::StatusOr<StepRates> FitStepRates(const std::vector<ProbeStep>& probes, StepRates rates) {
  if (static_cast<int>(probes.size()) < kTimeTerms) {
    return absl::InvalidArgumentError(absl::StrCat("step rates: need at least ", kTimeTerms,
                                                   " probe steps, got ", probes.size()));
  }
  std::vector<std::vector<double>> x, xm;
  std::vector<double> y, ym;
  for (const ProbeStep& p : probes) {
    if (!(p.seconds > 0)) return absl::InvalidArgumentError("step rates: a probe step has no time");
    x.push_back(TimeTerms(p.counts));
    y.push_back(p.seconds);
    const double activations = p.peak_bytes - StaticBytes(p.counts);
    if (p.peak_bytes > 0 && activations > 0) {
      xm.push_back(MemoryTerms(p.counts));
      ym.push_back(activations);
    }
  }
  const std::vector<double> t = FitRelative(x, y);
  rates.gemm_flops_per_s = Inverse(t[0]);
  rates.attention_flops_per_s = Inverse(t[1]);
  rates.seconds_per_token_element = t[2];
  rates.seconds_per_dense_element = t[3];
  rates.seconds_per_param = t[4];
  rates.seconds_per_step = t[5];
  rates.bytes_per_token_element = rates.bytes_per_dense_element = rates.fixed_bytes = 0;
  if (static_cast<int>(xm.size()) >= kMemoryTerms) {
    const std::vector<double> m = FitRelative(xm, ym);
    rates.bytes_per_token_element = m[0];
    rates.bytes_per_dense_element = m[1];
    rates.fixed_bytes = m[2];
  }
  rates.probes = static_cast<int>(probes.size());
  rates.time_fit_error = rates.memory_fit_error = 0;
  for (const ProbeStep& p : probes) {
    const StepPrediction pred = PredictStep(p.counts, rates);
    rates.time_fit_error = std::max(rates.time_fit_error, std::fabs(pred.seconds / p.seconds - 1));
    if (!xm.empty() && p.peak_bytes > 0) {
      rates.memory_fit_error =
          std::max(rates.memory_fit_error, std::fabs(pred.peak_bytes / p.peak_bytes - 1));
    }
  }
  return rates;
}

namespace {

// Key, value pairs in file order: the description, then the coefficients.
struct Field {
  const char* key;
  double StepRates::*number;
};
constexpr Field kNumbers[] = {
    {"gemm_flops_per_s", &StepRates::gemm_flops_per_s},
    {"attention_flops_per_s", &StepRates::attention_flops_per_s},
    {"seconds_per_token_element", &StepRates::seconds_per_token_element},
    {"seconds_per_dense_element", &StepRates::seconds_per_dense_element},
    {"seconds_per_param", &StepRates::seconds_per_param},
    {"seconds_per_step", &StepRates::seconds_per_step},
    {"bytes_per_token_element", &StepRates::bytes_per_token_element},
    {"bytes_per_dense_element", &StepRates::bytes_per_dense_element},
    {"fixed_bytes", &StepRates::fixed_bytes},
    {"time_fit_error", &StepRates::time_fit_error},
    {"memory_fit_error", &StepRates::memory_fit_error},
};

}  // namespace

std::string StepRatesToYaml(const StepRates& r) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "version" << YAML::Value << r.version;
  out << YAML::Key << "device" << YAML::Value << r.device;
  out << YAML::Key << "precision" << YAML::Value << r.precision;
  out << YAML::Key << "machine" << YAML::Value << r.machine;
  out << YAML::Key << "date" << YAML::Value << r.date;
  out << YAML::Key << "command" << YAML::Value << r.command;
  out << YAML::Key << "probes" << YAML::Value << r.probes;
  out << YAML::DoublePrecision(6);
  for (const Field& f : kNumbers) out << YAML::Key << f.key << YAML::Value << r.*(f.number);
  if (r.rank_sync_ranks > 0) {
    out << YAML::Key << "rank_sync_ranks" << YAML::Value << r.rank_sync_ranks;
    out << YAML::Key << "rank_sync_overhead" << YAML::Value << r.rank_sync_overhead;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

absl::StatusOr<StepRates> StepRatesFromYaml(const std::string& text) {
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("step rates: not YAML: ", e.what()));
  }
  if (!node.IsMap()) return absl::InvalidArgumentError("step rates: expected a map of key: value");
  StepRates r;
  try {
    if (!node["version"] || node["version"].as<int>() != kStepRatesVersion) {
      return absl::InvalidArgumentError(absl::StrCat("step rates: version must be ", kStepRatesVersion,
                                                     " (re-measure with `recfleet data calibrate --rates`)"));
    }
    r.device = node["device"].as<std::string>("");
    r.precision = node["precision"].as<std::string>("");
    r.machine = node["machine"].as<std::string>("");
    r.date = node["date"].as<std::string>("");
    r.command = node["command"].as<std::string>("");
    r.probes = node["probes"].as<int>(0);
    for (const Field& f : kNumbers) {
      if (!node[f.key]) return absl::InvalidArgumentError(absl::StrCat("step rates: missing ", f.key));
      r.*(f.number) = node[f.key].as<double>();
    }
    // Optional: tables measured before the synchronous-rank probe lack it.
    r.rank_sync_ranks = node["rank_sync_ranks"].as<int>(0);
    r.rank_sync_overhead = node["rank_sync_overhead"].as<double>(0);
    if (r.rank_sync_ranks < 0 || r.rank_sync_overhead < 0) {
      return absl::InvalidArgumentError("step rates: rank_sync_ranks and rank_sync_overhead must be >= 0");
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("step rates: bad value: ", e.what()));
  }
  if (r.device != "cuda" && r.device != "cpu") {
    return absl::InvalidArgumentError("step rates: device must be cuda or cpu, got '" + r.device + "'");
  }
  return r;
}

absl::StatusOr<StepRates> ReadStepRates(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("step rates: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<StepRates> r = StepRatesFromYaml(text.str());
  if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", r.status().message()));
  return r;
}

}  // namespace recfleet::engine
