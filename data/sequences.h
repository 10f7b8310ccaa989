#ifndef RECFLEET_DATA_SEQUENCES_H_
#define RECFLEET_DATA_SEQUENCES_H_

// Histories by reference. A sample file may keep its users' event
// sequences in a sibling sequence file (one row per sequence, jagged
// columns such as `items`, `actions`, `times`) and store, per sample, only
// a reference: the sequence's row (`history_seq`), the end position
// (`history_end`, exclusive) and the length (`history_len`) of the window
// it sees. Readers present the referenced windows as ordinary jagged
// features (history_items, ...), appended after the stored features, so
// every consumer sees the same rows as with histories stored inline, while
// each event is stored once however many samples (a positive and its
// negatives, every later event of the user) look at it.
//
// Schema metadata of such a sample file (data/FORMAT.md):
//   sequence.file            the sequence file's name, in the same directory
//   sequence.id              must equal the sequence file's own sequence.id
//   sequence.feature.<name>  "<table>|<column>" (a copy of the window of
//                            that sequence column) or
//                            "<table>|time_bucket:<column>:<feature>"
//                            (log2 hours between the sample's scalar
//                            <feature> and each event's <column>)
//
// A SequenceStore holds a whole sequence file decoded in memory (8 bytes
// per event and column); stores are shared by every file of the process
// that names the same path and id. Immutable and thread-safe once opened.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/schema.h"

namespace recfleet::data {

inline constexpr char kSequenceFileKey[] = "sequence.file";
inline constexpr char kSequenceIdKey[] = "sequence.id";
inline constexpr char kSequenceFeaturePrefix[] = "sequence.feature.";
inline constexpr char kHistorySeq[] = "history_seq";
inline constexpr char kHistoryEnd[] = "history_end";
inline constexpr char kHistoryLen[] = "history_len";

// log2 buckets (0..63) of the whole hours from `then` to `now` (seconds):
// floor(log2(1 + hours)), 0 when `then` is later.
int64_t TimeBucket(int64_t now, int64_t then);

class SequenceStore {
 public:
  // The store of `path` (shared if already open in this process), checked
  // to carry sequence.id `id`.
  static absl::StatusOr<std::shared_ptr<const SequenceStore>> Open(const std::string& path,
                                                                   const std::string& id);

  uint64_t num_sequences() const { return offsets_.size() - 1; }
  uint64_t length(uint64_t seq) const { return offsets_[seq + 1] - offsets_[seq]; }
  // Column index by name, or -1.
  int Find(const std::string& column) const;
  // Column c's events of sequence `seq`, positions [begin, end).
  const int64_t* events(int c, uint64_t seq) const {
    return columns_[c].data() + offsets_[seq];
  }

 private:
  std::string id_;
  std::vector<std::string> names_;
  std::vector<uint64_t> offsets_;  // Sequences + 1 entries, shared by all columns.
  std::vector<std::vector<int64_t>> columns_;
};

// A sample file's references resolved: which stored columns hold them and
// how each derived feature is made.
class SequenceRefs {
 public:
  struct Derived {
    FeatureSpec spec;    // Jagged int64, as readers present it.
    int column = -1;     // Sequence column.
    int anchor = -1;     // time_bucket: the stored scalar feature; else -1.
  };

  // For a file at `file_path` whose stored schema is `stored`: nullptr
  // when its histories are inline; else the references, and `logical` =
  // `stored` plus the derived features. Errors name the file and say to
  // re-ingest when the sequence file is missing or belongs to another
  // ingest.
  static absl::StatusOr<std::shared_ptr<const SequenceRefs>> Resolve(const std::string& file_path,
                                                                     const Schema& stored,
                                                                     Schema* logical);

  size_t num_stored() const { return num_stored_; }
  const std::vector<Derived>& derived() const { return derived_; }
  int seq_column() const { return seq_col_; }
  int end_column() const { return end_col_; }
  int len_column() const { return len_col_; }

  // Whether the window (seq, end, len) lies inside the store.
  bool Valid(int64_t seq, int64_t end, int64_t len) const;
  // Appends derived feature d's window of one sample to `out` (a jagged
  // int64 column). `anchor` is the sample's anchor value (time_bucket).
  void Append(size_t d, int64_t seq, int64_t end, int64_t len, int64_t anchor, Column* out) const;

 private:
  std::shared_ptr<const SequenceStore> store_;
  size_t num_stored_ = 0;
  int seq_col_ = -1, end_col_ = -1, len_col_ = -1;
  std::vector<Derived> derived_;
};

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_SEQUENCES_H_
