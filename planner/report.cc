#include "planner/report.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/units.h"

namespace recfleet::planner {
namespace {

std::string G(double bytes) { return absl::StrFormat("%.2f", bytes / kGiB); }
std::string Ms(double s) { return absl::StrFormat("%.3f", s * 1e3); }
std::string Bytes(double b) {
  if (b >= kGiB) return absl::StrFormat("%.2f GiB", b / kGiB);
  if (b >= 1 << 20) return absl::StrFormat("%.2f MiB", b / (1 << 20));
  if (b >= 1 << 10) return absl::StrFormat("%.2f KiB", b / (1 << 10));
  return absl::StrFormat("%.0f B", b);
}

std::string GroupLevels(const Topology& t, int size, int stride) {
  return DescribeGroup(MakeGroup(t, size, stride));
}

// A fixed-width text table: columns sized to their widest cell.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render() const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& row : rows_) {
      for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
        width[i] = std::max(width[i], row[i].size());
      }
    }
    std::string out;
    for (size_t r = 0; r < rows_.size(); ++r) {
      std::string line = " ";
      for (size_t i = 0; i < rows_[r].size(); ++i) {
        absl::StrAppend(&line, " ", rows_[r][i], std::string(width[i] - rows_[r][i].size(), ' '));
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      absl::StrAppend(&out, line, "\n");
      if (r == 0) {
        size_t total = 1;
        for (size_t w : width) total += w + 1;
        absl::StrAppend(&out, "  ", std::string(total - 2, '-'), "\n");
      }
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string RanksOf(const TableSharding& ts, int group) {
  if (ts.ranks.empty()) return absl::StrCat("all ", group);
  std::vector<int> sorted = ts.ranks;
  std::sort(sorted.begin(), sorted.end());
  return absl::StrJoin(sorted, ",");
}

// Group positions ordered fullest first.
std::vector<size_t> ByMemory(const Plan& plan) {
  std::vector<size_t> idx(plan.rank_memory.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return plan.rank_memory[a].Total() > plan.rank_memory[b].Total();
  });
  return idx;
}

// ---------------------------------------------------------------- JSON

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// 15 significant digits: byte counts below 1e15 exactly (to the byte),
// times and ratios without float noise.
std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.15g", v);
}

// Builds one JSON object as "key": value pairs.
class Obj {
 public:
  Obj& Raw(const std::string& key, const std::string& json) {
    parts_.push_back(absl::StrCat(Quote(key), ":", json));
    return *this;
  }
  Obj& Str(const std::string& key, const std::string& v) { return Raw(key, Quote(v)); }
  Obj& N(const std::string& key, double v) { return Raw(key, Num(v)); }
  std::string Done() const { return absl::StrCat("{", absl::StrJoin(parts_, ","), "}"); }

 private:
  std::vector<std::string> parts_;
};

std::string Array(const std::vector<std::string>& items) {
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

std::string LevelsJson(const std::array<double, kNumLevels>& v) {
  Obj o;
  for (int l = 0; l < kNumLevels; ++l) o.N(LinkLevelName(l), v[l]);
  return o.Done();
}

std::string MemoryJson(const MemoryBreakdown& m) {
  return Obj()
      .N("embedding_bytes", m.embedding)
      .N("dense_bytes", m.dense)
      .N("optimizer_bytes", m.optimizer)
      .N("activation_bytes", m.activations)
      .N("buffer_bytes", m.buffers)
      .N("total_bytes", m.Total())
      .Done();
}

// ---------------------------------------------------------------- HTML

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

const char* kMemColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f"};
const char* kMemNames[] = {"embedding shards", "dense shards", "optimizer + grads",
                           "activations", "buffers"};

std::string Legend(int n, const char* const* names, const char* const* colors, int y) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&s, absl::StrFormat(
                            "<rect x='%d' y='%d' width='12' height='12' fill='%s'/>"
                            "<text x='%d' y='%d' font-size='12'>%s</text>",
                            10 + i * 150, y, colors[i], 26 + i * 150, y + 11, names[i]));
  }
  return s;
}

