#include "engine/testing/movielens.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "engine/metrics.h"

namespace recfleet::engine {
namespace {

constexpr double kSmoothing = 10.0;
constexpr int kRatingRows = 6;   // Ratings 0..5 (MovieLens uses 1..5).
constexpr int kTimeBuckets = 16;

// A tab-separated atomic file: header names (without ":type") and rows.
struct AtomicFile {
  std::string path;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;

  absl::StatusOr<int> Column(absl::string_view name) const {
    for (size_t i = 0; i < columns.size(); ++i) {
      if (columns[i] == name) return static_cast<int>(i);
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header has no column '", name, "' (expected name:type columns)"));
  }
};

bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

absl::StatusOr<AtomicFile> ReadAtomicFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  AtomicFile f;
  f.path = path;
  std::string line;
  if (!std::getline(in, line)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": empty file, expected a header line"));
  }
  for (absl::string_view col : absl::StrSplit(line, '\t')) {
    f.columns.emplace_back(col.substr(0, col.find(':')));
  }
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::vector<std::string> row = absl::StrSplit(line, '\t');
    if (row.size() != f.columns.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": expected ",
                                                     f.columns.size(), " tab-separated fields, got ",
                                                     row.size()));
    }
    f.rows.push_back(std::move(row));
  }
  return f;
}

int64_t Intern(absl::flat_hash_map<std::string, int64_t>& vocab, const std::string& key) {
  auto it = vocab.try_emplace(key, static_cast<int64_t>(vocab.size())).first;
  return it->second;
}

// 0 for gaps under an hour, then one bucket per doubling of the gap.
int64_t TimeBucket(int64_t gap_seconds) {
  const int64_t hours = std::max<int64_t>(gap_seconds, 0) / 3600;
  if (hours == 0) return 0;
  return std::min<int64_t>(kTimeBuckets - 1, 1 + static_cast<int64_t>(std::log2(hours)));
}

}  // namespace

absl::StatusOr<MovieLensData> ReadMovieLens(const std::string& dir) {
  std::string base = dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const std::string name = base.substr(base.find_last_of('/') + 1);
  const std::string prefix = absl::StrCat(base, "/", name);

  absl::StatusOr<AtomicFile> inter = ReadAtomicFile(prefix + ".inter");
  if (!inter.ok()) return inter.status();
  MovieLensData data;
  absl::flat_hash_map<std::string, int64_t> users, items;
  {
    absl::StatusOr<int> u = inter->Column("user_id"), i = inter->Column("item_id"),
                        r = inter->Column("rating"), t = inter->Column("timestamp");
    for (const auto* c : {&u, &i, &r, &t}) {
      if (!c->ok()) return c->status();
    }
    data.ratings.reserve(inter->rows.size());
    for (size_t n = 0; n < inter->rows.size(); ++n) {
      const auto& row = inter->rows[n];
      MovieLensData::Rating rating;
      double ts = 0;
      if (!absl::SimpleAtof(row[*r], &rating.rating) || !absl::SimpleAtod(row[*t], &ts)) {
        return absl::InvalidArgumentError(absl::StrCat(
            inter->path, ": data row ", n + 1, ": rating and timestamp must be numbers, got '",
            row[*r], "' and '", row[*t], "'"));
      }
      rating.timestamp = static_cast<int64_t>(ts);
      rating.user = static_cast<int32_t>(Intern(users, row[*u]));
      rating.item = static_cast<int32_t>(Intern(items, row[*i]));
      data.ratings.push_back(rating);
    }
  }
  data.num_users = static_cast<int32_t>(users.size());
  data.num_items = static_cast<int32_t>(items.size());
  data.user_attrs.resize(data.num_users);
  data.item_attrs.resize(data.num_items);

  absl::flat_hash_map<std::string, int64_t> user_vocab, item_vocab;
  if (FileExists(prefix + ".user")) {
    absl::StatusOr<AtomicFile> f = ReadAtomicFile(prefix + ".user");
    if (!f.ok()) return f.status();
    absl::StatusOr<int> id = f->Column("user_id");
    if (!id.ok()) return id.status();
    for (const auto& row : f->rows) {
      auto it = users.find(row[*id]);
      if (it == users.end()) continue;  // A user without ratings.
      std::vector<int64_t>& attrs = data.user_attrs[it->second];
      for (const char* col : {"age", "gender", "occupation"}) {
        absl::StatusOr<int> c = f->Column(col);
        if (!c.ok()) continue;
        std::string value = row[*c];
        int age = 0;
        if (std::string(col) == "age" && absl::SimpleAtoi(value, &age)) {
          value = absl::StrCat(age / 10);  // Decade of age.
        }
        attrs.push_back(Intern(user_vocab, absl::StrCat(col, "=", value)));
      }
    }
  }
  if (FileExists(prefix + ".item")) {
    absl::StatusOr<AtomicFile> f = ReadAtomicFile(prefix + ".item");
    if (!f.ok()) return f.status();
    absl::StatusOr<int> id = f->Column("item_id");
    if (!id.ok()) return id.status();
    absl::StatusOr<int> year = f->Column("release_year"), genres = f->Column("class");
    for (const auto& row : f->rows) {
      auto it = items.find(row[*id]);
      if (it == items.end()) continue;
      std::vector<int64_t>& attrs = data.item_attrs[it->second];
      int y = 0;
      if (year.ok() && absl::SimpleAtoi(row[*year], &y)) {
        attrs.push_back(Intern(item_vocab, absl::StrCat("decade=", y / 10)));
      }
      if (genres.ok()) {
        for (absl::string_view g : absl::StrSplit(row[*genres], ' ', absl::SkipEmpty())) {
          attrs.push_back(Intern(item_vocab, absl::StrCat("genre=", g)));
        }
      }
    }
  }
  data.user_attr_vocab = static_cast<int64_t>(user_vocab.size());
  data.item_attr_vocab = static_cast<int64_t>(item_vocab.size());
  return data;
}

