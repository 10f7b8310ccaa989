#include "data/ingest.h"

#include <algorithm>
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
#include "data/dataset_file.h"

namespace recfleet::data {
namespace {

// Raw string ids to dense ids 1..N in order of first appearance.
class Vocab {
 public:
  int64_t Add(absl::string_view raw) {
    auto [it, inserted] = ids_.try_emplace(raw, static_cast<int64_t>(raw_.size()) + 1);
    if (inserted) raw_.emplace_back(raw);
    return it->second;
  }
  int64_t Find(absl::string_view raw) const {
    auto it = ids_.find(raw);
    return it == ids_.end() ? 0 : it->second;
  }
  int64_t size() const { return static_cast<int64_t>(raw_.size()); }
  const std::string& raw(int64_t id) const { return raw_[id - 1]; }

 private:
  absl::flat_hash_map<std::string, int64_t> ids_;
  std::vector<std::string> raw_;
};

std::string DetectDelimiter(absl::string_view line) {
  if (absl::StrContains(line, "\t")) return "\t";
  if (absl::StrContains(line, "::")) return "::";
  if (absl::StrContains(line, ",")) return ",";
  return " ";
}

std::vector<absl::string_view> SplitFields(absl::string_view line, const std::string& delim) {
  if (delim == " ") return absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  return absl::StrSplit(line, delim);
}

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
    in_.open(path);
    if (!in_) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
    std::string first;
    if (!std::getline(in_, first)) return absl::InvalidArgumentError(path + ": file is empty");
    StripCr(&first);
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

