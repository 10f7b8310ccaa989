#include "planner/sharding.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/units.h"

namespace recfleet::planner {

double LookupOutputBytes(const Table& t, double samples, int cols, double row_fraction,
                         const PrecisionRecipe& p) {
  // A row shard of a pooled table returns a partial sum for every sample.
  const double vectors = t.pooled ? samples : samples * t.pooling_factor * row_fraction;
  return vectors * cols * p.embedding_comm_bytes;
}

namespace {

constexpr double kIdBytes = 8;  // int64 ids on the input all-to-all.
// Lookup traffic through HBM, in units of the forward read: forward reads
// the rows; backward reads the gradient and reads, updates and writes the
// rows and their optimizer state.
constexpr double kLookupPasses = 4;

// One way to shard a table, before placement.
struct Option {
  ShardingType type;
  int shards;
  int64_t rows;
  int cols;
  double bytes, compute_s, out_bytes, id_bytes, touched_elements;
};

Option MakeOption(const ShardingInput& in, const Table& t, ShardingType type, int shards) {
  const PrecisionRecipe& p = *in.precision;
  const bool row_split = type == ShardingType::kRowWise || type == ShardingType::kTableWiseRowWise;
  Option o{type, shards, row_split ? (t.rows + shards - 1) / shards : t.rows,
           type == ShardingType::kColumnWise ? t.dim / shards : t.dim};
  const double row_fraction = row_split ? 1.0 / shards : 1.0;
  const double samples = static_cast<double>(in.group.size) * in.local_batch * t.access_frequency;
  const double lookups = samples * t.pooling_factor * row_fraction;
  o.bytes = (static_cast<double>(o.rows) * o.cols * p.embedding_bytes +
             static_cast<double>(o.rows) * p.embedding_optimizer_bytes_per_row) /
            in.storage_divisor;
  o.compute_s = kLookupPasses * lookups * o.cols * p.embedding_bytes /
                (in.topology->hbm_bandwidth_bytes_per_s * in.topology->ComputeShare() *
                 in.efficiency->embedding);
  o.out_bytes = LookupOutputBytes(t, samples, o.cols, row_fraction, p);
  o.id_bytes = lookups * kIdBytes;
  // Distinct rows hit by the lookups of the groups sharing this storage,
  // ids spread uniformly over the rows.
  const double hits = lookups * in.storage_divisor;
  o.touched_elements = o.rows * -std::expm1(-hits / std::max<double>(1, o.rows)) * o.cols;
  return o;
}

std::string Describe(const Option& o) {
  return absl::StrFormat("%s%s: %.3g GiB, %.3g ms per shard", ShardingTypeName(o.type),
                         o.shards > 1 ? absl::StrCat("x", o.shards) : "", o.bytes / kGiB,
                         o.compute_s * 1e3);
}

// Normalized load of a rank: each resource relative to its fair share.
struct Loads {
  std::vector<double> bytes, compute, out, ids, touched;
  double fair_bytes = 1, fair_compute = 1, fair_out = 1;
  double Score(int r) const {
    return bytes[r] / fair_bytes + compute[r] / fair_compute + out[r] / fair_out;
  }
  double ScoreWith(int r, const Option& o) const {
    return (bytes[r] + o.bytes) / fair_bytes + (compute[r] + o.compute_s) / fair_compute +
           (out[r] + o.out_bytes) / fair_out;
  }
  void Add(int r, const Option& o) {
    bytes[r] += o.bytes;
    compute[r] += o.compute_s;
    out[r] += o.out_bytes;
    ids[r] += o.id_bytes;
    touched[r] += o.touched_elements;
  }
};

absl::Status NoRoom(const Table& t, const Option& o, double limit, double least_used) {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "table '%s' (%s) does not fit: the emptiest rank of the model-parallel group has %.3f GiB "
      "of its %.3f GiB embedding budget left (over by %.3f GiB)",
      t.name, Describe(o), (limit - least_used) / kGiB, limit / kGiB,
      (o.bytes - (limit - least_used)) / kGiB));
}

}  // namespace

