#ifndef RECFLEET_DATA_BATCH_H_
#define RECFLEET_DATA_BATCH_H_

// Batch: rows of samples held column by column, the in-memory form of a
// dataset block and of a rank batch. A scalar column holds one value per
// row; a jagged column holds offsets (rows + 1 entries, offsets[0] == 0,
// non-decreasing) into a flat values array, so row r's elements are
// values[offsets[r] .. offsets[r+1]). Not thread-safe; a value type.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "data/schema.h"

namespace recfleet::data {

// Leaves new elements uninitialized on resize: columns are filled by
// memcpy right after growing, and zeroing megabytes first would double the
// memory traffic of the loader's hot path.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) {}
  template <typename U>
  void construct(U* p) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using PodVector = std::vector<T, DefaultInitAllocator<T>>;

struct Column {
  PodVector<int64_t> i64;       // Values when the feature's dtype is int64.
  PodVector<float> f32;         // Values when the feature's dtype is float32.
  PodVector<uint64_t> offsets;  // Jagged only: rows + 1 entries.
};

class BlockView;

class Batch {
 public:
  Batch() = default;
  explicit Batch(std::shared_ptr<const Schema> schema);

  const Schema& schema() const { return *schema_; }
  const std::shared_ptr<const Schema>& schema_ptr() const { return schema_; }
  size_t num_rows() const { return num_rows_; }
  size_t num_columns() const { return columns_.size(); }
  const Column& column(int c) const { return columns_[c]; }
  // Direct access for decoders; callers keep the invariants above.
  Column& mutable_column(int c) { return columns_[c]; }
  void set_num_rows(size_t n) { num_rows_ = n; }

  // Empties every column, keeping the capacity.
  void Clear();
  // Reserves room for `rows` rows and `values` elements per jagged column.
  void Reserve(size_t rows, size_t values);

  // Building a row: set every column, then CommitRow().
  void AddInt64(int c, int64_t v) { columns_[c].i64.push_back(v); }
  void AddFloat(int c, float v) { columns_[c].f32.push_back(v); }
  void AddJaggedInt64(int c, const int64_t* v, size_t n);
  void AddJaggedFloat(int c, const float* v, size_t n);
  // Checks every column received exactly one row since the last commit.
  absl::Status CommitRow();

  // Appends row `row` of `src` (same schema) to this batch.
  void AppendRow(const Batch& src, size_t row);
  void AppendRow(const BlockView& src, size_t row);

  int64_t Int64(int c, size_t row) const { return columns_[c].i64[row]; }
  float Float(int c, size_t row) const { return columns_[c].f32[row]; }
  // Length of row `row` of a jagged column.
  size_t RowLength(int c, size_t row) const {
    return columns_[c].offsets[row + 1] - columns_[c].offsets[row];
  }
  const int64_t* JaggedInt64(int c, size_t row) const {
    return columns_[c].i64.data() + columns_[c].offsets[row];
  }
  const float* JaggedFloat(int c, size_t row) const {
    return columns_[c].f32.data() + columns_[c].offsets[row];
  }

  // Bytes of column data (values and offsets).
  size_t ByteSize() const;
  // Column sizes agree with num_rows and the schema; offsets well formed.
  absl::Status Validate() const;

 private:
  std::shared_ptr<const Schema> schema_;
  std::vector<Column> columns_;
  size_t num_rows_ = 0;
};

bool operator==(const Batch& a, const Batch& b);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_BATCH_H_
