#include "data/sequences.h"

#include <filesystem>
#include <map>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/dataset_file.h"

namespace recfleet::data {

int64_t TimeBucket(int64_t now, int64_t then) {
  if (now <= then) return 0;
  // floor(log2(1 + h)) == floor(log2(1 + floor(h))) for h >= 0, so whole
  // hours suffice: no floating point on the loader's hot path. The
  // unsigned difference is exact (and cannot overflow) since now > then.
  const uint64_t hours = (static_cast<uint64_t>(now) - static_cast<uint64_t>(then)) / 3600;
  const int64_t bucket = 63 - __builtin_clzll(hours + 1);
  return bucket < 63 ? bucket : 63;
}

absl::StatusOr<std::shared_ptr<const SequenceStore>> SequenceStore::Open(const std::string& path,
                                                                       const std::string& id) {
  static std::mutex mu;
  static auto* open = new std::map<std::string, std::weak_ptr<const SequenceStore>>();
  // Opening a sequence file that itself names a sequence file would come
  // back here on this thread while `mu` is held: refuse it instead.
  thread_local bool opening = false;
  if (opening) {
    return absl::DataLossError(absl::StrCat(
        path, ": a sequence file refers to another sequence file; only sample files may"));
  }
  opening = true;
  struct Done {
    bool* flag;
    ~Done() { *flag = false; }
  } done{&opening};
  std::error_code ec;
  std::string key = std::filesystem::weakly_canonical(path, ec).string();
  if (ec) key = path;
  // Held while loading, so concurrent openers of one file load it once.
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = open->find(key); it != open->end()) {
    if (auto shared = it->second.lock()) {
      auto stored = shared->id_;
      if (stored == id) return shared;
    }
  }
  auto reader = DatasetReader::Open(path);
  if (!reader.ok()) return reader.status();
  const Schema& schema = *(*reader)->schema();
  auto it = schema.metadata.find(kSequenceIdKey);
  if (it == schema.metadata.end() || it->second != id) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": sequence id '", it == schema.metadata.end() ? "" : it->second,
        "' is not the '", id,
        "' its sample files expect: the files come from different ingests; re-ingest"));
  }
  auto store = std::shared_ptr<SequenceStore>(new SequenceStore());
  store->id_ = id;
  for (const FeatureSpec& f : schema.features) {
    if (f.dtype != DType::kInt64 || f.layout != Layout::kJagged) {
      return absl::DataLossError(absl::StrCat(path, ": sequence column '", f.name,
                                              "' is not a jagged int64 column"));
    }
    store->names_.push_back(f.name);
  }
  if (store->names_.empty()) return absl::DataLossError(path + ": no sequence columns");
  store->columns_.resize(store->names_.size());
  store->offsets_.assign(1, 0);
  Batch block;
  for (int64_t b = 0;; ++b) {
    auto more = (*reader)->Next(&block);
    if (!more.ok()) return more.status();
    if (!*more) break;
    for (size_t r = 0; r < block.num_rows(); ++r) {
      const size_t n = block.RowLength(0, r);
      for (size_t c = 0; c < store->columns_.size(); ++c) {
        if (block.RowLength(c, r) != n) {
          return absl::DataLossError(absl::StrCat(path, ": block ", b, " row ", r, ": column '",
                                                  store->names_[c], "' has ", block.RowLength(c, r),
                                                  " events, column '", store->names_[0], "' ", n));
        }
        const int64_t* v = block.JaggedInt64(c, r);
        store->columns_[c].insert(store->columns_[c].end(), v, v + n);
      }
      store->offsets_.push_back(store->offsets_.back() + n);
    }
  }
  (*open)[key] = store;
  return std::shared_ptr<const SequenceStore>(std::move(store));
}

int SequenceStore::Find(const std::string& column) const {
  for (size_t c = 0; c < names_.size(); ++c) {
    if (names_[c] == column) return static_cast<int>(c);
  }
  return -1;
}

