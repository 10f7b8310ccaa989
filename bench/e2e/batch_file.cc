#include "bench/e2e/batch_file.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace recfleet::bench {
namespace {

constexpr char kMagic[8] = {'R', 'F', 'B', 'A', 'T', 'C', 'H', '1'};

// The checks the reader applies, shared with the writer so it never writes
// a file the reader rejects.
absl::Status CheckList(const engine::IdList& l, int64_t size) {
  if (static_cast<int64_t>(l.offsets.size()) != size + 1 || l.offsets.front() != 0 ||
      l.offsets.back() != static_cast<int64_t>(l.ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat("offsets must have size + 1 = ", size + 1,
                                                   " entries from 0 to the id count ", l.ids.size()));
  }
  for (size_t i = 1; i < l.offsets.size(); ++i) {
    if (l.offsets[i] < l.offsets[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("offsets decrease at entry ", i));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBatch(const engine::Batch& b) {
  if (b.size < 0) return absl::InvalidArgumentError(absl::StrCat("negative size ", b.size));
  for (size_t f = 0; f < b.id_lists.size(); ++f) {
    if (absl::Status s = CheckList(b.id_lists[f], b.size); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("id list ", f, ": ", s.message()));
    }
  }
  for (size_t f = 0; f < b.sequence.size(); ++f) {
    if (absl::Status s = CheckList(b.sequence[f], b.size); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence field ", f, ": ", s.message()));
    }
  }
  if (b.size == 0 ? !b.dense.empty() : b.dense.size() % b.size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(b.dense.size(), " dense values are not a multiple of size ", b.size));
  }
  for (const std::vector<float>* labels : {&b.ctr_labels, &b.cvr_labels}) {
    if (!labels->empty() && static_cast<int64_t>(labels->size()) != b.size) {
      return absl::InvalidArgumentError(absl::StrCat(labels->size(), " labels for size ", b.size));
    }
  }
  return absl::OkStatus();
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

class Writer {
 public:
  explicit Writer(FILE* f) : f_(f) {}
  void Int(int64_t v) { Bytes(&v, sizeof v); }
  template <typename T>
  void Array(const std::vector<T>& v) {
    Bytes(v.data(), v.size() * sizeof(T));
  }
  void List(const engine::IdList& l) {
    Int(static_cast<int64_t>(l.offsets.size()));
    Int(static_cast<int64_t>(l.ids.size()));
    Array(l.offsets);
    Array(l.ids);
  }
  void Bytes(const void* p, size_t n) {
    if (n > 0 && std::fwrite(p, 1, n, f_) != n) ok_ = false;
  }
  bool ok() const { return ok_; }

 private:
  FILE* f_;
  bool ok_ = true;
};

// Reads from memory, tracking the offset for error messages.
class Reader {
 public:
  Reader(const std::string& data, const std::string& path) : data_(data), path_(path) {}

  absl::Status Int(int64_t* v, const char* what) {
    if (absl::Status s = Bytes(v, sizeof *v, what); !s.ok()) return s;
    if (*v < 0) return Bad(absl::StrCat(what, " is negative (", *v, ")"));
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status Array(int64_t n, std::vector<T>* v, const char* what) {
    if (n > static_cast<int64_t>((data_.size() - pos_) / sizeof(T))) {
      return Bad(absl::StrCat(what, ": ", n, " elements run past the end of the file"));
    }
    v->resize(n);
    return Bytes(v->data(), n * sizeof(T), what);
  }
  absl::Status List(int64_t size, engine::IdList* l, const char* what) {
    int64_t num_offsets, num_ids;
    if (absl::Status s = Int(&num_offsets, what); !s.ok()) return s;
    if (absl::Status s = Int(&num_ids, what); !s.ok()) return s;
    if (absl::Status s = Array(num_offsets, &l->offsets, what); !s.ok()) return s;
    if (absl::Status s = Array(num_ids, &l->ids, what); !s.ok()) return s;
    if (absl::Status s = CheckList(*l, size); !s.ok()) return Bad(absl::StrCat(what, ": ", s.message()));
    return absl::OkStatus();
  }
  absl::Status Bytes(void* p, size_t n, const char* what) {
    if (n > data_.size() - pos_) return Bad(absl::StrCat("truncated in ", what));
    if (n > 0) std::memcpy(p, data_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status Bad(const std::string& what) const {
    return absl::DataLossError(absl::StrCat(path_, ": batch ", batch_, " at byte ", pos_, ": ", what));
  }
  void set_batch(int64_t b) { batch_ = b; }
  bool at_end() const { return pos_ == data_.size(); }

 private:
  const std::string& data_;
  const std::string& path_;
  size_t pos_ = 0;
  int64_t batch_ = -1;
};

}  // namespace

absl::Status WriteBatchFile(const std::string& path, const std::vector<engine::Batch>& batches) {
  for (size_t i = 0; i < batches.size(); ++i) {
    if (absl::Status s = CheckBatch(batches[i]); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("batch ", i, ": ", s.message()));
    }
  }
  File f(std::fopen(path.c_str(), "wb"));
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot open ", path, " for writing"));
  Writer w(f.get());
  w.Bytes(kMagic, sizeof kMagic);
  w.Int(static_cast<int64_t>(batches.size()));
  for (const engine::Batch& b : batches) {
    w.Int(b.size);
    w.Int(static_cast<int64_t>(b.id_lists.size()));
    for (const engine::IdList& l : b.id_lists) w.List(l);
    w.Int(static_cast<int64_t>(b.sequence.size()));
    for (const engine::IdList& l : b.sequence) w.List(l);
    w.Int(static_cast<int64_t>(b.dense.size()));
    w.Array(b.dense);
    w.Int(static_cast<int64_t>(b.ctr_labels.size()));
    w.Array(b.ctr_labels);
    w.Int(static_cast<int64_t>(b.cvr_labels.size()));
    w.Array(b.cvr_labels);
  }
  if (!w.ok() || std::fclose(f.release()) != 0) {
    return absl::InternalError(absl::StrCat("writing ", path, " failed (disk full?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<engine::Batch>> ReadBatchFile(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open batch file ", path));
  std::string data;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, f.get())) > 0) data.append(buffer, n);
  if (std::ferror(f.get())) return absl::DataLossError(absl::StrCat("reading ", path, " failed"));

  Reader r(data, path);
  char magic[sizeof kMagic];
  if (absl::Status s = r.Bytes(magic, sizeof magic, "magic"); !s.ok()) return s;
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0) return r.Bad("not a batch file (magic is not RFBATCH1)");
  int64_t count;
  if (absl::Status s = r.Int(&count, "batch count"); !s.ok()) return s;
  // Every batch takes at least its seven counts: bounds the reservation.
  if (count > static_cast<int64_t>(data.size() / (7 * sizeof(int64_t)))) {
    return r.Bad(absl::StrCat("batch count ", count, " does not fit in the file"));
  }
  std::vector<engine::Batch> batches(count);
  for (int64_t i = 0; i < count; ++i) {
    r.set_batch(i);
    engine::Batch& b = batches[i];
    int64_t lists;
    if (absl::Status s = r.Int(&b.size, "size"); !s.ok()) return s;
    if (absl::Status s = r.Int(&lists, "id list count"); !s.ok()) return s;
    if (lists > static_cast<int64_t>(data.size())) return r.Bad("id list count does not fit in the file");
    b.id_lists.resize(lists);
    for (engine::IdList& l : b.id_lists) {
      if (absl::Status s = r.List(b.size, &l, "id list"); !s.ok()) return s;
    }
    if (absl::Status s = r.Int(&lists, "sequence field count"); !s.ok()) return s;
    if (lists > static_cast<int64_t>(data.size())) return r.Bad("sequence field count does not fit in the file");
    b.sequence.resize(lists);
    for (engine::IdList& l : b.sequence) {
      if (absl::Status s = r.List(b.size, &l, "sequence field"); !s.ok()) return s;
    }
    int64_t m;
    if (absl::Status s = r.Int(&m, "dense count"); !s.ok()) return s;
    if (absl::Status s = r.Array(m, &b.dense, "dense"); !s.ok()) return s;
    if (absl::Status s = r.Int(&m, "CTR label count"); !s.ok()) return s;
    if (absl::Status s = r.Array(m, &b.ctr_labels, "CTR labels"); !s.ok()) return s;
    if (absl::Status s = r.Int(&m, "CVR label count"); !s.ok()) return s;
    if (absl::Status s = r.Array(m, &b.cvr_labels, "CVR labels"); !s.ok()) return s;
    if (absl::Status s = CheckBatch(b); !s.ok()) return r.Bad(std::string(s.message()));
  }
  if (!r.at_end()) return r.Bad("trailing bytes after the last batch");
  return batches;
}

}  // namespace recfleet::bench