std::string MemorySvg(const Plan& plan) {
  const int kMaxBars = 256;
  const size_t n = plan.rank_memory.size();
  // Every group repeats the pattern; sample evenly when it is long.
  std::vector<size_t> shown;
  for (size_t i = 0; i < n; i += std::max<size_t>(1, n / kMaxBars)) shown.push_back(i);
  const int width = 900, height = 260, left = 50, top = 30, plot_h = 190;
  const double scale = plot_h / plan.topology.hbm_bytes_per_gpu;
  const double bar_w = static_cast<double>(width - left - 10) / shown.size();
  std::string s = absl::StrFormat(
      "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d'>", width, height + 30);
  for (size_t k = 0; k < shown.size(); ++k) {
    const MemoryBreakdown& m = plan.rank_memory[shown[k]];
    const double parts[] = {m.embedding, m.dense, m.optimizer, m.activations, m.buffers};
    double y = top + plot_h;
    for (int p = 0; p < 5; ++p) {
      const double h = parts[p] * scale;
      y -= h;
      absl::StrAppend(&s, absl::StrFormat(
                              "<rect x='%.2f' y='%.2f' width='%.2f' height='%.2f' fill='%s'>"
                              "<title>position %d: %s %s GiB</title></rect>",
                              left + k * bar_w, y, std::max(bar_w - 1, 0.5), h, kMemColors[p],
                              shown[k], kMemNames[p], G(parts[p])));
    }
  }
  const double usable_y = top + plot_h - plan.hbm_usable_bytes * scale;
  absl::StrAppend(
      &s,
      absl::StrFormat("<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='black' "
                      "stroke-dasharray='4'/><text x='%d' y='%.1f' font-size='11' "
                      "text-anchor='end'>usable %s GiB</text>",
                      left, width - 10, usable_y, usable_y, width - 10, usable_y + 12,
                      G(plan.hbm_usable_bytes)),
      absl::StrFormat("<line x1='%d' x2='%d' y1='%d' y2='%d' stroke='black'/>"
                      "<text x='%d' y='%d' font-size='11'>HBM %s GiB</text>",
                      left, width - 10, top, top, left + 4, top - 3,
                      G(plan.topology.hbm_bytes_per_gpu)),
      absl::StrFormat("<text x='%d' y='%d' font-size='11'>model-parallel group position "
                      "(%zu of %zu shown)</text>",
                      left, top + plot_h + 14, shown.size(), n),
      Legend(5, kMemNames, kMemColors, height + 10), "</svg>");
  return s;
}

std::string TrafficSvg(const Plan& plan) {
  const int width = 900, row = 34, left = 110;
  double max_bytes = 1, max_s = 1e-12;
  std::array<double, kNumLevels> seconds = {0, 0, 0};
  for (const CommOp& op : plan.comm) {
    for (int l = 0; l < kNumLevels; ++l) seconds[l] += op.cost.seconds_per_level[l];
  }
  for (int l = 0; l < kNumLevels; ++l) {
    max_bytes = std::max(max_bytes, plan.traffic_bytes_per_level[l]);
    max_s = std::max(max_s, seconds[l]);
  }
  // Each half leaves 150 px for its value label.
  const double plot_w = (width - left) / 2.0 - 170;
  std::string s = absl::StrFormat(
      "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d'>"
      "<text x='%d' y='14' font-size='12'>bytes sent per GPU per step</text>"
      "<text x='%.0f' y='14' font-size='12'>communication time (red: exposed)</text>",
      width, 30 + row * kNumLevels, left, left + plot_w + 170);
  for (int l = 0; l < kNumLevels; ++l) {
    const double y = 24 + l * row;
    const double wb = plan.traffic_bytes_per_level[l] / max_bytes * plot_w;
    const double wt = seconds[l] / max_s * plot_w;
    const double we = plan.step.exposed_s[l] / max_s * plot_w;
    const double x2 = left + plot_w + 170;
    absl::StrAppend(
        &s,
        absl::StrFormat("<text x='4' y='%.0f' font-size='12'>%s</text>", y + 16, LinkLevelName(l)),
        absl::StrFormat("<rect x='%d' y='%.0f' width='%.1f' height='22' fill='#4e79a7'/>"
                        "<text x='%.1f' y='%.0f' font-size='11'>%s</text>",
                        left, y, wb, left + wb + 4, y + 15, Bytes(plan.traffic_bytes_per_level[l])),
        absl::StrFormat("<rect x='%.0f' y='%.0f' width='%.1f' height='22' fill='#a0cbe8'/>"
                        "<rect x='%.0f' y='%.0f' width='%.1f' height='22' fill='#e15759'/>"
                        "<text x='%.1f' y='%.0f' font-size='11'>%s ms (%s exposed)</text>",
                        x2, y, wt, x2, y, we, x2 + wt + 4, y + 15, Ms(seconds[l]),
                        Ms(plan.step.exposed_s[l])));
  }
  return s + "</svg>";
}