const char* ShardingTypeName(ShardingType type) {
  switch (type) {
    case ShardingType::kTableWise:
      return "TW";
    case ShardingType::kColumnWise:
      return "CW";
    case ShardingType::kTableWiseRowWise:
      return "TWRW";
    case ShardingType::kRowWise:
      return "RW";
  }
  return "?";
}

absl::StatusOr<ShardingResult> ShardTables(const ShardingInput& in) {
  const Model& model = *in.model;
  const int m = in.group.size;
  const int domain = in.group.factors[kNvlink];
  const double limit = in.rank_memory_limit_bytes;

  // Stage 1: enumerate options per table; the fair share comes from TW.
  std::vector<std::vector<Option>> options(model.tables.size());
  double total_bytes = 0, total_compute = 0, total_out = 0;
  for (size_t i = 0; i < model.tables.size(); ++i) {
    const Table& t = model.tables[i];
    auto& opts = options[i];
    opts.push_back(MakeOption(in, t, ShardingType::kTableWise, 1));
    for (int k = 2; k <= m && t.dim % k == 0 && t.dim / k >= in.options->min_column_shard_dim;
         k *= 2) {
      opts.push_back(MakeOption(in, t, ShardingType::kColumnWise, k));
    }
    if (domain > 1 && domain < m) {
      opts.push_back(MakeOption(in, t, ShardingType::kTableWiseRowWise, domain));
    }
    if (m > 1) opts.push_back(MakeOption(in, t, ShardingType::kRowWise, m));
    total_bytes += opts[0].bytes;
    total_compute += opts[0].compute_s;
    total_out += opts[0].out_bytes;
  }
  Loads loads;
  loads.bytes.assign(m, 0);
  loads.compute.assign(m, 0);
  loads.out.assign(m, 0);
  loads.ids.assign(m, 0);
  loads.touched.assign(m, 0);
  loads.fair_bytes = std::max(total_bytes / m, 1.0);
  loads.fair_compute = std::max(total_compute / m, 1e-12);
  loads.fair_out = std::max(total_out / m, 1.0);

  // Stage 2: choose the coarsest option within one rank's fair share.
  ShardingResult result;
  result.tables.resize(model.tables.size());
  std::vector<const Option*> chosen(model.tables.size());
  for (size_t i = 0; i < model.tables.size(); ++i) {
    const Table& t = model.tables[i];
    const auto& opts = options[i];
    const Option* pick = nullptr;
    std::string rejected;
    for (const Option& o : opts) {
      const bool fair = o.bytes <= loads.fair_bytes * (1 + 1e-9) &&
                        o.compute_s <= loads.fair_compute * (1 + 1e-9);
      if (fair && o.bytes <= limit) {
        pick = &o;
        break;
      }
      absl::StrAppend(&rejected, rejected.empty() ? "" : "; ", Describe(o),
                      o.bytes > limit ? " (over the per-rank limit)" : " (above the fair share)");
    }
    TableSharding& ts = result.tables[i];
    ts.table = static_cast<int>(i);
    ts.name = t.name;
    if (pick != nullptr) {
      ts.reason = absl::StrFormat(
          "%s is the coarsest option within one rank's fair share (%.3g GiB, %.3g ms)%s%s",
          Describe(*pick), loads.fair_bytes / kGiB, loads.fair_compute * 1e3,
          rejected.empty() ? "" : "; beat: ", rejected);
    } else {
      pick = &opts.back();  // The finest split: smallest shards.
      if (pick->bytes > limit) return NoRoom(t, *pick, limit, 0);
      ts.reason = absl::StrFormat(
          "%s: no option stays within one rank's fair share (%.3g GiB, %.3g ms), so the finest "
          "split; alternatives: %s",
          Describe(*pick), loads.fair_bytes / kGiB, loads.fair_compute * 1e3, rejected);
    }
    chosen[i] = pick;
    ts.type = pick->type;
    ts.num_shards = pick->shards;
    ts.rows_per_shard = pick->rows;
    ts.cols_per_shard = pick->cols;
    ts.shard_bytes = pick->bytes;
    ts.shard_compute_s = pick->compute_s;
    ts.shard_out_bytes = pick->out_bytes;
    ts.shard_id_bytes = pick->id_bytes;
    ts.shard_touched_bytes = pick->touched_elements * in.precision->embedding_bytes;
    result.largest_shard_bytes = std::max(result.largest_shard_bytes, pick->bytes);
  }

  // Stage 3: place. Fixed layouts (RW) first, then the rest heaviest first
  // (longest-processing-time), each on the least-loaded rank with room.
  std::vector<int> order(model.tables.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  auto weight = [&](int i) {
    const Option& o = *chosen[i];
    return o.bytes / loads.fair_bytes + o.compute_s / loads.fair_compute +
           o.out_bytes / loads.fair_out;
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const bool ra = chosen[a]->type == ShardingType::kRowWise;
    const bool rb = chosen[b]->type == ShardingType::kRowWise;
    if (ra != rb) return ra;
    return weight(a) > weight(b);
  });
  using Entry = std::pair<double, int>;  // (score, rank); ties to the lower rank.
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  bool heap_built = false;
  for (int i : order) {
    const Table& t = model.tables[i];
    const Option& o = *chosen[i];
    TableSharding& ts = result.tables[i];
    if (o.type == ShardingType::kRowWise) {
      for (int r = 0; r < m; ++r) {
        if (loads.bytes[r] + o.bytes > limit) return NoRoom(t, o, limit, loads.bytes[r]);
        loads.Add(r, o);
      }
      continue;
    }
    if (!heap_built) {
      for (int r = 0; r < m; ++r) heap.push({loads.Score(r), r});
      heap_built = true;
    }
    if (o.type == ShardingType::kTableWiseRowWise) {
      // The NVLink domain whose busiest rank would end up least loaded.
      int best = -1;
      double best_score = 0;
      for (int d = 0; d + domain <= m; d += domain) {
        double worst = 0;
        bool fits = true;
        for (int r = d; r < d + domain; ++r) {
          worst = std::max(worst, loads.ScoreWith(r, o));
          fits = fits && loads.bytes[r] + o.bytes <= limit;
        }
        if (fits && (best < 0 || worst < best_score)) {
          best = d;
          best_score = worst;
        }
      }
      if (best < 0) {
        return NoRoom(t, o, limit, *std::min_element(loads.bytes.begin(), loads.bytes.end()));
      }
      for (int r = best; r < best + domain; ++r) {
        loads.Add(r, o);
        ts.ranks.push_back(r);
        heap.push({loads.Score(r), r});
      }
      continue;
    }
    // TW / CW: pop the least-loaded ranks, skipping stale heap entries,
    // ranks without room and ranks already holding a slice of this table.
    std::vector<Entry> skipped;
    while (static_cast<int>(ts.ranks.size()) < o.shards) {
      if (heap.empty()) {
        double least = loads.bytes[0];
        for (int r = 0; r < m; ++r) {
          if (std::find(ts.ranks.begin(), ts.ranks.end(), r) == ts.ranks.end()) {
            least = std::min(least, loads.bytes[r]);
          }
        }
        return NoRoom(t, o, limit, least);
      }
      Entry e = heap.top();
      heap.pop();
      const int r = e.second;
      if (e.first != loads.Score(r)) continue;  // Stale: a newer entry exists.
      if (loads.bytes[r] + o.bytes > limit ||
          std::find(ts.ranks.begin(), ts.ranks.end(), r) != ts.ranks.end()) {
        skipped.push_back(e);
        continue;
      }
      loads.Add(r, o);
      ts.ranks.push_back(r);
      heap.push({loads.Score(r), r});
    }
    for (const Entry& e : skipped) heap.push(e);
  }

  result.rank_bytes = std::move(loads.bytes);
  result.rank_compute_s = std::move(loads.compute);
  result.rank_out_bytes = std::move(loads.out);
  result.rank_id_bytes = std::move(loads.ids);
  for (double& e : loads.touched) e *= in.precision->embedding_bytes;
  result.rank_touched_bytes = std::move(loads.touched);
  double max_c = 0, sum_c = 0;
  for (double c : result.rank_compute_s) {
    max_c = std::max(max_c, c);
    sum_c += c;
  }
  result.compute_imbalance = sum_c > 0 ? max_c / (sum_c / m) : 1;
  return result;
}

}  // namespace recfleet::planner
