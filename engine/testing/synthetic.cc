#include "engine/testing/synthetic.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

namespace recfleet::engine {
namespace {

constexpr int kFactors = 4;
constexpr int kGenres = 8;
constexpr int kUserGroups = 6;

}  // namespace

MovieLensData SyntheticMovieLens(const SyntheticOptions& options) {
  std::mt19937_64 rng(options.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  MovieLensData data;
  data.num_users = options.num_users;
  data.num_items = options.num_items;
  data.user_attr_vocab = kUserGroups;
  data.item_attr_vocab = kGenres;

  std::vector<std::array<double, kFactors>> genre_factor(kGenres), group_factor(kUserGroups);
  for (auto& f : genre_factor) for (double& v : f) v = normal(rng);
  for (auto& f : group_factor) for (double& v : f) v = normal(rng);

  std::vector<std::array<double, kFactors>> item_factor(data.num_items);
  std::vector<double> item_bias(data.num_items);
  data.item_attrs.resize(data.num_items);
  for (int32_t i = 0; i < data.num_items; ++i) {
    const int g1 = static_cast<int>(rng() % kGenres), g2 = static_cast<int>(rng() % kGenres);
    data.item_attrs[i] = {g1};
    if (g2 != g1) data.item_attrs[i].push_back(g2);
    for (int k = 0; k < kFactors; ++k) {
      item_factor[i][k] = 0.5 * (genre_factor[g1][k] + genre_factor[g2][k]) + 0.3 * normal(rng);
    }
    item_bias[i] = 0.6 * normal(rng);
  }
  std::vector<std::array<double, kFactors>> user_factor(data.num_users);
  std::vector<double> user_bias(data.num_users);
  data.user_attrs.resize(data.num_users);
  for (int32_t u = 0; u < data.num_users; ++u) {
    const int g = static_cast<int>(rng() % kUserGroups);
    data.user_attrs[u] = {g};
    for (int k = 0; k < kFactors; ++k) user_factor[u][k] = 0.5 * group_factor[g][k] + 0.3 * normal(rng);
    user_bias[u] = 0.6 * normal(rng);
  }

  // Popularity ~ 1 / (rank + 10): a few items dominate, as in real logs.
  std::vector<double> weights(data.num_items);
  for (int32_t i = 0; i < data.num_items; ++i) weights[i] = 1.0 / (i + 10.0);
  std::discrete_distribution<int32_t> pick_item(weights.begin(), weights.end());
  std::geometric_distribution<int32_t> extra(1.0 / (1.0 + options.mean_extra_events));
  for (int32_t u = 0; u < data.num_users; ++u) {
    const int32_t n = options.min_events + extra(rng);
    int64_t t = 880000000 + static_cast<int64_t>(rng() % 1000000);
    for (int32_t e = 0; e < n; ++e) {
      const int32_t item = pick_item(rng);
      double score = 3.4 + user_bias[u] + item_bias[item] + 0.5 * normal(rng);
      for (int k = 0; k < kFactors; ++k) score += 0.5 * user_factor[u][k] * item_factor[item][k];
      MovieLensData::Rating r;
      r.user = u;
      r.item = item;
      r.rating = static_cast<float>(std::clamp(std::round(score), 1.0, 5.0));
      // Several events often share a timestamp, as in MovieLens.
      t += (rng() % 3 == 0) ? 0 : static_cast<int64_t>(rng() % 200000);
      r.timestamp = t;
      data.ratings.push_back(r);
    }
  }
  return data;
}

}  // namespace recfleet::engine
