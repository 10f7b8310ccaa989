#include "data/ingest.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "data/dataset_file.h"
#include "data/sequences.h"

namespace recfleet::data {
namespace {

// The value of a canonical decimal integer ("0", "17", "-3"; no sign on
// 0, no leading zeros, at most 18 digits), so that a number read this way
// names the same raw id as its string; false for anything else.
bool ParseCanonicalInt(absl::string_view s, int64_t* out) {
  const bool negative = !s.empty() && s[0] == '-';
  if (negative) s.remove_prefix(1);
  if (s.empty() || s.size() > 18 || (s[0] == '0' && (s.size() > 1 || negative))) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = negative ? -v : v;
  return true;
}

// Raw string ids to dense ids 1..N in order of first appearance. Raw ids
// that are canonical integers (most logs' ids) are looked up by value,
// which hashes and compares faster than the string.
class Vocab {
 public:
  int64_t Add(absl::string_view raw) {
    const int64_t next = static_cast<int64_t>(raw_.size()) + 1;
    int64_t number;
    int64_t id;
    if (ParseCanonicalInt(raw, &number)) {
      id = numbers_.try_emplace(number, next).first->second;
    } else {
      id = strings_.try_emplace(raw, next).first->second;
    }
    if (id == next) raw_.emplace_back(raw);
    return id;
  }
  int64_t size() const { return static_cast<int64_t>(raw_.size()); }
  const std::string& raw(int64_t id) const { return raw_[id - 1]; }

 private:
  absl::flat_hash_map<int64_t, int64_t> numbers_;
  absl::flat_hash_map<std::string, int64_t> strings_;
  std::vector<std::string> raw_;
};

// A time field: integers (Unix seconds, the common case) directly, any
// other number through SimpleAtod. Times are stored as int64, so a time
// must be finite and within +-9.2e18.
bool ParseTime(absl::string_view s, double* out) {
  int64_t v;
  if (s.size() <= 15 && ParseCanonicalInt(s, &v)) {  // Exact in a double.
    *out = static_cast<double>(v);
    return true;
  }
  return absl::SimpleAtod(s, out) && std::isfinite(*out) && std::abs(*out) < 9.2e18;
}

// A rating field: one digit (1..5 stars, 0/1 clicks) directly, any other
// number through SimpleAtof.
bool ParseRating(absl::string_view s, float* out) {
  if (s.size() == 1 && s[0] >= '0' && s[0] <= '9') {
    *out = static_cast<float>(s[0] - '0');
    return true;
  }
  return absl::SimpleAtof(s, out);
}

std::string DetectDelimiter(absl::string_view line) {
  if (absl::StrContains(line, "\t")) return "\t";
  if (absl::StrContains(line, "::")) return "::";
  if (absl::StrContains(line, ",")) return ",";
  return " ";
}

// Splits `line` at `delim` into `fields` (reusing its storage: this runs
// once per line of logs with hundreds of millions of lines).
void SplitFields(absl::string_view line, const std::string& delim,
                 std::vector<absl::string_view>* fields) {
  fields->clear();
  const char* p = line.data();
  const char* end = p + line.size();
  if (delim == " ") {  // Runs of spaces and tabs; empty fields skipped.
    while (p < end) {
      while (p < end && (*p == ' ' || *p == '\t')) ++p;
      const char* start = p;
      while (p < end && *p != ' ' && *p != '\t') ++p;
      if (p > start) fields->emplace_back(start, p - start);
    }
    return;
  }
  if (delim.size() == 1) {
    while (true) {
      const char* hit = static_cast<const char*>(std::memchr(p, delim[0], end - p));
      if (hit == nullptr) break;
      fields->emplace_back(p, hit - p);
      p = hit + 1;
    }
    fields->emplace_back(p, end - p);
    return;
  }
  size_t from = 0;
  while (true) {
    size_t hit = line.find(delim, from);
    if (hit == absl::string_view::npos) break;
    fields->push_back(line.substr(from, hit - from));
    from = hit + delim.size();
  }
  fields->push_back(line.substr(from));
}

std::vector<absl::string_view> SplitFields(absl::string_view line, const std::string& delim) {
  std::vector<absl::string_view> fields;
  SplitFields(line, delim, &fields);
  return fields;
}

// Lines of a file, read in large chunks (std::getline's per-line copy and
// stream bookkeeping cost more than the rest of parsing a line).
class LineReader {
 public:
  ~LineReader() {
    if (file_ != nullptr) std::fclose(file_);
  }
  bool Open(const std::string& path) {
    file_ = std::fopen(path.c_str(), "rb");
    return file_ != nullptr;
  }
  // The next line without its '\n'; valid until the next call. False at
  // the end of the file (a last line without '\n' is still returned).
  bool Next(absl::string_view* line) {
    while (true) {
      const char* nl =
          static_cast<const char*>(std::memchr(buf_.data() + pos_, '\n', end_ - pos_));
      if (nl != nullptr) {
        *line = absl::string_view(buf_.data() + pos_, nl - (buf_.data() + pos_));
        pos_ = nl - buf_.data() + 1;
        return true;
      }
      if (eof_) {
        if (pos_ == end_) return false;
        *line = absl::string_view(buf_.data() + pos_, end_ - pos_);
        pos_ = end_;
        return true;
      }
      // Keep the partial line, grow the buffer if the line fills it, read more.
      std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
      end_ -= pos_;
      pos_ = 0;
      if (end_ == buf_.size()) buf_.resize(buf_.size() * 2);
      const size_t got = std::fread(buf_.data() + end_, 1, buf_.size() - end_, file_);
      end_ += got;
      if (got == 0) eof_ = true;
    }
  }