std::string StepSvg(const Plan& plan) {
  const StepTime& st = plan.step;
  const double parts[] = {st.sparse_compute_s, st.dense_compute_s,     st.optimizer_s,
                          st.other_compute_s,  st.recompute_s,         st.exposed_s[kNvlink],
                          st.exposed_s[kZone], st.exposed_s[kCrossZone], st.rank_sync_s};
  const char* names[] = {"sparse lookups", "dense compute",  "optimizer",    "other compute",
                         "recompute",      "exposed nvlink", "exposed zone", "exposed cross-zone",
                         "rank sync"};
  const char* colors[] = {"#4e79a7", "#59a14f", "#76b7b2", "#9c755f", "#edc948",
                          "#f28e2b", "#e15759", "#b07aa1", "#bab0ac"};
  const int width = 900;
  std::string s = absl::StrFormat("<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='104'>",
                                  width);
  double x = 10;
  constexpr int kParts = sizeof(parts) / sizeof(parts[0]);
  for (int i = 0; i < kParts; ++i) {
    const double w = st.total_s > 0 ? parts[i] / st.total_s * (width - 20) : 0;
    absl::StrAppend(&s, absl::StrFormat("<rect x='%.1f' y='4' width='%.1f' height='24' fill='%s'>"
                                        "<title>%s %s ms</title></rect>",
                                        x, w, colors[i], names[i], Ms(parts[i])));
    x += w;
  }
  std::string legend;
  for (int i = 0; i < kParts; ++i) {
    absl::StrAppend(&legend,
                    absl::StrFormat("<rect x='%d' y='%d' width='12' height='12' fill='%s'/>"
                                    "<text x='%d' y='%d' font-size='11'>%s %s ms</text>",
                                    10 + (i % 4) * 225, 38 + (i / 4) * 20, colors[i],
                                    26 + (i % 4) * 225, 49 + (i / 4) * 20, names[i], Ms(parts[i])));
  }
  return s + legend + "</svg>";
}

}  // namespace

