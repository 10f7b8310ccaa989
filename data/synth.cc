#include "data/synth.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "data/dataset_file.h"

namespace recfleet::data {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// key=value pairs after "kind:".
absl::StatusOr<std::vector<std::pair<std::string, double>>> ParseParams(absl::string_view spec,
                                                                        absl::string_view s) {
  std::vector<std::pair<std::string, double>> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    double v;
    if (!absl::SimpleAtod(kv.second, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("length spec '", spec, "': bad '", part, "', expected key=number"));
    }
    out.emplace_back(kv.first, v);
  }
  return out;
}

}  // namespace

absl::StatusOr<LengthDistribution> LengthDistribution::Parse(absl::string_view spec) {
  const std::string expected =
      "expected lognormal:mean=M,sigma=S[,min=A,max=B], powerlaw:alpha=X[,min=A,max=B] or fixed:N";
  std::pair<std::string, std::string> kind_rest = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  LengthDistribution d;
  if (kind_rest.first == "fixed") {
    double n;
    if (!absl::SimpleAtod(kind_rest.second, &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("length spec '", spec, "': ", expected));
    }
    d.kind = Kind::kFixed;
    d.min = d.max = static_cast<int64_t>(n);
    d.mean = n;
    return d;
  }
  if (kind_rest.first == "lognormal") {
    d.kind = Kind::kLogNormal;
  } else if (kind_rest.first == "powerlaw") {
    d.kind = Kind::kPowerLaw;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("length spec '", spec, "': ", expected));
  }
  auto params = ParseParams(spec, kind_rest.second);
  if (!params.ok()) return params.status();
  for (const auto& [k, v] : *params) {
    if (k == "mean") {
      d.mean = v;
    } else if (k == "sigma") {
      d.sigma = v;
    } else if (k == "alpha") {
      d.alpha = v;
    } else if (k == "min") {
      d.min = static_cast<int64_t>(v);
    } else if (k == "max") {
      d.max = static_cast<int64_t>(v);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("length spec '", spec, "': unknown key '", k, "'; ", expected));
    }
  }
  if (d.min < (d.kind == Kind::kPowerLaw ? 1 : 0) || d.max < d.min || d.mean <= 0 || d.sigma < 0 ||
      d.alpha <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("length spec '", spec,
                     "': need 0 <= min <= max (min >= 1 for powerlaw), mean > 0, sigma >= 0, "
                     "alpha > 0"));
  }
  return d;
}

int64_t LengthDistribution::Sample(std::mt19937_64& rng) const {
  double l = 0;
  switch (kind) {
    case Kind::kFixed:
      return min;
    case Kind::kLogNormal: {
      // E[L] = exp(mu + sigma^2 / 2) = mean.
      std::lognormal_distribution<double> dist(std::log(mean) - sigma * sigma / 2, sigma);
      l = dist(rng);
      break;
    }
    case Kind::kPowerLaw: {
      // Pareto truncated to [min, max] by inverting its CDF.
      double u = std::uniform_real_distribution<double>(0, 1)(rng);
      double a = std::pow(static_cast<double>(min), -alpha);
      double b = std::pow(static_cast<double>(max), -alpha);
      l = std::pow(a - u * (a - b), -1 / alpha);
      break;
    }
  }
  return std::clamp<int64_t>(std::llround(l), min, max);
}

ZipfSampler::ZipfSampler(uint64_t n, double s) : cdf_(n) {
  double acc = 0;
  for (uint64_t k = 0; k < n; ++k) {
    acc += 1.0 / std::pow(static_cast<double>(k + 1), s);
    cdf_[k] = acc;
  }
  for (double& c : cdf_) c /= acc;
}

uint64_t ZipfSampler::Sample(std::mt19937_64& rng) const {
  double u = std::uniform_real_distribution<double>(0, 1)(rng);
  size_t k = std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
  return std::min<uint64_t>(k, cdf_.size() - 1) + 1;
}

double PlantedModel::ItemEffect(int64_t item) const {
  uint64_t h = SplitMix64(static_cast<uint64_t>(item) ^ (seed * 0xD6E8FEB86659FD93ull));
  return static_cast<double>(h >> 11) / static_cast<double>(1ull << 53) * 2 - 1;
}

double PlantedModel::Logit(const float* dense, int64_t item, const int64_t* history,
                           size_t len) const {
  double z = bias;
  for (size_t j = 0; j < dense_weights.size(); ++j) z += dense_weights[j] * dense[j];
  z += item_weight * ItemEffect(item);
  int64_t cat = (item - 1) % clusters;
  size_t same = 0;
  for (size_t i = 0; i < len; ++i) same += (history[i] - 1) % clusters == cat;
  double share = len > 0 ? static_cast<double>(same) / len : 1.0 / clusters;
  z += affinity_weight * (clusters * share - 1);
  z += length_weight * std::log(std::max<double>(1, len) / 100.0);
  return z;
}

