#ifndef RECFLEET_DATA_DATASET_FILE_H_
#define RECFLEET_DATA_DATASET_FILE_H_

// Reading and writing recfleet dataset files (".rfd"): a checksummed schema
// header, blocks of rows stored column by column with a CRC-32C per block,
// and a footer indexing the blocks. The byte layout is in data/FORMAT.md.
// Version 2 (written by default) may store an int64 array delta+varint
// coded; readers read versions 1 and 2. A file whose histories are stored
// by reference (data/sequences.h) reads as if they were inline: every
// reader's schema() is the logical one, the referenced features last.
//
// Every read verifies checksums and structure before returning data, so a
// truncated or corrupted file yields absl::DataLossError naming the file,
// the block and the byte offset, never a crash and never wrong rows.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/schema.h"
#include "data/sequences.h"

namespace recfleet::data {

struct WriterOptions {
  // A block is cut when it reaches either bound (whichever comes first).
  size_t max_rows_per_block = 1024;
  size_t max_block_bytes = 4 << 20;
  // 2: int64 arrays delta+varint coded where that is smaller. 1: the
  // original raw layout, for readers older than version 2.
  int format_version = 2;
};

// Appends rows to a new file; the file is complete only after Close().
// Not thread-safe.
class DatasetWriter {
 public:
  static absl::StatusOr<std::unique_ptr<DatasetWriter>> Create(const std::string& path,
                                                               const Schema& schema,
                                                               WriterOptions options = {});
  ~DatasetWriter();

  // Appends every row of `rows` (same schema as the file).
  absl::Status Write(const Batch& rows);
  // Flushes the last block, writes the footer and closes the file.
  absl::Status Close();

  const std::shared_ptr<const Schema>& schema() const { return schema_; }
  uint64_t rows_written() const { return rows_written_; }

 private:
  DatasetWriter(std::string path, std::FILE* f, std::shared_ptr<const Schema> schema,
                WriterOptions options);
  // Writes `pending_` as one block (if it has rows) and empties it.
  absl::Status FlushBlock();
  // Writes `rows` as one block.
  absl::Status WriteBlock(const Batch& rows);
  absl::Status WriteBytes(const void* p, size_t n);

  std::string path_;
  std::FILE* file_;
  std::shared_ptr<const Schema> schema_;
  WriterOptions options_;
  Batch pending_;
  uint64_t offset_ = 0;
  uint64_t rows_written_ = 0;
  std::vector<std::pair<uint64_t, uint32_t>> index_;  // (offset, rows) per block.
  std::string scratch_;
};

// Reads a file front to back, one block at a time: memory is bounded by the
// largest block. The footer is checked after the last block, so a reader
// that has seen Next() return false has read the whole, intact file.
// Not thread-safe.
class DatasetReader {
 public:
  static absl::StatusOr<std::unique_ptr<DatasetReader>> Open(const std::string& path);
  ~DatasetReader();

  const std::shared_ptr<const Schema>& schema() const { return schema_; }
  // Fills `block` with the next block: true, or false at a verified end.
  absl::StatusOr<bool> Next(Batch* block);

 private:
  DatasetReader(std::string path, std::FILE* f, uint64_t size);
  // Reads exactly n bytes at the cursor; `block` (-1: none) names the error.
  absl::Status ReadAt(uint64_t n, void* out, int64_t block, const char* what);

