#ifndef RECFLEET_ENGINE_TESTING_MOVIELENS_H_
#define RECFLEET_ENGINE_TESTING_MOVIELENS_H_

// Test fixture: MovieLens-shaped CTR samples held in memory, the batch
// source of the model's own tests (engine/model_test, the distributed
// equivalence tests), which need many small, exactly reproducible batches
// without a dataset file. Not a data path: every run of recfleet reads
// `.rfd` datasets through the data loader (`recfleet data ingest` turns
// MovieLens files into one).
//
// ReadMovieLens parses the tab-separated "atomic files" of a dataset folder
// NAME/: NAME.inter (user_id, item_id, rating, timestamp; required) and the
// optional NAME.user (age, gender, occupation) and NAME.item (release_year,
// class = space-separated genres). The first line of each file names the
// columns as `name:type`; columns are found by name.
//
// MovieLensCtr turns the ratings into samples: label = rating >= threshold;
// each user's events are ordered by (timestamp, file order) and the last
// `eval_fraction` of them (floor) are held out for evaluation. A sample's
// history is the user's training events before it (for held-out samples:
// the last training events), at most `max_history`, most recent last.
// Features: user id, user attributes, item id, item attributes (genres +
// release decade) as pooled id lists; history events as tokens of item +
// rating + time-gap bucket; numeric features that only look at the past:
// the history length, the user's positive rate and mean rating over all
// their earlier training events, and the candidate item's positive rate and
// count over all training events (any user) strictly earlier in time. Rates
// are smoothed toward the global training rate with 10 pseudo-events.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/batch.h"
#include "engine/testing/dataset.h"

namespace recfleet::engine {

struct MovieLensData {
  struct Rating {
    int32_t user = 0;  // Dense index 0..num_users-1 (order of first appearance).
    int32_t item = 0;  // Dense index 0..num_items-1.
    float rating = 0;
    int64_t timestamp = 0;
  };
  std::vector<Rating> ratings;  // File order.
  int32_t num_users = 0;
  int32_t num_items = 0;
  // Attribute ids per user / item, indexes into the two vocabularies
  // (empty lists when the side files are absent).
  std::vector<std::vector<int64_t>> user_attrs;
  std::vector<std::vector<int64_t>> item_attrs;
  int64_t user_attr_vocab = 0;
  int64_t item_attr_vocab = 0;
};

// `dir` is the dataset folder; its last path component names the files.
// NotFound when NAME.inter is missing; InvalidArgument names file, line and
// column of a malformed row.
absl::StatusOr<MovieLensData> ReadMovieLens(const std::string& dir);

struct CtrOptions {
  float positive_rating = 4.0f;
  double eval_fraction = 0.2;
  int max_history = 50;
};

// AUCs of two count-based scores on the held-out events, fitted on the
// training events: smoothed item positive rate ("item popularity"), and
// smoothed user rate + smoothed item rate. Smoothing pulls a rate toward the
// global training rate with the weight of 10 pseudo-events.
struct BaselineAucs {
  double item_popularity = 0;
  double user_item_rate = 0;
};

class MovieLensCtr final : public Dataset {
 public:
  static absl::StatusOr<MovieLensCtr> Create(MovieLensData data, const CtrOptions& options);

  const FeatureSchema& schema() const override { return schema_; }
  int64_t num_train() const override { return static_cast<int64_t>(train_.size()); }
  int64_t num_eval() const override { return static_cast<int64_t>(eval_.size()); }
  // Positive rate of the training labels.
  double train_positive_rate() const;
  absl::StatusOr<BaselineAucs> Baselines() const;

  Batch MakeBatch(bool eval, absl::Span<const int64_t> indices) const override;

 private:
  struct Sample {
    int32_t user;
    int32_t position;       // Index into the user's time-ordered events.
    int32_t history_begin;  // History = user events [history_begin, history_end).
    int32_t history_end;
    std::array<float, 5> dense;
  };

  void ComputeDenseFeatures();

  MovieLensData data_;
  CtrOptions options_;
  FeatureSchema schema_;
  std::vector<std::vector<int32_t>> user_events_;  // Rating indexes, time order.
  std::vector<Sample> train_;
  std::vector<Sample> eval_;
};

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_TESTING_MOVIELENS_H_