 private:
  std::FILE* file_ = nullptr;
  std::vector<char> buf_ = std::vector<char>(size_t{1} << 20);
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
};

// "user_id:token" -> ("user_id", "token"); "user_id" -> ("user_id", "").
std::pair<std::string, std::string> HeaderField(absl::string_view f) {
  f = absl::StripAsciiWhitespace(f);
  size_t colon = f.find(':');
  if (colon == absl::string_view::npos) return {std::string(f), ""};
  return {std::string(f.substr(0, colon)), std::string(f.substr(colon + 1))};
}

// A delimited text file read line by line, with its header resolved.
class DelimitedFile {
 public:
  absl::Status Open(const std::string& path, std::string delim, IngestOptions::Header header,
                    const std::vector<std::string>& wanted_names) {
    path_ = path;
    if (!in_.Open(path)) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
    absl::string_view first_line;
    if (!in_.Next(&first_line)) return absl::InvalidArgumentError(path + ": file is empty");
    std::string first(first_line);
    StripCr(&first);
    if (absl::StartsWith(first, "\xFF\xFE") || absl::StartsWith(first, "\xFE\xFF")) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": line 1: starts with a UTF-16 byte-order mark; convert the file to UTF-8 "
                "(e.g. iconv -f UTF-16 -t UTF-8)"));
    }
    StripBom(&first);
    delim_ = delim == "auto" ? DetectDelimiter(first) : delim;
    std::vector<absl::string_view> fields = SplitFields(first, delim_);
    bool is_header = header == IngestOptions::Header::kYes;
    if (header == IngestOptions::Header::kAuto) {
      for (absl::string_view f : fields) {
        for (const std::string& w : wanted_names)
          is_header |= !w.empty() && HeaderField(f).first == w;
      }
    }
    if (is_header) {
      line_no_ = 1;
      for (absl::string_view f : fields) {
        auto [name, type] = HeaderField(f);
        names_.push_back(name);
        types_.push_back(type);
      }
    } else {
      pending_ = first;
      has_pending_ = true;
    }
    return absl::OkStatus();
  }

  bool has_header() const { return !names_.empty(); }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<std::string>& types() const { return types_; }
  const std::string& path() const { return path_; }
  int64_t line_no() const { return line_no_; }

  // Column index of `spec` (a header name, or a 0-based index); -1 if spec
  // is empty. `defaults` gives the index used for a well-known name when
  // the file has no header.
  absl::StatusOr<int> Resolve(const std::string& spec, const char* role, int default_index) const {
    if (spec.empty()) return -1;
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == spec) return static_cast<int>(i);
    }
    int idx;
    if (absl::SimpleAtoi(spec, &idx) && idx >= 0) return idx;
    if (!has_header() && default_index >= 0) return default_index;
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": no column '", spec, "' for the ", role,
                     has_header() ? absl::StrCat(" (header has: ", absl::StrJoin(names_, ", "), ")")
                                  : " (no header line: give a 0-based column index)"));
  }

  // Next non-blank line split into fields (valid until the next call);
  // false at end of file.
  bool Next(std::vector<absl::string_view>* fields) {
    while (true) {
      absl::string_view line;
      if (has_pending_) {
        line = pending_;
        has_pending_ = false;
      } else if (!in_.Next(&line)) {
        return false;
      }
      ++line_no_;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      // Files concatenated from several exports carry a UTF-8 byte-order
      // mark at the start of each part.
      if (!line.empty() && line[0] == '\xEF') absl::ConsumePrefix(&line, "\xEF\xBB\xBF");
      if (IsBlank(line)) {
        ++blank_;
        continue;
      }
      SplitFields(line, delim_, fields);
      return true;
    }
  }
  int64_t blank_lines() const { return blank_; }

  absl::Status FieldError(int col, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": line ", line_no_, ", column ", col, ": ", what));
  }

 private:
  static void StripCr(std::string* s) {
    if (!s->empty() && s->back() == '\r') s->pop_back();
  }
  static void StripBom(std::string* s) {
    if (absl::StartsWith(*s, "\xEF\xBB\xBF")) s->erase(0, 3);
  }
  static bool IsBlank(absl::string_view line) {
    for (char c : line) {
      if (!absl::ascii_isspace(static_cast<unsigned char>(c))) return false;
    }
    return true;
  }
  std::string path_;
  LineReader in_;
  std::string delim_;
  std::vector<std::string> names_, types_;
  std::string pending_;
  bool has_pending_ = false;
  int64_t line_no_ = 0;
  int64_t blank_ = 0;
};