  std::string path_;
  std::FILE* file_;
  uint64_t size_;
  uint64_t pos_ = 0;
  int version_ = 0;
  std::shared_ptr<const Schema> stored_;  // The blocks' columns.
  std::shared_ptr<const Schema> schema_;  // stored_ plus referenced features.
  std::shared_ptr<const SequenceRefs> refs_;
  std::vector<std::pair<uint64_t, uint32_t>> seen_;  // (offset, rows) per block.
  std::vector<uint8_t> buffer_;
  bool done_ = false;
};

// A verified block read into its own buffer, its raw columns read in place
// (no decode copy; coded arrays are decoded once, into the view): the
// loader's hot path. Values are little-endian and may be unaligned;
// Batch::AppendRow(view, row) copies a row out, materializing referenced
// histories from the sequence store.
class BlockView {
 public:
  size_t num_rows() const { return rows_; }
  const Schema& schema() const { return *schema_; }
  // Columns [0, num_stored()) are in the block; the rest are referenced
  // histories (data/sequences.h).
  size_t num_stored() const { return values_.size(); }
  // Stored jagged column c: row r's elements are [Begin(c, r), End(c, r)).
  uint64_t Begin(int c, size_t r) const { return Offset(c, r); }
  uint64_t End(int c, size_t r) const { return Offset(c, r + 1); }
  // Any jagged column, stored or referenced.
  size_t RowLength(int c, size_t r) const {
    if (static_cast<size_t>(c) >= values_.size()) return Scalar(len_col_, r);
    return End(c, r) - Begin(c, r);
  }
  // Stored column c's values (int64 or float32 by the feature's dtype).
  const uint8_t* values(int c) const { return values_[c]; }
  // Appends referenced column c's row r to `out` (c >= num_stored()).
  void AppendReferenced(int c, size_t r, Column* out) const;

 private:
  friend class DatasetFile;
  uint64_t Offset(int c, size_t r) const {
    uint64_t v;
    std::memcpy(&v, offsets_[c] + 8 * r, 8);
    return v;
  }
  int64_t Scalar(int c, size_t r) const {
    int64_t v;
    std::memcpy(&v, values_[c] + 8 * r, 8);
    return v;
  }
  std::shared_ptr<const Schema> schema_;
  std::shared_ptr<const SequenceRefs> refs_;
  int len_col_ = -1;
  // Grown, never shrunk, never initialized: reused across block reads.
  std::unique_ptr<uint8_t[]> buffer_;
  size_t capacity_ = 0;
  PodVector<uint8_t> decoded_;  // Coded arrays, decoded.
  size_t rows_ = 0;
  std::vector<const uint8_t*> offsets_;  // Jagged columns only; else null.
  std::vector<const uint8_t*> values_;
};

// Random access by block, through the footer's index. ReadBlock is const
// and thread-safe (positioned reads); the object holds only the index.
class DatasetFile {
 public:
  static absl::StatusOr<std::unique_ptr<DatasetFile>> Open(const std::string& path);
  ~DatasetFile();

  const std::string& path() const { return path_; }
  const std::shared_ptr<const Schema>& schema() const { return schema_; }
  size_t num_blocks() const { return blocks_.size(); }
  uint64_t num_rows() const { return num_rows_; }
  uint32_t block_rows(size_t b) const { return blocks_[b].rows; }

  // Reads, verifies and decodes block `b` into `out` (reusing its storage).
  absl::Status ReadBlock(size_t b, Batch* out) const;
  // Reads and verifies block `b`, leaving its columns in place.
  absl::Status ReadBlockView(size_t b, BlockView* out) const;

 private:
  struct BlockRef {
    uint64_t offset;
    uint64_t size;  // Header and payload.
    uint32_t rows;
  };
  DatasetFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_;
  int version_ = 0;
  std::shared_ptr<const Schema> stored_;  // The blocks' columns.
  std::shared_ptr<const Schema> schema_;  // stored_ plus referenced features.
  std::shared_ptr<const SequenceRefs> refs_;
  std::vector<BlockRef> blocks_;
  uint64_t num_rows_ = 0;
};

// Lengths of jagged feature `feature` (stored or referenced) in up to
// `max_rows` rows of `path`, spread evenly over its blocks (at most 16
// blocks read, rows evenly strided within each), so a file sorted by user or
// time is sampled throughout: what a planner prices a dataset's steps by.
// NotFound or DataLoss as DatasetFile::Open and ReadBlockView say;
// InvalidArgument when the file has no jagged feature of that name.
absl::StatusOr<std::vector<int64_t>> SampleRowLengths(const std::string& path, const std::string& feature,
                                                      size_t max_rows);

// Bytes every row of `path` takes decoded in memory (Batch::ByteSize of what
// ReadAll returns), from the decoded size per row of up to 16 blocks spread
// over the file. Errors as SampleRowLengths.
absl::StatusOr<double> EstimateDecodedBytes(const std::string& path);

// Every row of every block of `path`, read with DatasetReader (for tests and
// small files).
absl::StatusOr<Batch> ReadAll(const std::string& path);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_DATASET_FILE_H_