std::string FormatText(const Plan& plan, const TextOptions& options) {
  const Topology& t = plan.topology;
  const StepTime& st = plan.step;
  const SparseLayout& sp = plan.sparse;
  std::string out;
  absl::StrAppendFormat(
      &out,
      "Plan for '%s' on '%s': %d GPUs (%d nodes x %d GPUs, %d zone(s)), local batch %d, global "
      "batch %d\n%d candidate (mesh, layout) pairs evaluated\n\n",
      plan.model_name, t.name, plan.world, t.num_nodes, t.gpus_per_node, t.NumZones(),
      plan.local_batch, plan.local_batch * plan.world, plan.candidates_evaluated);

  absl::StrAppend(&out, "PREDICTED STEP\n");
  TextTable step({"part", "ms", "share"});
  auto share = [&](double s) {
    return absl::StrFormat("%.1f%%", st.total_s > 0 ? 100 * s / st.total_s : 0);
  };
  step.Add({"sparse lookups (busiest rank)", Ms(st.sparse_compute_s), share(st.sparse_compute_s)});
  step.Add({"dense compute (fwd+bwd)", Ms(st.dense_compute_s), share(st.dense_compute_s)});
  step.Add({"dense optimizer (shards)", Ms(st.optimizer_s), share(st.optimizer_s)});
  if (st.other_compute_s > 0) {
    step.Add({"other compute (measured: elementwise, launches)", Ms(st.other_compute_s),
              share(st.other_compute_s)});
  }
  step.Add({"recompute (checkpointing)", Ms(st.recompute_s), share(st.recompute_s)});
  for (int l = 0; l < kNumLevels; ++l) {
    step.Add({absl::StrCat("exposed comm: ", LinkLevelName(l)), Ms(st.exposed_s[l]),
              share(st.exposed_s[l])});
  }
  if (st.rank_sync_s > 0) {
    step.Add({"rank synchronization (measured)", Ms(st.rank_sync_s), share(st.rank_sync_s)});
  }
  step.Add({"step", Ms(st.total_s), "100%"});
  absl::StrAppend(&out, step.Render());
  absl::StrAppendFormat(&out,
                        "  scaling ratio %.3f (compute / step); local MFU %.1f%%, E2E MFU %.1f%% "
                        "of %s peak (%.3g useful dense FLOPs per GPU per step)\n\n",
                        st.scaling_ratio, 100 * st.local_mfu, 100 * st.e2e_mfu,
                        t.peak_flops_per_gpu >= 1e12
                            ? absl::StrFormat("%.0f TFLOP/s", t.peak_flops_per_gpu / 1e12)
                            : absl::StrFormat("%.3g GFLOP/s", t.peak_flops_per_gpu / 1e9),
                        st.model_flops);

  absl::StrAppend(&out, "DENSE MESH\n");
  absl::StrAppendFormat(&out, "  FSDP group %d (%s), %d replica(s)\n", plan.dense.fsdp_group,
                        GroupLevels(t, plan.dense.fsdp_group, 1), plan.dense.replicas);
  for (const ExpertChoice& e : plan.dense.experts) {
    absl::StrAppendFormat(&out, "  %s: %s\n", e.module,
                          e.ep_degree > 1 ? absl::StrCat("EP ", e.ep_degree) : "no EP");
  }
  absl::StrAppend(&out, "\nSPARSE LAYOUT\n");
  absl::StrAppendFormat(
      &out,
      "  %s: model-parallel group %d (stride %d, %s), %d group(s), V3 shard degree %d, %d table "
      "cop%s; lookup imbalance %.2fx\n\n",
      SparseSchemeName(sp.scheme), sp.mp_group, sp.mp_stride,
      GroupLevels(t, sp.mp_group, sp.mp_stride), sp.num_mp_groups, sp.v3_shard_degree,
      sp.table_copies, sp.table_copies == 1 ? "y" : "ies", sp.sharding.compute_imbalance);

  absl::StrAppend(&out, "PLACEMENT\n");
  for (const std::string& p : plan.placement) absl::StrAppend(&out, "  ", p, "\n");

  absl::StrAppendFormat(&out, "\nPER-GPU MEMORY (GiB; usable %s of %s)\n", G(plan.hbm_usable_bytes),
                        G(t.hbm_bytes_per_gpu));
  TextTable mem({"group position", "embedding", "dense", "optimizer", "activations", "buffers",
                 "total"});
  const std::vector<size_t> order = ByMemory(plan);
  const size_t shown = std::min<size_t>(order.size(), options.max_rows);
  for (size_t k = 0; k < order.size(); ++k) {
    // The fullest positions and the emptiest one.
    if (k >= shown && k + 1 != order.size()) continue;
    const MemoryBreakdown& m = plan.rank_memory[order[k]];
    mem.Add({absl::StrCat(order[k]), G(m.embedding), G(m.dense), G(m.optimizer),
             G(m.activations), G(m.buffers), G(m.Total())});
  }
  absl::StrAppend(&out, mem.Render());
  if (shown + 1 < order.size()) {
    absl::StrAppendFormat(&out, "  (%zu fullest and the emptiest of %zu positions shown)\n", shown,
                          order.size());
  }

  absl::StrAppend(&out, "\nACTIVATION CHECKPOINT BUDGET PER REGION (GiB)\n");
  TextTable ck({"region", "full", "min (inputs only)", "budget", "recompute ms",
                "ms per GiB saved"});
  for (const RegionBudget& r : plan.checkpoint) {
    ck.Add({r.region, G(r.full_bytes), G(r.min_bytes), G(r.budget_bytes), Ms(r.recompute_s),
            Ms(r.seconds_per_gib_saved)});
  }
  absl::StrAppend(&out, ck.Render());

  absl::StrAppend(&out, "\nCOMMUNICATION PER STEP\n");
  TextTable comm({"collective", "kind", "group", "bytes", "ms", "hides behind", "window ms",
                  "exposed ms"});
  for (const CommOp& op : plan.comm) {
    comm.Add({op.name, CollectiveName(op.collective), GroupLevels(t, op.group_size, op.group_stride),
              Bytes(op.bytes), Ms(op.cost.seconds), op.window.empty() ? "(critical path)" : op.window,
              op.window.empty() ? "-" : Ms(op.window_s), Ms(op.exposed_s)});
  }
  absl::StrAppend(&out, comm.Render());

  absl::StrAppend(&out, "\nTRAFFIC PER LINK LEVEL (per GPU per step)\n");
  TextTable traffic({"level", "bytes sent", "busy ms", "exposed ms"});
  for (int l = 0; l < kNumLevels; ++l) {
    double busy = 0;
    for (const CommOp& op : plan.comm) busy += op.cost.seconds_per_level[l];
    traffic.Add({LinkLevelName(l), Bytes(plan.traffic_bytes_per_level[l]), Ms(busy),
                 Ms(st.exposed_s[l])});
  }
  absl::StrAppend(&out, traffic.Render());

  absl::StrAppend(&out, "\nTABLES\n");
  std::vector<const TableSharding*> tables;
  for (const TableSharding& ts : sp.sharding.tables) tables.push_back(&ts);
  std::stable_sort(tables.begin(), tables.end(), [](const TableSharding* a, const TableSharding* b) {
    return a->shard_bytes * a->num_shards > b->shard_bytes * b->num_shards;
  });
  TextTable tab({"table", "sharding", "shards", "group positions", "GiB per shard",
                 "lookup ms per shard"});
  for (size_t i = 0; i < tables.size() && i < static_cast<size_t>(options.max_rows); ++i) {
    const TableSharding& ts = *tables[i];
    tab.Add({ts.name, ShardingTypeName(ts.type), absl::StrCat(ts.num_shards),
             RanksOf(ts, sp.mp_group), G(ts.shard_bytes), Ms(ts.shard_compute_s)});
  }
  absl::StrAppend(&out, tab.Render());
  if (tables.size() > static_cast<size_t>(options.max_rows)) {
    absl::StrAppendFormat(&out, "  (%d largest of %zu tables shown; --json lists all)\n",
                          options.max_rows, tables.size());
  }

  absl::StrAppend(&out, "\nDECISIONS\n");
  for (const Decision& d : plan.decisions) {
    absl::StrAppendFormat(&out, "* %s: %s\n    why: %s\n", d.dimension, d.chosen, d.reason);
    for (const Alternative& a : d.alternatives) {
      absl::StrAppendFormat(&out, "    beat %s: %s\n", a.option,
                            a.feasible ? absl::StrCat(Ms(a.step_s), " ms step, ", G(a.peak_bytes),
                                                      " GiB peak; ", a.note)
                                       : absl::StrCat("infeasible: ", a.note));
    }
  }
  absl::StrAppend(&out, "\nWHY EACH TABLE IS SHARDED THAT WAY (largest first)\n");
  for (size_t i = 0; i < tables.size() && i < static_cast<size_t>(options.max_rows); ++i) {
    absl::StrAppendFormat(&out, "  %s: %s\n", tables[i]->name, tables[i]->reason);
  }
  return out;
}