absl::StatusOr<MovieLensCtr> MovieLensCtr::Create(MovieLensData data, const CtrOptions& options) {
  if (!(options.eval_fraction >= 0 && options.eval_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval_fraction must be in [0, 1), got ", options.eval_fraction));
  }
  if (options.max_history < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_history must be >= 1, got ", options.max_history));
  }
  if (data.ratings.empty()) return absl::InvalidArgumentError("dataset has no ratings");
  MovieLensCtr ctr;
  ctr.options_ = options;
  ctr.user_events_.resize(data.num_users);
  for (size_t i = 0; i < data.ratings.size(); ++i) {
    ctr.user_events_[data.ratings[i].user].push_back(static_cast<int32_t>(i));
  }
  for (int32_t u = 0; u < data.num_users; ++u) {
    std::vector<int32_t>& events = ctr.user_events_[u];
    // Stable: equal timestamps keep file order.
    std::stable_sort(events.begin(), events.end(), [&](int32_t a, int32_t b) {
      return data.ratings[a].timestamp < data.ratings[b].timestamp;
    });
    const int32_t n = static_cast<int32_t>(events.size());
    const int32_t held_out = static_cast<int32_t>(std::floor(options.eval_fraction * n));
    const int32_t split = n - held_out;
    for (int32_t p = 0; p < n; ++p) {
      const int32_t end = std::min(p, split);
      Sample s{u, p, std::max(0, end - options.max_history), end, {}};
      (p < split ? ctr.train_ : ctr.eval_).push_back(s);
    }
  }
  ctr.data_ = std::move(data);
  ctr.ComputeDenseFeatures();

  FeatureSchema& schema = ctr.schema_;
  auto add_table = [&](const std::string& name, int64_t rows) {
    schema.tables.push_back({name, rows});
    return static_cast<int>(schema.tables.size()) - 1;
  };
  const MovieLensData& d = ctr.data_;
  const int user = add_table("user", d.num_users);
  const int item = add_table("item", d.num_items);
  schema.id_lists.push_back({"user", user, Pooling::kSum});
  if (d.user_attr_vocab > 0) {
    schema.id_lists.push_back({"user_attr", add_table("user_attr", d.user_attr_vocab),
                               Pooling::kMean});
  }
  schema.id_lists.push_back({"item", item, Pooling::kSum});
  if (d.item_attr_vocab > 0) {
    schema.id_lists.push_back({"item_attr", add_table("item_attr", d.item_attr_vocab),
                               Pooling::kMean});
  }
  schema.sequence_fields.push_back({"item", item});
  schema.sequence_fields.push_back({"rating", add_table("rating", kRatingRows)});
  schema.sequence_fields.push_back({"time_gap", add_table("time_gap", kTimeBuckets)});
  schema.num_dense = static_cast<int>(std::tuple_size<decltype(Sample::dense)>::value);
  return ctr;
}

void MovieLensCtr::ComputeDenseFeatures() {
  const double prior = train_positive_rate();
  const double max_rating = 5.0;
  auto positive = [&](int32_t rating_index) {
    return data_.ratings[rating_index].rating >= options_.positive_rating ? 1.0 : 0.0;
  };
  // Item statistics over training events before a timestamp: each item's
  // training events sorted by time with prefix counts of positives.
  std::vector<std::vector<std::pair<int64_t, double>>> item_events(data_.num_items);
  for (const Sample& s : train_) {
    const int32_t r = user_events_[s.user][s.position];
    item_events[data_.ratings[r].item].push_back({data_.ratings[r].timestamp, positive(r)});
  }
  for (auto& events : item_events) {
    std::sort(events.begin(), events.end());
    for (size_t i = 1; i < events.size(); ++i) events[i].second += events[i - 1].second;
  }
  for (std::vector<Sample>* set : {&train_, &eval_}) {
    for (Sample& s : *set) {
      const std::vector<int32_t>& events = user_events_[s.user];
      // User: all earlier training events (not only the kept history).
      double n = 0, pos = 0, rating_sum = 0;
      for (int32_t p = 0; p < s.history_end; ++p) {
        n += 1;
        pos += positive(events[p]);
        rating_sum += data_.ratings[events[p]].rating;
      }
      const MovieLensData::Rating& r = data_.ratings[events[s.position]];
      const auto& ie = item_events[r.item];
      const size_t before =
          std::lower_bound(ie.begin(), ie.end(), std::make_pair(r.timestamp, -1.0)) - ie.begin();
      const double item_n = static_cast<double>(before);
      const double item_pos = before > 0 ? ie[before - 1].second : 0.0;
      s.dense = {
          static_cast<float>(std::log1p(s.history_end - s.history_begin) /
                             std::log1p(options_.max_history)),
          static_cast<float>((pos + kSmoothing * prior) / (n + kSmoothing)),
          static_cast<float>((rating_sum / max_rating + kSmoothing * 0.7) / (n + kSmoothing)),
          static_cast<float>((item_pos + kSmoothing * prior) / (item_n + kSmoothing)),
          static_cast<float>(std::log1p(item_n) / std::log1p(1000.0)),
      };
    }
  }
}

double MovieLensCtr::train_positive_rate() const {
  double positives = 0;
  for (const Sample& s : train_) {
    positives += data_.ratings[user_events_[s.user][s.position]].rating >= options_.positive_rating;
  }
  return train_.empty() ? 0.0 : positives / static_cast<double>(train_.size());
}

absl::StatusOr<BaselineAucs> MovieLensCtr::Baselines() const {
  std::vector<double> user_pos(data_.num_users), user_n(data_.num_users);
  std::vector<double> item_pos(data_.num_items), item_n(data_.num_items);
  for (const Sample& s : train_) {
    const MovieLensData::Rating& r = data_.ratings[user_events_[s.user][s.position]];
    const double y = r.rating >= options_.positive_rating;
    user_pos[r.user] += y;
    user_n[r.user] += 1;
    item_pos[r.item] += y;
    item_n[r.item] += 1;
  }
  const double prior = train_positive_rate();
  std::vector<double> popularity, both, labels;
  for (const Sample& s : eval_) {
    const MovieLensData::Rating& r = data_.ratings[user_events_[s.user][s.position]];
    const double item_rate = (item_pos[r.item] + kSmoothing * prior) / (item_n[r.item] + kSmoothing);
    const double user_rate = (user_pos[r.user] + kSmoothing * prior) / (user_n[r.user] + kSmoothing);
    popularity.push_back(item_rate);
    both.push_back(item_rate + user_rate);
    labels.push_back(r.rating >= options_.positive_rating ? 1.0 : 0.0);
  }
  BaselineAucs out;
  absl::StatusOr<double> a = Auc(popularity, labels);
  if (!a.ok()) return a.status();
  out.item_popularity = *a;
  a = Auc(both, labels);
  if (!a.ok()) return a.status();
  out.user_item_rate = *a;
  return out;
}

Batch MovieLensCtr::MakeBatch(bool eval, absl::Span<const int64_t> indices) const {
  const std::vector<Sample>& samples = eval ? eval_ : train_;
  Batch batch;
  batch.size = static_cast<int64_t>(indices.size());
  batch.id_lists.resize(schema_.id_lists.size());
  batch.sequence.resize(schema_.sequence_fields.size());
  const bool user_attrs = data_.user_attr_vocab > 0, item_attrs = data_.item_attr_vocab > 0;
  std::vector<int64_t> items, ratings, gaps;
  for (int64_t index : indices) {
    const Sample& s = samples[index];
    const std::vector<int32_t>& events = user_events_[s.user];
    const MovieLensData::Rating& r = data_.ratings[events[s.position]];
    int f = 0;
    batch.id_lists[f++].Append({static_cast<int64_t>(r.user)});
    if (user_attrs) batch.id_lists[f++].Append(data_.user_attrs[r.user]);
    batch.id_lists[f++].Append({static_cast<int64_t>(r.item)});
    if (item_attrs) batch.id_lists[f++].Append(data_.item_attrs[r.item]);
    items.clear();
    ratings.clear();
    gaps.clear();
    for (int32_t p = s.history_begin; p < s.history_end; ++p) {
      const MovieLensData::Rating& h = data_.ratings[events[p]];
      items.push_back(h.item);
      ratings.push_back(std::clamp<int64_t>(std::lround(h.rating), 0, kRatingRows - 1));
      gaps.push_back(TimeBucket(r.timestamp - h.timestamp));
    }
    batch.sequence[0].Append(items);
    batch.sequence[1].Append(ratings);
    batch.sequence[2].Append(gaps);
    batch.dense.insert(batch.dense.end(), s.dense.begin(), s.dense.end());
    batch.ctr_labels.push_back(r.rating >= options_.positive_rating ? 1.0f : 0.0f);
  }
  return batch;
}

}  // namespace recfleet::engine
