#include "data/batch.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "data/dataset_file.h"

namespace recfleet::data {

Batch::Batch(std::shared_ptr<const Schema> schema) : schema_(std::move(schema)) {
  columns_.resize(schema_->features.size());
  Clear();
}

void Batch::Clear() {
  for (size_t c = 0; c < columns_.size(); ++c) {
    columns_[c].i64.clear();
    columns_[c].f32.clear();
    columns_[c].offsets.clear();
    if (schema_->features[c].layout == Layout::kJagged) columns_[c].offsets.push_back(0);
  }
  num_rows_ = 0;
}

void Batch::Reserve(size_t rows, size_t values) {
  for (size_t c = 0; c < columns_.size(); ++c) {
    const FeatureSpec& f = schema_->features[c];
    size_t n = f.layout == Layout::kJagged ? values : rows;
    if (f.layout == Layout::kJagged) columns_[c].offsets.reserve(rows + 1);
    if (f.dtype == DType::kInt64) {
      columns_[c].i64.reserve(n);
    } else {
      columns_[c].f32.reserve(n);
    }
  }
}

void Batch::AddJaggedInt64(int c, const int64_t* v, size_t n) {
  Column& col = columns_[c];
  col.i64.insert(col.i64.end(), v, v + n);
  col.offsets.push_back(col.i64.size());
}

void Batch::AddJaggedFloat(int c, const float* v, size_t n) {
  Column& col = columns_[c];
  col.f32.insert(col.f32.end(), v, v + n);
  col.offsets.push_back(col.f32.size());
}

absl::Status Batch::CommitRow() {
  ++num_rows_;
  for (size_t c = 0; c < columns_.size(); ++c) {
    const FeatureSpec& f = schema_->features[c];
    const Column& col = columns_[c];
    size_t have = f.layout == Layout::kJagged ? col.offsets.size() - 1
                  : f.dtype == DType::kInt64  ? col.i64.size()
                                              : col.f32.size();
    if (have != num_rows_) {
      return absl::InternalError(absl::StrCat("row ", num_rows_ - 1, ": feature '", f.name,
                                              "' has ", have, " rows, expected ", num_rows_));
    }
  }
  return absl::OkStatus();
}

void Batch::AppendRow(const Batch& src, size_t row) {
  for (size_t c = 0; c < columns_.size(); ++c) {
    const FeatureSpec& f = schema_->features[c];
    const Column& s = src.columns_[c];
    Column& d = columns_[c];
    if (f.layout == Layout::kScalar) {
      if (f.dtype == DType::kInt64) {
        d.i64.push_back(s.i64[row]);
      } else {
        d.f32.push_back(s.f32[row]);
      }
    } else {
      uint64_t b = s.offsets[row], e = s.offsets[row + 1];
      if (f.dtype == DType::kInt64) {
        d.i64.insert(d.i64.end(), s.i64.begin() + b, s.i64.begin() + e);
        d.offsets.push_back(d.i64.size());
      } else {
        d.f32.insert(d.f32.end(), s.f32.begin() + b, s.f32.begin() + e);
        d.offsets.push_back(d.f32.size());
      }
    }
  }
  ++num_rows_;
}

void Batch::AppendRow(const BlockView& src, size_t row) {
  for (size_t c = src.num_stored(); c < columns_.size(); ++c) {
    src.AppendReferenced(static_cast<int>(c), row, &columns_[c]);
  }
  for (size_t c = 0; c < src.num_stored(); ++c) {
    const FeatureSpec& f = schema_->features[c];
    Column& d = columns_[c];
    const size_t elem = f.dtype == DType::kInt64 ? 8 : 4;
    uint64_t b = row, n = 1;
    if (f.layout == Layout::kJagged) {
      b = src.Begin(c, row);
      n = src.End(c, row) - b;
    }
    const uint8_t* from = src.values(c) + b * elem;
    // memcpy's pointers must be valid even for 0 bytes, and an empty
    // column's data() may be null (an empty row of a jagged column).
    if (f.dtype == DType::kInt64) {
      size_t old = d.i64.size();
      d.i64.resize(old + n);
      if (n > 0) std::memcpy(d.i64.data() + old, from, n * elem);
      if (f.layout == Layout::kJagged) d.offsets.push_back(d.i64.size());
    } else {
      size_t old = d.f32.size();
      d.f32.resize(old + n);
      if (n > 0) std::memcpy(d.f32.data() + old, from, n * elem);
      if (f.layout == Layout::kJagged) d.offsets.push_back(d.f32.size());
    }
  }
  ++num_rows_;
}

size_t Batch::ByteSize() const {
  size_t n = 0;
  for (const Column& c : columns_) {
    n += c.i64.size() * 8 + c.f32.size() * 4 + c.offsets.size() * 8;
  }
  return n;
}

absl::Status Batch::Validate() const {
  for (size_t c = 0; c < columns_.size(); ++c) {
    const FeatureSpec& f = schema_->features[c];
    const Column& col = columns_[c];
    size_t values = f.dtype == DType::kInt64 ? col.i64.size() : col.f32.size();
    size_t other = f.dtype == DType::kInt64 ? col.f32.size() : col.i64.size();
    if (other != 0) {
      return absl::InternalError(
          absl::StrCat("feature '", f.name, "' holds values of the wrong type"));
    }
    if (f.layout == Layout::kScalar) {
      if (values != num_rows_) {
        return absl::InternalError(absl::StrCat("feature '", f.name, "' has ", values,
                                                " values for ", num_rows_, " rows"));
      }
      continue;
    }
    if (col.offsets.size() != num_rows_ + 1 || col.offsets[0] != 0 ||
        col.offsets.back() != values) {
      return absl::InternalError(absl::StrCat("feature '", f.name, "': offsets do not frame ",
                                              values, " values in ", num_rows_, " rows"));
    }
    for (size_t r = 0; r < num_rows_; ++r) {
      if (col.offsets[r] > col.offsets[r + 1]) {
        return absl::InternalError(
            absl::StrCat("feature '", f.name, "': offsets decrease at row ", r));
      }
    }
  }
  return absl::OkStatus();
}

bool operator==(const Batch& a, const Batch& b) {
  if (a.num_rows() != b.num_rows() || !(a.schema() == b.schema())) return false;
  for (size_t c = 0; c < a.num_columns(); ++c) {
    const Column& x = a.column(c);
    const Column& y = b.column(c);
    if (x.i64 != y.i64 || x.f32 != y.f32 || x.offsets != y.offsets) return false;
  }
  return true;
}

}  // namespace recfleet::data