std::string FormatJson(const Plan& plan) {
  const Topology& t = plan.topology;
  const StepTime& st = plan.step;
  const SparseLayout& sp = plan.sparse;
  std::vector<std::string> experts, placement, memory, regions, comm, tables, decisions;
  for (const ExpertChoice& e : plan.dense.experts) {
    experts.push_back(
        Obj().Str("module", e.module).N("ep_degree", e.ep_degree).Str("reason", e.reason).Done());
  }
  for (const std::string& p : plan.placement) placement.push_back(Quote(p));
  for (const MemoryBreakdown& m : plan.rank_memory) memory.push_back(MemoryJson(m));
  for (const RegionBudget& r : plan.checkpoint) {
    regions.push_back(Obj()
                          .Str("region", r.region)
                          .N("full_bytes", r.full_bytes)
                          .N("min_bytes", r.min_bytes)
                          .N("budget_bytes", r.budget_bytes)
                          .N("recompute_s", r.recompute_s)
                          .N("seconds_per_gib_saved", r.seconds_per_gib_saved)
                          .Done());
  }
  for (const CommOp& op : plan.comm) {
    comm.push_back(Obj()
                       .Str("name", op.name)
                       .Str("collective", CollectiveName(op.collective))
                       .Raw("gradient_sync", op.gradient_sync ? "true" : "false")
                       .N("group_size", op.group_size)
                       .N("group_stride", op.group_stride)
                       .Str("highest_level", op.highest_level < 0 ? "none"
                                                                  : LinkLevelName(op.highest_level))
                       .N("bytes", op.bytes)
                       .N("seconds", op.cost.seconds)
                       .Raw("seconds_per_level", LevelsJson(op.cost.seconds_per_level))
                       .Raw("bytes_per_level", LevelsJson(op.cost.bytes_per_level))
                       .Str("window", op.window)
                       .N("window_s", op.window_s)
                       .N("exposed_s", op.exposed_s)
                       .Raw("exposed_per_level", LevelsJson(op.exposed_per_level))
                       .Done());
  }
  for (const TableSharding& ts : sp.sharding.tables) {
    // Row-wise tables sit on every position: "all" instead of a long list.
    std::vector<std::string> ranks;
    for (int r : ts.ranks) ranks.push_back(absl::StrCat(r));
    tables.push_back(Obj()
                         .Str("table", ts.name)
                         .Str("sharding", ShardingTypeName(ts.type))
                         .N("shards", ts.num_shards)
                         .Raw("group_positions", ts.ranks.empty() ? Quote("all") : Array(ranks))
                         .N("rows_per_shard", static_cast<double>(ts.rows_per_shard))
                         .N("cols_per_shard", ts.cols_per_shard)
                         .N("shard_bytes", ts.shard_bytes)
                         .N("shard_lookup_s", ts.shard_compute_s)
                         .N("shard_out_bytes", ts.shard_out_bytes)
                         .Str("reason", ts.reason)
                         .Done());
  }
  for (const Decision& d : plan.decisions) {
    std::vector<std::string> alts;
    for (const Alternative& a : d.alternatives) {
      alts.push_back(Obj()
                         .Str("option", a.option)
                         .Raw("feasible", a.feasible ? "true" : "false")
                         .N("step_s", a.step_s)
                         .N("peak_bytes", a.peak_bytes)
                         .Str("note", a.note)
                         .Done());
    }
    decisions.push_back(Obj()
                            .Str("dimension", d.dimension)
                            .Str("chosen", d.chosen)
                            .Str("reason", d.reason)
                            .Raw("alternatives", Array(alts))
                            .Done());
  }
  return Obj()
             .Str("model", plan.model_name)
             .Raw("topology", Obj()
                                  .Str("name", t.name)
                                  .N("nodes", t.num_nodes)
                                  .N("gpus_per_node", t.gpus_per_node)
                                  .N("nodes_per_nvlink_domain", t.nodes_per_nvlink_domain)
                                  .N("nodes_per_zone", t.nodes_per_zone)
                                  .N("hbm_bytes_per_gpu", t.hbm_bytes_per_gpu)
                                  .Done())
             .N("world", plan.world)
             .N("local_batch", plan.local_batch)
             .N("global_batch", static_cast<double>(plan.local_batch) * plan.world)
             .N("candidates_evaluated", plan.candidates_evaluated)
             .Raw("dense_mesh", Obj()
                                    .N("fsdp_group", plan.dense.fsdp_group)
                                    .N("replicas", plan.dense.replicas)
                                    .N("max_ep_degree", plan.dense.MaxEpDegree())
                                    .Raw("experts", Array(experts))
                                    .Done())
             .Raw("sparse_layout", Obj()
                                       .Str("scheme", SparseSchemeName(sp.scheme))
                                       .N("mp_group", sp.mp_group)
                                       .N("mp_stride", sp.mp_stride)
                                       .N("v3_shard_degree", sp.v3_shard_degree)
                                       .N("num_mp_groups", sp.num_mp_groups)
                                       .N("table_copies", sp.table_copies)
                                       .N("lookup_imbalance", sp.sharding.compute_imbalance)
                                       .Raw("tables", Array(tables))
                                       .Done())
             .Raw("placement", Array(placement))
             .N("hbm_usable_bytes", plan.hbm_usable_bytes)
             .Raw("peak_memory", MemoryJson(plan.peak))
             .Raw("memory_per_group_position", Array(memory))
             .Raw("checkpoint_regions", Array(regions))
             .Raw("step", Obj()
                              .N("total_s", st.total_s)
                              .N("sparse_compute_s", st.sparse_compute_s)
                              .N("dense_compute_s", st.dense_compute_s)
                              .N("optimizer_s", st.optimizer_s)
                              .N("other_compute_s", st.other_compute_s)
                              .N("recompute_s", st.recompute_s)
                              .Raw("exposed_comm_s", LevelsJson(st.exposed_s))
                              .N("rank_sync_s", st.rank_sync_s)
                              .N("model_flops", st.model_flops)
                              .N("local_mfu", st.local_mfu)
                              .N("e2e_mfu", st.e2e_mfu)
                              .N("scaling_ratio", st.scaling_ratio)
                              .Done())
             .Raw("traffic_bytes_per_level", LevelsJson(plan.traffic_bytes_per_level))
             .Raw("communication", Array(comm))
             .Raw("decisions", Array(decisions))
             .Done() +
         "\n";
}