absl::StatusOr<std::shared_ptr<const SequenceRefs>> SequenceRefs::Resolve(
    const std::string& file_path, const Schema& stored, Schema* logical) {
  *logical = stored;
  auto file = stored.metadata.find(kSequenceFileKey);
  if (file == stored.metadata.end()) return std::shared_ptr<const SequenceRefs>();
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(file_path, ": ", what));
  };
  auto id = stored.metadata.find(kSequenceIdKey);
  if (id == stored.metadata.end()) return bad(absl::StrCat("no ", kSequenceIdKey, " metadata"));
  if (absl::StrContains(file->second, "/")) {
    return bad(absl::StrCat("sequence file '", file->second, "' must be a plain file name"));
  }
  auto refs = std::make_shared<SequenceRefs>();
  refs->num_stored_ = stored.features.size();
  for (auto [name, col] : {std::pair<const char*, int*>{kHistorySeq, &refs->seq_col_},
                           {kHistoryEnd, &refs->end_col_},
                           {kHistoryLen, &refs->len_col_}}) {
    auto c = stored.Require(name, DType::kInt64, Layout::kScalar);
    if (!c.ok()) return bad(std::string(c.status().message()));
    *col = *c;
  }
  const std::string seq_path =
      (std::filesystem::path(file_path).parent_path() / file->second).string();
  auto store = SequenceStore::Open(seq_path, id->second);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat(file_path, ": its histories are stored in ", file->second,
                                     " next to it, which is unusable (", store.status().message(),
                                     "); keep the files of one ingest together, or re-ingest"));
  }
  refs->store_ = *std::move(store);
  for (const auto& [key, value] : stored.metadata) {
    if (!absl::StartsWith(key, kSequenceFeaturePrefix)) continue;
    Derived d;
    d.spec.name = key.substr(sizeof(kSequenceFeaturePrefix) - 1);
    d.spec.dtype = DType::kInt64;
    d.spec.layout = Layout::kJagged;
    std::vector<std::string> parts = absl::StrSplit(value, '|');
    if (parts.size() != 2) return bad(absl::StrCat(key, " = '", value, "': want TABLE|SOURCE"));
    d.spec.table = parts[0];
    std::string column = parts[1];
    if (absl::StartsWith(column, "time_bucket:")) {
      std::vector<std::string> tb = absl::StrSplit(column, ':');
      if (tb.size() != 3) return bad(absl::StrCat(key, ": want time_bucket:COLUMN:FEATURE"));
      auto anchor = stored.Require(tb[2], DType::kInt64, Layout::kScalar);
      if (!anchor.ok()) return bad(std::string(anchor.status().message()));
      d.anchor = *anchor;
      column = tb[1];
    }
    d.column = refs->store_->Find(column);
    if (d.column < 0) return bad(absl::StrCat(key, ": the sequence file has no column '", column, "'"));
    if (logical->Find(d.spec.name) >= 0) {
      return bad(absl::StrCat(key, ": feature '", d.spec.name, "' is also stored"));
    }
    logical->features.push_back(d.spec);
    refs->derived_.push_back(std::move(d));
  }
  return std::shared_ptr<const SequenceRefs>(std::move(refs));
}

bool SequenceRefs::Valid(int64_t seq, int64_t end, int64_t len) const {
  return seq >= 0 && static_cast<uint64_t>(seq) < store_->num_sequences() && len >= 0 &&
         len <= end && static_cast<uint64_t>(end) <= store_->length(seq);
}

void SequenceRefs::Append(size_t d, int64_t seq, int64_t end, int64_t len, int64_t anchor,
                          Column* out) const {
  const Derived& f = derived_[d];
  const int64_t* from = store_->events(f.column, seq) + (end - len);
  const size_t old = out->i64.size();
  out->i64.resize(old + len);
  int64_t* to = out->i64.data() + old;
  if (f.anchor < 0) {
    for (int64_t i = 0; i < len; ++i) to[i] = from[i];
  } else {
    for (int64_t i = 0; i < len; ++i) to[i] = TimeBucket(anchor, from[i]);
  }
  out->offsets.push_back(out->i64.size());
}

}  // namespace recfleet::data
