#ifndef RECFLEET_ENGINE_TESTING_SYNTHETIC_H_
#define RECFLEET_ENGINE_TESTING_SYNTHETIC_H_

// A synthetic MovieLens-shaped dataset with a planted, learnable signal, so
// tests and demos train the real pipeline without any downloaded data.
// Ratings come from a latent-factor model: user bias + item bias +
// user-factor . item-factor + noise, where each item's factor is driven by
// its genres and each user's by their attributes; items are drawn with
// Zipf-like popularity and timestamps increase per user. Deterministic in
// the seed.
//
// Test fixture (see movielens.h beside it): not a data path.

#include <cstdint>

#include "engine/testing/movielens.h"

namespace recfleet::engine {

struct SyntheticOptions {
  int32_t num_users = 300;
  int32_t num_items = 400;
  int32_t min_events = 20;   // Per user; lengths are heavy-tailed above it.
  int32_t mean_extra_events = 40;
  uint64_t seed = 1;
};

MovieLensData SyntheticMovieLens(const SyntheticOptions& options);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_TESTING_SYNTHETIC_H_