std::string PlantedModel::Serialize() const {
  return absl::StrCat("bias=", bias, ";dense=", absl::StrJoin(dense_weights, ","),
                      ";item=", item_weight, ";affinity=", affinity_weight,
                      ";length=", length_weight, ";clusters=", clusters, ";seed=", seed);
}

absl::StatusOr<PlantedModel> PlantedModel::Parse(absl::string_view text) {
  PlantedModel m;
  bool ok = true;
  for (absl::string_view part : absl::StrSplit(text, ';', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    const std::string& k = kv.first;
    const std::string& v = kv.second;
    if (k == "dense") {
      for (absl::string_view w : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        double x;
        ok &= absl::SimpleAtod(w, &x);
        m.dense_weights.push_back(x);
      }
    } else if (k == "bias") {
      ok &= absl::SimpleAtod(v, &m.bias);
    } else if (k == "item") {
      ok &= absl::SimpleAtod(v, &m.item_weight);
    } else if (k == "affinity") {
      ok &= absl::SimpleAtod(v, &m.affinity_weight);
    } else if (k == "length") {
      ok &= absl::SimpleAtod(v, &m.length_weight);
    } else if (k == "clusters") {
      ok &= absl::SimpleAtoi(v, &m.clusters) && m.clusters > 0;
    } else if (k == "seed") {
      ok &= absl::SimpleAtoi(v, &m.seed);
    } else {
      ok = false;
    }
  }
  if (!ok) return absl::DataLossError(absl::StrCat("bad planted model '", text, "'"));
  return m;
}

absl::Status GenerateSynthetic(const SynthOptions& o, const std::string& dir) {
  if (o.samples < 0 || o.num_items < o.clusters || o.num_users < 1 || o.clusters < 1 ||
      o.dense_features < 0 || o.eval_fraction < 0 || o.eval_fraction > 1) {
    return absl::InvalidArgumentError(
        "synth: need samples >= 0, items >= clusters >= 1, users >= 1, dense >= 0, "
        "0 <= eval_fraction <= 1");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(dir, ": cannot create: ", ec.message()));

  std::mt19937_64 rng(o.seed);
  PlantedModel planted;
  planted.clusters = o.clusters;
  planted.seed = o.seed;
  std::normal_distribution<double> normal(0, 1);
  for (int j = 0; j < o.dense_features; ++j) planted.dense_weights.push_back(0.5 * normal(rng));

  Schema schema;
  schema.features = {{"sample_id", DType::kInt64, Layout::kScalar, ""},
                     {"user_id", DType::kInt64, Layout::kScalar, "user"},
                     {"item_id", DType::kInt64, Layout::kScalar, "item"},
                     {"item_category", DType::kInt64, Layout::kScalar, "item_category"}};
  for (int j = 0; j < o.dense_features; ++j) {
    schema.features.push_back({absl::StrCat("dense_", j), DType::kFloat32, Layout::kScalar, ""});
  }
  schema.features.push_back({"history_items", DType::kInt64, Layout::kJagged, "item"});
  schema.features.push_back({"label", DType::kFloat32, Layout::kScalar, ""});
  schema.metadata = {
      {"source", "recfleet data synth"},
      {"synth.planted_model", planted.Serialize()},
      {"length_feature", "history_items"},
      {"label_feature", "label"},
      {"table.user.rows", absl::StrCat(o.num_users + 1)},
      {"table.item.rows", absl::StrCat(o.num_items + 1)},
      {"table.item_category.rows", absl::StrCat(o.clusters)},
  };
  const int hist_col = 4 + o.dense_features;
  const int label_col = hist_col + 1;

  WriterOptions wo;
  wo.max_rows_per_block = o.rows_per_block;
  std::unique_ptr<DatasetWriter> writers[2];
  const char* names[2] = {"train.rfd", "eval.rfd"};
  for (int s = 0; s < 2; ++s) {
    auto w = DatasetWriter::Create(absl::StrCat(dir, "/", names[s]), schema, wo);
    if (!w.ok()) return w.status();
    writers[s] = *std::move(w);
  }
  auto shared = writers[0]->schema();
  Batch rows[2] = {Batch(shared), Batch(shared)};

  ZipfSampler any_item(o.num_items, o.zipf);
  ZipfSampler in_cluster(std::max<int64_t>(1, o.num_items / o.clusters), o.zipf);
  std::uniform_real_distribution<double> unit(0, 1);
  auto item_from = [&](int64_t cluster) {
    if (unit(rng) < 0.5) {
      int64_t k = static_cast<int64_t>(in_cluster.Sample(rng));
      return (k - 1) * o.clusters + cluster + 1;
    }
    return static_cast<int64_t>(any_item.Sample(rng));
  };
  std::vector<int64_t> history;
  std::vector<float> dense(o.dense_features);
  for (int64_t i = 0; i < o.samples; ++i) {
    if (o.progress && i % 1024 == 0) o.progress(i);
    int64_t user = 1 + static_cast<int64_t>(rng() % o.num_users);
    int64_t pref = static_cast<int64_t>(SplitMix64(user ^ o.seed) % o.clusters);
    history.resize(o.lengths.Sample(rng));
    for (int64_t& h : history) h = item_from(pref);
    int64_t item = item_from(pref);
    for (float& d : dense) d = static_cast<float>(normal(rng));
    double p =
        1 / (1 + std::exp(-planted.Logit(dense.data(), item, history.data(), history.size())));
    float label = unit(rng) < p ? 1.0f : 0.0f;
    int split = unit(rng) < o.eval_fraction ? 1 : 0;
    Batch& b = rows[split];
    b.AddInt64(0, i);
    b.AddInt64(1, user);
    b.AddInt64(2, item);
    b.AddInt64(3, (item - 1) % o.clusters);
    for (int j = 0; j < o.dense_features; ++j) b.AddFloat(4 + j, dense[j]);
    b.AddJaggedInt64(hist_col, history.data(), history.size());
    b.AddFloat(label_col, label);
    if (auto st = b.CommitRow(); !st.ok()) return st;
    if (b.num_rows() >= o.rows_per_block) {
      if (auto st = writers[split]->Write(b); !st.ok()) return st;
      b.Clear();
    }
  }
  for (int s = 0; s < 2; ++s) {
    if (auto st = writers[s]->Write(rows[s]); !st.ok()) return st;
    if (auto st = writers[s]->Close(); !st.ok()) return st;
  }
  if (o.progress) o.progress(o.samples);
  return absl::OkStatus();
}

double Auc(const std::vector<double>& scores, const std::vector<float>& labels) {
  std::vector<size_t> idx(scores.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of positive ranks (1-based, ties averaged): Mann-Whitney U.
  double pos = 0, rank_sum = 0;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j < idx.size() && scores[idx[j]] == scores[idx[i]]) ++j;
    double avg_rank = (i + 1 + j) / 2.0;
    for (size_t k = i; k < j; ++k) {
      if (labels[idx[k]] > 0.5f) {
        pos += 1;
        rank_sum += avg_rank;
      }
    }
    i = j;
  }
  double neg = static_cast<double>(scores.size()) - pos;
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

absl::StatusOr<double> PlantedAuc(const std::string& path) {
  auto reader = DatasetReader::Open(path);
  if (!reader.ok()) return reader.status();
  const Schema& s = *(*reader)->schema();
  auto it = s.metadata.find("synth.planted_model");
  if (it == s.metadata.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": no planted model in the metadata (not made by `recfleet data synth`)"));
  }
  auto model = PlantedModel::Parse(it->second);
  if (!model.ok()) return model.status();
  auto item = s.Require("item_id", DType::kInt64, Layout::kScalar);
  auto hist = s.Require("history_items", DType::kInt64, Layout::kJagged);
  auto label = s.Require("label", DType::kFloat32, Layout::kScalar);
  for (const auto* st : {&item, &hist, &label}) {
    if (!st->ok()) return st->status();
  }
  std::vector<int> dense_cols;
  for (size_t j = 0; j < model->dense_weights.size(); ++j) {
    auto c = s.Require(absl::StrCat("dense_", j), DType::kFloat32, Layout::kScalar);
    if (!c.ok()) return c.status();
    dense_cols.push_back(*c);
  }
  std::vector<double> scores;
  std::vector<float> labels;
  std::vector<float> dense(dense_cols.size());
  Batch block;
  while (true) {
    auto more = (*reader)->Next(&block);
    if (!more.ok()) return more.status();
    if (!*more) break;
    for (size_t r = 0; r < block.num_rows(); ++r) {
      for (size_t j = 0; j < dense_cols.size(); ++j) dense[j] = block.Float(dense_cols[j], r);
      scores.push_back(model->Logit(dense.data(), block.Int64(*item, r),
                                    block.JaggedInt64(*hist, r), block.RowLength(*hist, r)));
      labels.push_back(block.Float(*label, r));
    }
  }
  return Auc(scores, labels);
}

}  // namespace recfleet::data