  // Next non-blank line split into fields; false at end of file.
  bool Next(std::vector<absl::string_view>* fields) {
    while (true) {
      if (has_pending_) {
        line_ = std::move(pending_);
        has_pending_ = false;
      } else if (!std::getline(in_, line_)) {
        return false;
      }
      ++line_no_;
      StripCr(&line_);
      if (absl::StripAsciiWhitespace(line_).empty()) {
        ++blank_;
        continue;
      }
      *fields = SplitFields(line_, delim_);
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
  std::string path_;
  std::ifstream in_;
  std::string delim_;
  std::vector<std::string> names_, types_;
  std::string line_, pending_;
  bool has_pending_ = false;
  int64_t line_no_ = 0;
  int64_t blank_ = 0;
};

struct Event {
  int64_t user;
  int64_t item;
  double time;
  float rating;
  bool has_rating;
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

// log2 buckets of the hours between an earlier event and the candidate.
int64_t TimeBucket(double now, double then) {
  double hours = std::max(0.0, (now - then) / 3600.0);
  return std::min<int64_t>(63, static_cast<int64_t>(std::log2(1 + hours)));
}

}  // namespace

std::string IngestStats::ToString() const {
  return absl::StrCat("users ", users, ", items ", items, ", events ", events, ", train samples ",
                      train_samples, ", eval samples ", eval_samples, ", positives ", positives,
                      ", blank lines ", skipped_lines);
}

absl::StatusOr<IngestStats> Ingest(const IngestOptions& o, const std::string& out_dir) {
  if (o.max_history < 0 || o.eval_fraction < 0 || o.eval_fraction > 1) {
    return absl::InvalidArgumentError("ingest: need max_history >= 0 and 0 <= eval_fraction <= 1");
  }
  IngestStats stats;
  Vocab users, items;
  std::vector<Event> events;
  bool implicit = true;

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
        events.push_back({u, items.Add(fields[i]), static_cast<double>(i - 1), 1.0f, false});
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
    int64_t order = 0;
    while (f.Next(&fields)) {
      if (static_cast<int>(fields.size()) < needed) {
        return f.FieldError(
            static_cast<int>(fields.size()),
            absl::StrCat("expected at least ", needed, " fields, found ", fields.size()));
      }
      Event e{users.Add(absl::StripAsciiWhitespace(fields[*uc])),
              items.Add(absl::StripAsciiWhitespace(fields[*ic])), static_cast<double>(order++),
              1.0f, !implicit};
      if (*tc >= 0 && !absl::SimpleAtod(fields[*tc], &e.time)) {
        return f.FieldError(*tc, absl::StrCat("time '", fields[*tc], "' is not a number"));
      }
      if (*rc >= 0 && !absl::SimpleAtof(fields[*rc], &e.rating)) {
        return f.FieldError(*rc, absl::StrCat("rating '", fields[*rc], "' is not a number"));
      }
      events.push_back(e);
    }
    stats.skipped_lines = f.blank_lines();
  }
  if (events.empty()) return absl::InvalidArgumentError(o.path + ": no events");
  stats.users = users.size();
  stats.items = items.size();
  stats.events = static_cast<int64_t>(events.size());
  const int negatives =
      o.negatives_per_positive >= 0 ? o.negatives_per_positive : (implicit ? 1 : 0);

  AttributeTable user_attr, item_attr;
  if (!o.user_features.empty()) {
    if (auto st = user_attr.Load(o.user_features, o.user_column, o.user_feature_columns, "user_");
        !st.ok()) {
      return st;
    }
  }
  if (!o.item_features.empty()) {
    if (auto st = item_attr.Load(o.item_features, o.item_column, o.item_feature_columns, "item_");
        !st.ok()) {
      return st;
    }
  }

  // Schema.
  Schema schema;
  schema.features = {{"sample_id", DType::kInt64, Layout::kScalar, ""},
                     {"user_id", DType::kInt64, Layout::kScalar, "user"},
                     {"item_id", DType::kInt64, Layout::kScalar, "item"},
                     {"timestamp", DType::kInt64, Layout::kScalar, ""},
                     {"history_items", DType::kInt64, Layout::kJagged, "item"},
                     {"history_actions", DType::kInt64, Layout::kJagged, "action"},
                     {"history_time_buckets", DType::kInt64, Layout::kJagged, "time_bucket"}};
  for (AttributeTable* t : {&user_attr, &item_attr}) {
    for (const auto& c : t->columns) {
      schema.features.push_back(
          {c.name, DType::kInt64, c.multi ? Layout::kJagged : Layout::kScalar, c.name});
      schema.metadata[absl::StrCat("table.", c.name, ".rows")] = absl::StrCat(c.vocab.size() + 1);
    }
  }
  schema.features.push_back({"label", DType::kFloat32, Layout::kScalar, ""});
  const int label_col = static_cast<int>(schema.features.size()) - 1;
  schema.metadata["source"] = std::filesystem::path(o.path).filename().string();
  schema.metadata["length_feature"] = "history_items";
  schema.metadata["label_feature"] = "label";
  schema.metadata["label_rule"] = implicit
                                      ? absl::StrCat("implicit feedback: observed = 1, ", negatives,
                                                     " sampled negative(s) per positive = 0")
                                      : absl::StrCat("rating >= ", o.label_threshold);
  schema.metadata["split"] =
      absl::StrCat(o.split == IngestOptions::Split::kTime ? "time" : "user", ":", o.eval_fraction);
  schema.metadata["max_history"] = absl::StrCat(o.max_history);
  schema.metadata["table.user.rows"] = absl::StrCat(users.size() + 1);
  schema.metadata["table.item.rows"] = absl::StrCat(items.size() + 1);
  schema.metadata["table.action.rows"] = "16";
  schema.metadata["table.time_bucket.rows"] = "64";

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(out_dir, ": cannot create: ", ec.message()));
  WriterOptions wo;
  wo.max_rows_per_block = o.rows_per_block;
  std::unique_ptr<DatasetWriter> writers[2];
  const char* names[2] = {"train.rfd", "eval.rfd"};
  for (int s = 0; s < 2; ++s) {
    auto w = DatasetWriter::Create(absl::StrCat(out_dir, "/", names[s]), schema, wo);
    if (!w.ok()) return w.status();
    writers[s] = *std::move(w);
  }
  Batch rows[2] = {Batch(writers[0]->schema()), Batch(writers[0]->schema())};