std::string FormatHtml(const Plan& plan) {
  const StepTime& st = plan.step;
  std::string out = absl::StrCat(
      "<!DOCTYPE html><html><head><meta charset='utf-8'><title>recfleet plan: ",
      Escape(plan.model_name),
      "</title><style>body{font-family:sans-serif;margin:20px;max-width:960px}"
      "td,th{padding:2px 8px;text-align:left;font-size:13px}"
      "table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}"
      "h2{font-size:17px;margin-top:24px}.alt{color:#555;font-size:13px}</style></head><body>");
  absl::StrAppendFormat(
      &out,
      "<h1>%s on %s</h1><p>%d GPUs, local batch %d. Predicted step <b>%s ms</b>; scaling ratio "
      "<b>%.3f</b>; local MFU %.1f%%, E2E MFU %.1f%%. Dense: FSDP group %d x %d replicas. Sparse: "
      "%s, model-parallel group %d, V3 shard degree %d.</p>",
      Escape(plan.model_name), Escape(plan.topology.name), plan.world, plan.local_batch,
      Ms(st.total_s), st.scaling_ratio, 100 * st.local_mfu, 100 * st.e2e_mfu,
      plan.dense.fsdp_group, plan.dense.replicas, SparseSchemeName(plan.sparse.scheme),
      plan.sparse.mp_group, plan.sparse.v3_shard_degree);
  absl::StrAppend(&out, "<h2>Step time</h2>", StepSvg(plan));
  absl::StrAppend(&out, "<h2>Per-GPU memory</h2>", MemorySvg(plan));
  absl::StrAppend(&out, "<h2>Traffic per link level</h2>", TrafficSvg(plan));
  absl::StrAppend(&out, "<h2>Decisions</h2><ul>");
  for (const Decision& d : plan.decisions) {
    absl::StrAppend(&out, "<li><b>", Escape(d.dimension), ": ", Escape(d.chosen), "</b> — ",
                    Escape(d.reason), "<ul>");
    for (const Alternative& a : d.alternatives) {
      absl::StrAppend(
          &out, "<li class='alt'>", Escape(a.option), ": ",
          Escape(a.feasible ? absl::StrCat(Ms(a.step_s), " ms, ", G(a.peak_bytes), " GiB; ", a.note)
                            : absl::StrCat("infeasible: ", a.note)),
          "</li>");
    }
    absl::StrAppend(&out, "</ul></li>");
  }
  absl::StrAppend(&out, "</ul><h2>Placement</h2><ul>");
  for (const std::string& p : plan.placement) absl::StrAppend(&out, "<li>", Escape(p), "</li>");
  absl::StrAppend(&out, "</ul><h2>Activation checkpoint budget</h2><table><tr><th>region</th>"
                        "<th>full GiB</th><th>budget GiB</th><th>recompute ms</th></tr>");
  for (const RegionBudget& r : plan.checkpoint) {
    absl::StrAppend(&out, "<tr><td>", Escape(r.region), "</td><td>", G(r.full_bytes), "</td><td>",
                    G(r.budget_bytes), "</td><td>", Ms(r.recompute_s), "</td></tr>");
  }
  absl::StrAppend(&out, "</table><h2>Communication per step</h2><table><tr><th>collective</th>"
                        "<th>group</th><th>bytes</th><th>ms</th><th>hides behind</th>"
                        "<th>exposed ms</th></tr>");
  for (const CommOp& op : plan.comm) {
    absl::StrAppend(&out, "<tr><td>", Escape(op.name), "</td><td>",
                    GroupLevels(plan.topology, op.group_size, op.group_stride), "</td><td>",
                    Bytes(op.bytes), "</td><td>", Ms(op.cost.seconds), "</td><td>",
                    Escape(op.window.empty() ? "(critical path)" : op.window), "</td><td>",
                    Ms(op.exposed_s), "</td></tr>");
  }
  absl::StrAppend(&out, "</table></body></html>\n");
  return out;
}

}  // namespace recfleet::planner