// One event of the log. `order` (its position in the file) breaks time
// ties, so the sort is stable even across spilled runs.
struct Event {
  int64_t user;
  int64_t item;
  double time;
  int64_t order;
  float rating;
  bool has_rating;
};

bool EventLess(const Event& a, const Event& b) {
  if (a.user != b.user) return a.user < b.user;
  if (a.time != b.time) return a.time < b.time;
  return a.order < b.order;
}

// Events sorted by (user, time, file order) with bounded memory: Add()
// collects up to `buffer_events` events, then sorts them and spills them to
// a run file in `dir`; Next() merges the runs (or, when nothing was
// spilled, walks the one sorted buffer). Memory: the buffer, plus 64 KiB
// per run while merging.
class EventSorter {
 public:
  EventSorter(std::string dir, size_t buffer_events)
      : dir_(std::move(dir)), buffer_events_(std::max<size_t>(1, buffer_events)) {}
  ~EventSorter() {
    for (Run& r : runs_) {
      if (r.file != nullptr) std::fclose(r.file);
      std::remove(r.path.c_str());
    }
  }

  absl::Status Add(const Event& e) {
    buffer_.push_back(e);
    if (buffer_.size() >= buffer_events_) return Spill();
    return absl::OkStatus();
  }

  // Call once after the last Add().
  absl::Status Finish() {
    if (runs_.empty()) {
      SortBuffer();
      std::vector<Event>().swap(sorted_);
      return absl::OkStatus();
    }
    RECFLEET_RETURN_IF_ERROR(Spill());
    std::vector<Event>().swap(buffer_);
    std::vector<Event>().swap(sorted_);
    for (size_t i = 0; i < runs_.size(); ++i) {
      Run& r = runs_[i];
      r.file = std::fopen(r.path.c_str(), "rb");
      if (r.file == nullptr) return absl::UnavailableError(r.path + ": cannot reopen sort run");
      if (Refill(&r)) heap_.push_back(i);
    }
    std::make_heap(heap_.begin(), heap_.end(), HeapLess{this});
    return absl::OkStatus();
  }

  bool Next(Event* e) {
    if (runs_.empty()) {
      if (next_ == buffer_.size()) return false;
      *e = buffer_[next_++];
      return true;
    }
    if (heap_.empty()) return false;
    std::pop_heap(heap_.begin(), heap_.end(), HeapLess{this});
    Run& r = runs_[heap_.back()];
    *e = r.buf[r.pos++];
    if (r.pos == r.buf.size() && !Refill(&r)) {
      heap_.pop_back();
    } else {
      std::push_heap(heap_.begin(), heap_.end(), HeapLess{this});
    }
    return true;
  }

  size_t runs() const { return runs_.size(); }

 private:
  struct Run {
    std::string path;
    std::FILE* file = nullptr;
    std::vector<Event> buf;
    size_t pos = 0;
  };
  struct HeapLess {
    const EventSorter* s;
    bool operator()(size_t a, size_t b) const {
      const Run& x = s->runs_[a];
      const Run& y = s->runs_[b];
      return EventLess(y.buf[y.pos], x.buf[x.pos]);  // Min-heap.
    }
  };