  // Per-user attribute rows.
  auto attr_row = [](const AttributeTable& t, const std::string& raw) -> int64_t {
    auto it = t.row_of_key.find(raw);
    return it == t.row_of_key.end() ? -1 : it->second;
  };

  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.user != b.user ? a.user < b.user : a.time < b.time;
  });

  int64_t next_id = 0;
  std::vector<int64_t> hist_items, hist_actions, hist_buckets, user_items;
  auto emit = [&](int split, const std::vector<Event>& ev, size_t begin, size_t j, int64_t item,
                  float label) -> absl::Status {
    Batch& b = rows[split];
    const Event& e = ev[j];
    size_t from = j - begin > static_cast<size_t>(o.max_history) ? j - o.max_history : begin;
    hist_items.clear();
    hist_actions.clear();
    hist_buckets.clear();
    for (size_t k = from; k < j; ++k) {
      hist_items.push_back(ev[k].item);
      hist_actions.push_back(
          ev[k].has_rating ? std::clamp<int64_t>(std::lround(ev[k].rating), 0, 15) : 1);
      hist_buckets.push_back(TimeBucket(e.time, ev[k].time));
    }
    b.AddInt64(0, next_id++);
    b.AddInt64(1, e.user);
    b.AddInt64(2, item);
    b.AddInt64(3, static_cast<int64_t>(e.time));
    b.AddJaggedInt64(4, hist_items.data(), hist_items.size());
    b.AddJaggedInt64(5, hist_actions.data(), hist_actions.size());
    b.AddJaggedInt64(6, hist_buckets.data(), hist_buckets.size());
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
    add_attrs(user_attr, attr_row(user_attr, users.raw(e.user)));
    add_attrs(item_attr, attr_row(item_attr, items.raw(item)));
    b.AddFloat(label_col, label);
    stats.positives += label > 0.5f;
    (split ? stats.eval_samples : stats.train_samples) += 1;
    if (auto st = b.CommitRow(); !st.ok()) return st;
    if (b.num_rows() >= o.rows_per_block) {
      if (auto st = writers[split]->Write(b); !st.ok()) return st;
      b.Clear();
    }
    return absl::OkStatus();
  };

  for (size_t begin = 0; begin < events.size();) {
    size_t end = begin;
    while (end < events.size() && events[end].user == events[begin].user) ++end;
    const int64_t user = events[begin].user;
    const size_t n = end - begin;
    size_t first_eval = n;  // Index (within the user) of the first eval event.
    if (o.split == IngestOptions::Split::kTime) {
      first_eval = n - static_cast<size_t>(std::llround(n * o.eval_fraction));
    } else if (static_cast<double>(Mix(user ^ (o.seed << 32)) >> 11) / (1ull << 53) <
               o.eval_fraction) {
      first_eval = 0;
    }
    user_items.clear();
    for (size_t k = begin; k < end; ++k) user_items.push_back(events[k].item);
    std::sort(user_items.begin(), user_items.end());
    std::mt19937_64 rng(Mix(o.seed * 0x100000001B3ull + user));
    for (size_t j = begin; j < end; ++j) {
      int split = j - begin >= first_eval ? 1 : 0;
      const Event& e = events[j];
      float label = e.has_rating ? (e.rating >= o.label_threshold ? 1.0f : 0.0f) : 1.0f;
      if (auto st = emit(split, events, begin, j, e.item, label); !st.ok()) return st;
      for (int k = 0; k < negatives; ++k) {
        // An item the user never interacted with; give up after a few tries
        // for users who saw nearly everything.
        for (int attempt = 0; attempt < 64; ++attempt) {
          int64_t cand = 1 + static_cast<int64_t>(rng() % items.size());
          if (!std::binary_search(user_items.begin(), user_items.end(), cand)) {
            if (auto st = emit(split, events, begin, j, cand, 0.0f); !st.ok()) return st;
            break;
          }
        }
      }
    }
    begin = end;
  }
  for (int s = 0; s < 2; ++s) {
    if (auto st = writers[s]->Write(rows[s]); !st.ok()) return st;
    if (auto st = writers[s]->Close(); !st.ok()) return st;
  }
  if (auto st = WriteVocab(out_dir + "/vocab_user.tsv", users); !st.ok()) return st;
  if (auto st = WriteVocab(out_dir + "/vocab_item.tsv", items); !st.ok()) return st;
  return stats;
}

}  // namespace recfleet::data
