#ifndef RECFLEET_DATA_INGEST_H_
#define RECFLEET_DATA_INGEST_H_

// Ingestion: turns an interaction log into training samples the standard
// way for sequential recommendation. Events are grouped by user and
// ordered by time (ties keep file order); each event becomes one sample:
// the user's earlier events (capped at the most recent max_history), the
// event's item as the candidate, a label (rating >= threshold, or 1 for
// implicit feedback, where sampled negatives supply the 0s), and side
// features joined from user and item attribute files.
//
// Inputs:
//  - delimited event logs (tab, comma, "::" or whitespace) with a header
//    line or a column mapping by 0-based index; headers in the
//    "name:type" style (RecBole atomic files) are understood, and
//    ":token_seq" attribute columns become jagged id lists;
//  - per-user sequence files, one line "user item1 item2 ..." in time order.
// Raw ids of every kind become dense ids 1..N in order of first appearance
// (0 = unknown/padding); vocabulary sizes go into the schema metadata
// (table.<name>.rows). Splits: each user's last fraction of events by time,
// or a fraction of users.
//
// Output: each user's sequence (items, actions, times) is stored once, in
// sequences.rfs; train.rfd and eval.rfd store per sample a reference
// (sequence, end, length) that readers turn back into history_items,
// history_actions and history_time_buckets (data/sequences.h). A sample
// and its sampled negatives share one reference.
//
// Memory is bounded: events are sorted in runs of sort_buffer_events
// (40 bytes each, twice that while a run is sorted) spilled to DIR and
// merged; beyond that, memory holds the
// id vocabularies, the attribute tables and one user's events. A UTF-8
// byte-order mark is stripped; a UTF-16 one, a non-numeric time or a
// non-numeric or non-finite rating is an error naming the line (or, with
// bad_ratings = kSkip, lines with a NaN, infinite or empty rating are
// counted and dropped).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recfleet::data {

// What ingestion has done so far, for a progress display.
struct IngestProgress {
  const char* phase = "";  // "reading", "writing", "done".
  int64_t events = 0;      // Events read.
  int64_t samples = 0;     // Samples written.
  double seconds = 0;      // Since the start.
};

struct IngestOptions {
  enum class Input { kEvents, kSequences };
  enum class Negatives { kUniform, kPopularity };
  enum class BadRatings { kError, kSkip };
  enum class Header { kAuto, kYes, kNo };
  enum class Split { kTime, kUser };

  Input input = Input::kEvents;
  std::string path;
  // "\t", ",", "::", " " (runs of spaces/tabs) or "auto" (from the first line).
  std::string delimiter = "auto";
  Header header = Header::kAuto;
  // Columns by header name or 0-based index; "" for absent (time: file
  // order; rating: implicit feedback).
  std::string user_column = "user_id";
  std::string item_column = "item_id";
  std::string time_column = "timestamp";
  std::string rating_column = "rating";
  double label_threshold = 4.0;
  int max_history = 1024;
  // Sampled negatives per positive; -1: 1 for implicit feedback, 0 otherwise.
  int negatives_per_positive = -1;
  // Negatives drawn uniformly over items, or in proportion to each item's
  // number of events (seeded by `seed` and the user either way).
  Negatives negative_sampling = Negatives::kUniform;
  BadRatings bad_ratings = BadRatings::kError;
  Split split = Split::kTime;
  double eval_fraction = 0.2;
  // Attribute files (delimited, with a header; the key is the column named
  // like user_column/item_column, else the first). Empty: none.
  std::string user_features;
  std::string item_features;
  // Attribute columns to keep (header names without ":type"); empty: all.
  std::vector<std::string> user_feature_columns;
  std::vector<std::string> item_feature_columns;
  uint64_t seed = 1;
  size_t rows_per_block = 1024;
  // Events sorted in memory at once; more spill to sorted runs in DIR.
  size_t sort_buffer_events = size_t{8} << 20;
  // Called about twice a second while ingesting, and once at the end.
  std::function<void(const IngestProgress&)> progress;
};

struct IngestStats {
  int64_t users = 0;
  int64_t items = 0;
  int64_t events = 0;
  int64_t train_samples = 0;
  int64_t eval_samples = 0;
  int64_t positives = 0;
  int64_t skipped_lines = 0;  // Blank lines only; malformed lines are errors.
  int64_t skipped_ratings = 0;  // Lines dropped by BadRatings::kSkip.
  int64_t sort_runs = 0;        // Sorted runs spilled to disk (0: sorted in memory).
  std::string ToString() const;
};

inline constexpr char kSequenceFileName[] = "sequences.rfs";

// Writes `out_dir`/train.rfd, `out_dir`/eval.rfd, `out_dir`/sequences.rfs
// and the raw-to-dense id maps `out_dir`/vocab_user.tsv and vocab_item.tsv. Malformed input gives
// an error naming the file, line and field.
absl::StatusOr<IngestStats> Ingest(const IngestOptions& options, const std::string& out_dir);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_INGEST_H_