  // Sorts `buffer_` by EventLess. The buffer holds events in file order
  // and users are dense ids, so a stable counting sort by user followed by
  // a stable sort by time of each user's events (most logs list a user's
  // events in time order already: then only checked) gives the same order
  // several times faster than comparing whole events.
  void SortBuffer() {
    if (buffer_.empty()) return;
    int64_t lo = buffer_[0].user, hi = lo;
    for (const Event& e : buffer_) {
      lo = std::min(lo, e.user);
      hi = std::max(hi, e.user);
    }
    const size_t range = static_cast<size_t>(hi - lo) + 1;
    if (range > 4 * buffer_.size() + 1024) {  // Sparse users: counting costs more.
      std::sort(buffer_.begin(), buffer_.end(), EventLess);
      return;
    }
    std::vector<size_t> start(range + 1, 0);
    for (const Event& e : buffer_) ++start[e.user - lo + 1];
    for (size_t u = 0; u < range; ++u) start[u + 1] += start[u];
    sorted_.resize(buffer_.size());
    std::vector<size_t> next(start.begin(), start.end() - 1);
    for (const Event& e : buffer_) sorted_[next[e.user - lo]++] = e;
    auto by_time = [](const Event& a, const Event& b) { return a.time < b.time; };
    for (size_t u = 0; u < range; ++u) {
      auto first = sorted_.begin() + start[u], last = sorted_.begin() + start[u + 1];
      if (!std::is_sorted(first, last, by_time)) std::stable_sort(first, last, by_time);
    }
    buffer_.swap(sorted_);
  }

  absl::Status Spill() {
    if (buffer_.empty()) return absl::OkStatus();
    SortBuffer();
    Run r;
    r.path = absl::StrCat(dir_, "/.ingest-sort-", runs_.size(), ".tmp");
    std::FILE* f = std::fopen(r.path.c_str(), "wb");
    if (f == nullptr) return absl::UnavailableError(r.path + ": cannot create sort run");
    bool ok = std::fwrite(buffer_.data(), sizeof(Event), buffer_.size(), f) == buffer_.size();
    ok &= std::fclose(f) == 0;
    runs_.push_back(std::move(r));
    if (!ok) return absl::UnavailableError(runs_.back().path + ": write failed (disk full?)");
    buffer_.clear();
    return absl::OkStatus();
  }

  static bool Refill(Run* r) {
    constexpr size_t kRunBuffer = (64 << 10) / sizeof(Event);
    r->buf.resize(kRunBuffer);
    r->buf.resize(std::fread(r->buf.data(), sizeof(Event), kRunBuffer, r->file));
    r->pos = 0;
    return !r->buf.empty();
  }

  std::string dir_;
  size_t buffer_events_;
  std::vector<Event> sorted_;  // SortBuffer's scratch.
  std::vector<Event> buffer_;
  size_t next_ = 0;
  std::vector<Run> runs_;
  std::vector<size_t> heap_;
};

// Calls the progress callback at most every half second.
class ProgressTicker {
 public:
  explicit ProgressTicker(const IngestOptions& o) : fn_(o.progress) {}
  void Tick(IngestProgress* p, bool force = false) {
    if (!fn_) return;
    const absl::Time now = absl::Now();
    if (!force && now - last_ < absl::Milliseconds(500)) return;
    last_ = now;
    p->seconds = absl::ToDoubleSeconds(now - start_);
    fn_(*p);
  }

 private:
  std::function<void(const IngestProgress&)> fn_;
  absl::Time start_ = absl::Now();
  absl::Time last_ = start_;
};

// Side features of users or items: per kept column, a vocabulary and each
// key's token ids (one for a scalar column, a list for ":token_seq").
struct AttributeTable {
  struct AttrColumn {
    std::string name;
    bool multi = false;
    Vocab vocab;
    std::vector<std::vector<int64_t>> values;  // Per attribute row.
  };
  std::vector<AttrColumn> columns;
  absl::flat_hash_map<std::string, int64_t> row_of_key;

  absl::Status Load(const std::string& path, const std::string& key_name,
                    const std::vector<std::string>& keep, const std::string& prefix) {
    DelimitedFile f;
    if (auto st = f.Open(path, "auto", IngestOptions::Header::kYes, {}); !st.ok()) return st;
    int key = 0;
    for (size_t i = 0; i < f.names().size(); ++i) {
      if (f.names()[i] == key_name) key = static_cast<int>(i);
    }
    std::vector<int> cols;
    for (size_t i = 0; i < f.names().size(); ++i) {
      if (static_cast<int>(i) == key) continue;
      if (!keep.empty() && std::find(keep.begin(), keep.end(), f.names()[i]) == keep.end())
        continue;
      AttrColumn c;
      c.name = prefix + f.names()[i];
      c.multi = f.types()[i] == "token_seq";
      columns.push_back(std::move(c));
      cols.push_back(static_cast<int>(i));
    }
    for (const std::string& k : keep) {
      if (std::find(f.names().begin(), f.names().end(), k) == f.names().end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": no attribute column '", k, "'"));
      }
    }
    std::vector<absl::string_view> fields;
    while (f.Next(&fields)) {
      if (fields.size() != f.names().size()) {
        return f.FieldError(
            static_cast<int>(fields.size()),
            absl::StrCat("expected ", f.names().size(), " fields, found ", fields.size()));
      }
      int64_t row = static_cast<int64_t>(row_of_key.size());
      if (!row_of_key.try_emplace(std::string(fields[key]), row).second) {
        return f.FieldError(key, absl::StrCat("key '", fields[key], "' repeats"));
      }
      for (size_t c = 0; c < cols.size(); ++c) {
        std::vector<int64_t> ids;
        absl::string_view v = absl::StripAsciiWhitespace(fields[cols[c]]);
        if (columns[c].multi) {
          for (absl::string_view tok : absl::StrSplit(v, ' ', absl::SkipEmpty())) {
            ids.push_back(columns[c].vocab.Add(tok));
          }
        } else {
          ids.push_back(v.empty() ? 0 : columns[c].vocab.Add(v));
        }
        columns[c].values.push_back(std::move(ids));
      }
    }
    return absl::OkStatus();
  }
};

absl::Status WriteVocab(const std::string& path, const Vocab& v) {
  std::ofstream out(path);
  if (!out) return absl::UnavailableError(path + ": cannot create");
  out << "dense_id\traw_id\n";
  for (int64_t i = 1; i <= v.size(); ++i) out << i << '\t' << v.raw(i) << '\n';
  return out ? absl::OkStatus() : absl::UnavailableError(path + ": write failed");
}

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A time's contribution to the content hash: the integer value for times
// a uint64 holds (every ingest of ordinary timestamps hashes as before),
// else the double's bits (a negative or huge time would make the integer
// conversion undefined).
uint64_t TimeBits(double t) {
  if (t >= 0 && t < 18446744073709551616.0) return static_cast<uint64_t>(t);
  uint64_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  return bits;
}

}  // namespace

std::string IngestStats::ToString() const {
  return absl::StrCat("users ", users, ", items ", items, ", events ", events, ", train samples ",
                      train_samples, ", eval samples ", eval_samples, ", positives ", positives,
                      ", blank lines ", skipped_lines, ", lines with bad ratings skipped ",
                      skipped_ratings);
}

absl::StatusOr<IngestStats> Ingest(const IngestOptions& o, const std::string& out_dir) {
  if (o.max_history < 0 || o.eval_fraction < 0 || o.eval_fraction > 1) {
    return absl::InvalidArgumentError("ingest: need max_history >= 0 and 0 <= eval_fraction <= 1");
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(out_dir, ": cannot create: ", ec.message()));
  IngestStats stats;
  Vocab users, items;
  bool implicit = true;
  EventSorter sorter(out_dir, o.sort_buffer_events);
  std::vector<int64_t> item_count;  // Events per dense item id.
  IngestProgress progress;
  progress.phase = "reading";
  ProgressTicker ticker(o);
  // Identifies this ingest's sequences (checked by readers of the sample
  // files): a hash of every event read.
  uint64_t content_hash = Mix(o.seed);
  auto add = [&](Event e) -> absl::Status {
    if (static_cast<size_t>(e.item) >= item_count.size()) item_count.resize(e.item + 1, 0);
    ++item_count[e.item];
    content_hash = Mix(content_hash ^ Mix(e.user * 0x100000001B3ull + e.item) ^ TimeBits(e.time));
    ++progress.events;
    if ((progress.events & 0xFFFF) == 0) ticker.Tick(&progress);
    return sorter.Add(e);
  };

  int64_t order = 0;
  if (o.input == IngestOptions::Input::kSequences) {
    DelimitedFile f;
    if (auto st = f.Open(o.path, o.delimiter == "auto" ? " " : o.delimiter,
                         IngestOptions::Header::kNo, {});
        !st.ok()) {
      return st;
    }
    std::vector<absl::string_view> fields;
    while (f.Next(&fields)) {
      int64_t u = users.Add(fields[0]);
      for (size_t i = 1; i < fields.size(); ++i) {
        RECFLEET_RETURN_IF_ERROR(
            add({u, items.Add(fields[i]), static_cast<double>(i - 1), order++, 1.0f, false}));
      }
    }
    stats.skipped_lines = f.blank_lines();
  } else {
    DelimitedFile f;
    if (auto st = f.Open(o.path, o.delimiter, o.header,
                         {o.user_column, o.item_column, o.time_column, o.rating_column});
        !st.ok()) {
      return st;
    }
    auto uc = f.Resolve(o.user_column, "user", o.user_column == "user_id" ? 0 : -1);
    auto ic = f.Resolve(o.item_column, "item", o.item_column == "item_id" ? 1 : -1);
    auto rc = f.Resolve(o.rating_column, "rating", o.rating_column == "rating" ? 2 : -1);
    auto tc = f.Resolve(o.time_column, "time", o.time_column == "timestamp" ? 3 : -1);
    for (const auto* c : {&uc, &ic, &rc, &tc}) {
      if (!c->ok()) return c->status();
    }
    implicit = *rc < 0;
    int needed = std::max({*uc, *ic, *rc, *tc}) + 1;
    std::vector<absl::string_view> fields;
    while (f.Next(&fields)) {
      if (static_cast<int>(fields.size()) < needed) {
        return f.FieldError(
            static_cast<int>(fields.size()),
            absl::StrCat("expected at least ", needed, " fields, found ", fields.size()));
      }
      Event e{0, 0, static_cast<double>(order), order, 1.0f, !implicit};
      if (*tc >= 0 && !ParseTime(fields[*tc], &e.time)) {
        return f.FieldError(*tc, absl::StrCat("time '", fields[*tc],
                                              "' is not a finite number within +-9.2e18"));
      }
      if (*tc >= 0 && !std::isfinite(e.time)) {
        return f.FieldError(*tc, absl::StrCat("time '", fields[*tc], "' is not a finite number"));
      }
      if (*rc >= 0) {
        absl::string_view r = absl::StripAsciiWhitespace(fields[*rc]);
        const bool parsed = ParseRating(r, &e.rating);
        if (parsed && !std::isfinite(e.rating) && o.bad_ratings == IngestOptions::BadRatings::kSkip) {
          ++stats.skipped_ratings;
          continue;
        }
        if (!parsed && r.empty() && o.bad_ratings == IngestOptions::BadRatings::kSkip) {
          ++stats.skipped_ratings;
          continue;
        }
        if (!parsed) {
          return f.FieldError(*rc, absl::StrCat("rating '", r, "' is not a number"));
        }
        if (!std::isfinite(e.rating)) {
          return f.FieldError(*rc, absl::StrCat("rating '", r,
                                                "' is not a finite number (--bad-ratings skip "
                                                "drops such lines)"));
        }
      }
      e.user = users.Add(absl::StripAsciiWhitespace(fields[*uc]));
      e.item = items.Add(absl::StripAsciiWhitespace(fields[*ic]));
      ++order;
      RECFLEET_RETURN_IF_ERROR(add(e));
    }
    stats.skipped_lines = f.blank_lines();
  }
  if (progress.events == 0) return absl::InvalidArgumentError(o.path + ": no events");
  RECFLEET_RETURN_IF_ERROR(sorter.Finish());
  stats.users = users.size();
  stats.items = items.size();
  stats.events = progress.events;
  stats.sort_runs = static_cast<int64_t>(sorter.runs());
  const int negatives =
      o.negatives_per_positive >= 0 ? o.negatives_per_positive : (implicit ? 1 : 0);

  AttributeTable user_attr, item_attr;
  if (!o.user_features.empty()) {
    RECFLEET_RETURN_IF_ERROR(
        user_attr.Load(o.user_features, o.user_column, o.user_feature_columns, "user_"));
  }
  if (!o.item_features.empty()) {
    RECFLEET_RETURN_IF_ERROR(
        item_attr.Load(o.item_features, o.item_column, o.item_feature_columns, "item_"));
  }
  // Attribute rows by dense id (-1: none), looked up once per id.
  auto rows_of = [](const AttributeTable& t, const Vocab& v) {
    std::vector<int64_t> rows(v.size() + 1, -1);
    if (t.columns.empty()) return rows;
    for (int64_t id = 1; id <= v.size(); ++id) {
      auto it = t.row_of_key.find(v.raw(id));
      if (it != t.row_of_key.end()) rows[id] = it->second;
    }
    return rows;
  };
  const std::vector<int64_t> user_row = rows_of(user_attr, users);
  const std::vector<int64_t> item_row = rows_of(item_attr, items);

  // The sample files store, per sample, a reference into the user's
  // sequence (data/sequences.h); the histories live once in sequences.rfs.
  const std::string sequence_id = absl::StrCat(absl::Hex(content_hash, absl::kZeroPad16));
  Schema schema;
  schema.features = {{"sample_id", DType::kInt64, Layout::kScalar, ""},
                     {"user_id", DType::kInt64, Layout::kScalar, "user"},
                     {"item_id", DType::kInt64, Layout::kScalar, "item"},
                     {"timestamp", DType::kInt64, Layout::kScalar, ""},
                     {kHistorySeq, DType::kInt64, Layout::kScalar, ""},
                     {kHistoryEnd, DType::kInt64, Layout::kScalar, ""},
                     {kHistoryLen, DType::kInt64, Layout::kScalar, ""}};
  for (AttributeTable* t : {&user_attr, &item_attr}) {
    for (const auto& c : t->columns) {
      schema.features.push_back(
          {c.name, DType::kInt64, c.multi ? Layout::kJagged : Layout::kScalar, c.name});
      schema.metadata[absl::StrCat("table.", c.name, ".rows")] = absl::StrCat(c.vocab.size() + 1);
    }
  }
  schema.features.push_back({"label", DType::kFloat32, Layout::kScalar, ""});
  const int label_col = static_cast<int>(schema.features.size()) - 1;
  const std::string source = std::filesystem::path(o.path).filename().string();
  schema.metadata["source"] = source;
  schema.metadata["length_feature"] = "history_items";
  schema.metadata["label_feature"] = "label";
  schema.metadata["label_rule"] =
      implicit ? absl::StrCat("implicit feedback: observed = 1, ", negatives, " ",
                              o.negative_sampling == IngestOptions::Negatives::kPopularity
                                  ? "popularity-weighted"
                                  : "uniform",
                              " sampled negative(s) per positive = 0")
               : absl::StrCat("rating >= ", o.label_threshold);
  schema.metadata["split"] =
      absl::StrCat(o.split == IngestOptions::Split::kTime ? "time" : "user", ":", o.eval_fraction);
  schema.metadata["max_history"] = absl::StrCat(o.max_history);
  schema.metadata["table.user.rows"] = absl::StrCat(users.size() + 1);
  schema.metadata["table.item.rows"] = absl::StrCat(items.size() + 1);
  schema.metadata["table.action.rows"] = "16";
  schema.metadata["table.time_bucket.rows"] = "64";
  schema.metadata[kSequenceFileKey] = kSequenceFileName;
  schema.metadata[kSequenceIdKey] = sequence_id;
  const std::string prefix = kSequenceFeaturePrefix;
  schema.metadata[prefix + "history_items"] = "item|items";
  schema.metadata[prefix + "history_actions"] = "action|actions";
  schema.metadata[prefix + "history_time_buckets"] = "time_bucket|time_bucket:times:timestamp";

  Schema seq_schema;
  seq_schema.features = {{"items", DType::kInt64, Layout::kJagged, "item"},
                         {"actions", DType::kInt64, Layout::kJagged, "action"},
                         {"times", DType::kInt64, Layout::kJagged, ""}};
  seq_schema.metadata[kSequenceIdKey] = sequence_id;
  seq_schema.metadata["source"] = source;

  WriterOptions wo;
  wo.max_rows_per_block = o.rows_per_block;
  std::unique_ptr<DatasetWriter> writers[2];
  const char* names[2] = {"train.rfd", "eval.rfd"};
  for (int s = 0; s < 2; ++s) {
    auto w = DatasetWriter::Create(absl::StrCat(out_dir, "/", names[s]), schema, wo);
    if (!w.ok()) return w.status();
    writers[s] = *std::move(w);
  }
  auto seq_writer =
      DatasetWriter::Create(absl::StrCat(out_dir, "/", kSequenceFileName), seq_schema, wo);
  if (!seq_writer.ok()) return seq_writer.status();
  Batch rows[2] = {Batch(writers[0]->schema()), Batch(writers[0]->schema())};
  Batch seq_rows((*seq_writer)->schema());

  // Popularity-weighted negatives: item i with probability count_i / events.
  std::vector<uint64_t> cumulative;
  if (o.negative_sampling == IngestOptions::Negatives::kPopularity) {
    cumulative.resize(items.size() + 1, 0);
    for (int64_t i = 1; i <= items.size(); ++i) {
      cumulative[i] = cumulative[i - 1] +
                      (static_cast<size_t>(i) < item_count.size() ? item_count[i] : 0);
    }
  }
  auto draw = [&](std::mt19937_64& rng) -> int64_t {
    if (cumulative.empty()) return 1 + static_cast<int64_t>(rng() % items.size());
    uint64_t x = rng() % cumulative.back();
    return std::upper_bound(cumulative.begin(), cumulative.end(), x) - cumulative.begin();
  };

  int64_t next_id = 0;
  int64_t seq_index = 0;
  std::vector<Event> ev;
  std::vector<int64_t> seq_items, seq_actions, seq_times, user_items;
  auto emit = [&](int split, size_t j, int64_t item, float label) -> absl::Status {
    Batch& b = rows[split];
    const Event& e = ev[j];
    b.AddInt64(0, next_id++);
    b.AddInt64(1, e.user);
    b.AddInt64(2, item);
    b.AddInt64(3, static_cast<int64_t>(e.time));
    b.AddInt64(4, seq_index);
    b.AddInt64(5, static_cast<int64_t>(j));
    b.AddInt64(6, std::min<int64_t>(j, o.max_history));
    int col = 7;
    auto add_attrs = [&](const AttributeTable& t, int64_t row) {
      for (const auto& c : t.columns) {
        static const std::vector<int64_t> kNone;
        const std::vector<int64_t>& v = row < 0 ? kNone : c.values[row];
        if (c.multi) {
          b.AddJaggedInt64(col, v.data(), v.size());
        } else {
          b.AddInt64(col, v.empty() ? 0 : v[0]);
        }
        ++col;
      }
    };
    add_attrs(user_attr, user_row[e.user]);
    add_attrs(item_attr, item_row[item]);
    b.AddFloat(label_col, label);
    stats.positives += label > 0.5f;
    (split ? stats.eval_samples : stats.train_samples) += 1;
    ++progress.samples;
    RECFLEET_RETURN_IF_ERROR(b.CommitRow());
    if (b.num_rows() >= o.rows_per_block) {
      RECFLEET_RETURN_IF_ERROR(writers[split]->Write(b));
      b.Clear();
    }
    return absl::OkStatus();
  };

  progress.phase = "writing";
  Event pending;
  bool has_pending = sorter.Next(&pending);
  while (has_pending) {
    ev.clear();
    const int64_t user = pending.user;
    while (has_pending && pending.user == user) {
      ev.push_back(pending);
      has_pending = sorter.Next(&pending);
    }
    const size_t n = ev.size();
    size_t first_eval = n;  // Index (within the user) of the first eval event.
    if (o.split == IngestOptions::Split::kTime) {
      first_eval = n - static_cast<size_t>(std::llround(n * o.eval_fraction));
    } else if (static_cast<double>(Mix(user ^ (o.seed << 32)) >> 11) / (1ull << 53) <
               o.eval_fraction) {
      first_eval = 0;
    }
    seq_items.clear();
    seq_actions.clear();
    seq_times.clear();
    for (const Event& e : ev) {
      seq_items.push_back(e.item);
      seq_actions.push_back(e.has_rating ? std::clamp<int64_t>(std::lround(e.rating), 0, 15) : 1);
      seq_times.push_back(static_cast<int64_t>(e.time));
    }
    seq_rows.AddJaggedInt64(0, seq_items.data(), n);
    seq_rows.AddJaggedInt64(1, seq_actions.data(), n);
    seq_rows.AddJaggedInt64(2, seq_times.data(), n);
    RECFLEET_RETURN_IF_ERROR(seq_rows.CommitRow());
    if (seq_rows.num_rows() >= o.rows_per_block) {
      RECFLEET_RETURN_IF_ERROR((*seq_writer)->Write(seq_rows));
      seq_rows.Clear();
    }
    if (negatives > 0) {
      user_items = seq_items;
      std::sort(user_items.begin(), user_items.end());
    }
    std::mt19937_64 rng(Mix(o.seed * 0x100000001B3ull + user));
    for (size_t j = 0; j < n; ++j) {
      int split = j >= first_eval ? 1 : 0;
      const Event& e = ev[j];
      float label = e.has_rating ? (e.rating >= o.label_threshold ? 1.0f : 0.0f) : 1.0f;
      RECFLEET_RETURN_IF_ERROR(emit(split, j, e.item, label));
      for (int k = 0; k < negatives; ++k) {
        // An item the user never interacted with; give up after a few tries
        // for users who saw nearly everything. The negative shares the
        // positive's history reference.
        for (int attempt = 0; attempt < 64; ++attempt) {
          int64_t cand = draw(rng);
          if (!std::binary_search(user_items.begin(), user_items.end(), cand)) {
            RECFLEET_RETURN_IF_ERROR(emit(split, j, cand, 0.0f));
            break;
          }
        }
      }
    }
    ++seq_index;
    ticker.Tick(&progress);
  }
  for (int s = 0; s < 2; ++s) {
    RECFLEET_RETURN_IF_ERROR(writers[s]->Write(rows[s]));
    RECFLEET_RETURN_IF_ERROR(writers[s]->Close());
  }
  RECFLEET_RETURN_IF_ERROR((*seq_writer)->Write(seq_rows));
  RECFLEET_RETURN_IF_ERROR((*seq_writer)->Close());
  RECFLEET_RETURN_IF_ERROR(WriteVocab(out_dir + "/vocab_user.tsv", users));
  RECFLEET_RETURN_IF_ERROR(WriteVocab(out_dir + "/vocab_item.tsv", items));
  progress.phase = "done";
  ticker.Tick(&progress, /*force=*/true);
  return stats;
}

}  // namespace recfleet::data
