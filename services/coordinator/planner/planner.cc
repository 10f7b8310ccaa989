#include "services/coordinator/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace recfleet::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Above this many EP combinations per FSDP group size, every expert module
// takes the same degree instead of being enumerated independently.
constexpr int kMaxEpCombinations = 256;

std::string GiB(double bytes) { return absl::StrFormat("%.2f GiB", bytes / kGiB); }
std::string Ms(double s) { return absl::StrFormat("%.3f ms", s * 1e3); }

std::string DescribeGroup(const GroupShape& g) {
  if (g.size <= 1) return "a single rank";
  std::vector<std::string> parts;
  for (int l = 0; l < kNumLevels; ++l) {
    if (g.factors[l] > 1) parts.push_back(absl::StrCat(LinkLevelName(l), " x", g.factors[l]));
  }
  return absl::StrJoin(parts, ", ");
}

bool IsPowerOfTwo(int v) { return v > 0 && (v & (v - 1)) == 0; }

// ---------------------------------------------------------------------------
// Stage 1: enumerate options.

struct DenseOption {
  int fsdp_group = 1;
  std::vector<int> ep;  // Per module; 1 for non-expert modules or no EP.
};

struct SparseOption {
  SparseScheme scheme = SparseScheme::kV2;
  int m = 1;  // Model-parallel group size.
  int s = 1;  // V3 shard degree.
  absl::StatusOr<ShardingResult> sharding = absl::UnknownError("not sharded");
  double emb_max = 0, out_max = 0, out_mean = 0, ids_max = 0, touched_max = 0;
  double compute_max = 0, largest_touched_table = 0;

  std::string Label() const {
    if (scheme == SparseScheme::kV1) return absl::StrCat("V1 (one group of ", m, ")");
    if (scheme == SparseScheme::kV2) return absl::StrCat("V2 groups of ", m);
    return absl::StrCat("V3 groups of ", m, ", shards split ", s, "-way");
  }
};

// Group sizes that tile the fleet and nest with its domains.
std::vector<int> GroupSizes(const Topology& t, int max_size) {
  std::vector<int> out;
  const int n = t.WorldSize();
  for (int g = 1; g <= std::min(n, max_size); ++g) {
    if (n % g != 0) continue;
    const bool nests = g <= t.NvlinkDomainSize() ? t.NvlinkDomainSize() % g == 0
                       : g <= t.ZoneSize()       ? t.ZoneSize() % g == 0 &&
                                                 g % t.NvlinkDomainSize() == 0
                                                 : g % t.ZoneSize() == 0;
    if (nests && (IsPowerOfTwo(g) || g % t.gpus_per_node == 0)) out.push_back(g);
  }
  return out;
}

std::vector<DenseOption> EnumerateDense(const Topology& t, const Model& model,
                                        const PlannerOptions& opt) {
  std::vector<DenseOption> out;
  const int max_group = opt.allow_cross_zone_non_gradient ? t.WorldSize() : t.ZoneSize();
  for (int g : GroupSizes(t, max_group)) {
    // EP degrees per module: powers of two inside one NVLink domain that
    // divide both the expert count and the FSDP group.
    std::vector<std::vector<int>> choices(model.modules.size(), std::vector<int>{1});
    int64_t combos = 1;
    for (size_t i = 0; i < model.modules.size(); ++i) {
      const DenseModule& m = model.modules[i];
      if (!m.is_expert()) continue;
      for (int e = 2; e <= std::min(t.NvlinkDomainSize(), g); e *= 2) {
        if (m.num_experts % e == 0 && g % e == 0) choices[i].push_back(e);
      }
      combos *= static_cast<int64_t>(choices[i].size());
    }
    if (combos <= kMaxEpCombinations) {
      std::vector<size_t> idx(model.modules.size(), 0);
      while (true) {
        DenseOption d{g, std::vector<int>(model.modules.size(), 1)};
        for (size_t i = 0; i < idx.size(); ++i) d.ep[i] = choices[i][idx[i]];
        out.push_back(std::move(d));
        size_t k = 0;
        while (k < idx.size() && ++idx[k] == choices[k].size()) idx[k++] = 0;
        if (k == idx.size()) break;
      }
    } else {
      for (int e = 1; e <= std::min(t.NvlinkDomainSize(), g); e *= 2) {
        DenseOption d{g, std::vector<int>(model.modules.size(), 1)};
        for (size_t i = 0; i < model.modules.size(); ++i) {
          const auto& c = choices[i];
          if (std::find(c.begin(), c.end(), e) != c.end()) d.ep[i] = e;
        }
        out.push_back(std::move(d));
      }
    }
  }
  return out;
}

std::vector<SparseOption> EnumerateSparse(const Topology& t, const PlannerOptions& opt) {
  std::vector<SparseOption> out;
  const int n = t.WorldSize();
  const int max_span = opt.allow_cross_zone_non_gradient ? n : t.ZoneSize();
  const int max_group = opt.max_model_parallel_group > 0
                            ? std::min(max_span, opt.max_model_parallel_group)
                            : max_span;
  for (int m : GroupSizes(t, max_group)) {
    if (m < n) out.push_back({SparseScheme::kV2, m, 1});
  }
  // V1 is always a candidate: the baseline the 2D layouts must beat.
  if (n > 1) out.push_back({SparseScheme::kV1, n, 1});
  for (int s = 2; s <= t.NvlinkDomainSize(); s *= 2) {
    if (t.NvlinkDomainSize() % s != 0) continue;
    for (int span : GroupSizes(t, max_span)) {
      if (span % s == 0 && span > s && span / s <= max_group) {
        out.push_back({SparseScheme::kV3, span / s, s});
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Stage 3: estimate one (mesh, layout) pair.

struct Region {
  std::string name;
  double full = 0, min = 0, fwd_s = 0;
};

struct Context {
  const Topology& topo;
  const PlanRequest& req;
  int world = 0;
  double usable = 0;
  std::vector<double> fwd_s;      // Per module, per rank.
  std::vector<double> act_bytes;  // Per module at the local batch.
  std::vector<Region> regions;    // Cheapest recompute per byte saved first.
  double ids_send_bytes = 0;
  double model_flops = 0;
};

Context MakeContext(const Topology& t, const PlanRequest& r) {
  Context c{t, r, t.WorldSize(), t.hbm_bytes_per_gpu * (1 - r.options.hbm_reserve_fraction)};
  const Model& model = r.model;
  const double b = r.local_batch;
  const double kept = r.precision.fp8_kept_activations ? 0.5 : 1.0;
  std::map<std::string, size_t> region_index;
  for (const DenseModule& m : model.modules) {
    double eff = m.op == OpKind::kGemm        ? r.efficiency.gemm
                 : m.op == OpKind::kAttention ? r.efficiency.attention
                                              : r.efficiency.elementwise;
    if (m.op == OpKind::kGemm && r.precision.fp8_modules.count(m.name)) {
      eff *= r.precision.fp8_speedup;
    }
    const double flops = model.ForwardFlopsPerSample(m) * b;
    c.model_flops += 3 * flops;
    c.fwd_s.push_back(ComputeSeconds(flops, t.peak_flops_per_gpu, eff));
    c.act_bytes.push_back(model.ActivationBytesPerSample(m) * b);
    auto [it, fresh] = region_index.emplace(m.RegionName(), c.regions.size());
    if (fresh) {
      c.regions.push_back({m.RegionName()});
      c.regions.back().min = m.io_bytes_per_sample * b * kept;
    }
    Region& reg = c.regions[it->second];
    reg.full += c.act_bytes.back() * kept;
    reg.fwd_s += c.fwd_s.back();
  }
  for (Region& reg : c.regions) reg.min = std::min(reg.min, reg.full);
  auto cost_per_byte = [](const Region& reg) {
    const double saved = reg.full - reg.min;
    return saved > 0 ? reg.fwd_s / saved : 1e300;
  };
  std::stable_sort(c.regions.begin(), c.regions.end(), [&](const Region& a, const Region& b) {
    return cost_per_byte(a) < cost_per_byte(b);
  });
  for (const Table& tab : model.tables) {
    c.ids_send_bytes += b * tab.access_frequency * tab.pooling_factor * 8;
  }
  return c;
}

void Summarize(SparseOption* o) {
  const ShardingResult& sh = *o->sharding;
  double sum_out = 0;
  for (size_t r = 0; r < sh.rank_bytes.size(); ++r) {
    o->emb_max = std::max(o->emb_max, sh.rank_bytes[r]);
    o->out_max = std::max(o->out_max, sh.rank_out_bytes[r]);
    o->ids_max = std::max(o->ids_max, sh.rank_id_bytes[r]);
    o->touched_max = std::max(o->touched_max, sh.rank_touched_bytes[r]);
    o->compute_max = std::max(o->compute_max, sh.rank_compute_s[r]);
    sum_out += sh.rank_out_bytes[r];
  }
  o->out_mean = sh.rank_out_bytes.empty() ? 0 : sum_out / sh.rank_out_bytes.size();
  for (const TableSharding& ts : sh.tables) {
    o->largest_touched_table = std::max(o->largest_touched_table, ts.shard_touched_bytes);
  }
}

struct Op {
  const char* what;
  int module;  // -1: not tied to a dense module.
  Collective collective;
  bool gradient_sync;
  GroupShape group;
  double bytes;
  int window;  // -1: on the critical path.
  CommCost cost;
  double exposed = 0;
  std::array<double, kNumLevels> exposed_level = {0, 0, 0};
};

struct Window {
  const char* what;
  int module;  // -1: not tied to a dense module.
  double compute_s;
};

struct Evaluation {
  bool feasible = false;
  bool memory_ok = false;
  std::string why_not;
  double over_bytes = 0;
  MemoryBreakdown peak;
  double sparse_buffers = 0;
  std::vector<RegionBudget> regions;
  StepTime step;
  std::vector<Op> ops;
  std::vector<Window> windows;
};

std::string OpName(const Model& model, const Op& op) {
  return op.module < 0 ? op.what : absl::StrCat(op.what, " ", model.modules[op.module].name);
}

Evaluation Evaluate(const Context& c, const DenseOption& d, const SparseOption& s) {
  Evaluation ev;
  const Topology& t = c.topo;
  const PlanRequest& r = c.req;
  const PrecisionRecipe& p = r.precision;
  const Model& model = r.model;
  const int n = static_cast<int>(model.modules.size());
  const int g = d.fsdp_group;
  const double b = r.local_batch;

  // Memory.
  MemoryBreakdown& mem = ev.peak;
  mem.embedding = s.emb_max;
  double gathered1 = 0, gathered2 = 0, grad_full = 0, ep_act = 0;
  for (int i = 0; i < n; ++i) {
    const DenseModule& m = model.modules[i];
    const double shard = static_cast<double>(m.params) / g;
    mem.dense += shard * p.master_weight_bytes;
    mem.optimizer += shard * (p.optimizer_bytes_per_param + p.gradient_shard_bytes);
    const double wb = p.fp8_modules.count(m.name) ? 1 : p.weight_gather_bytes;
    const double gathered = static_cast<double>(m.params) / d.ep[i] * wb;
    if (gathered > gathered1) {
      gathered2 = gathered1;
      gathered1 = gathered;
    } else {
      gathered2 = std::max(gathered2, gathered);
    }
    grad_full = std::max(grad_full, static_cast<double>(m.params) / d.ep[i] * p.gradient_reduce_bytes);
    if (d.ep[i] > 1) ep_act = std::max(ep_act, 2.0 * d.ep[i] * b * m.io_bytes_per_sample);
  }
  ev.sparse_buffers = s.out_max + s.out_mean + s.ids_max +
                      (s.scheme == SparseScheme::kV3 ? s.largest_touched_table : 0);
  mem.buffers = gathered1 + gathered2 + grad_full + ep_act + ev.sparse_buffers;
  const double fixed = mem.embedding + mem.dense + mem.optimizer + mem.buffers;
  double available = c.usable - fixed;
  double full = 0, minimum = 0;
  for (const Region& reg : c.regions) {
    full += reg.full;
    minimum += reg.min;
  }
  double recompute = 0;
  ev.memory_ok = minimum <= available;
  if (!ev.memory_ok) {
    ev.over_bytes = minimum - available;
    ev.why_not = absl::StrCat("over HBM by ", GiB(ev.over_bytes), " even with every region checkpointed");
    mem.activations = minimum;
  } else {
    // Cut the regions with the least recompute per byte saved first.
    double excess = std::max(0.0, full - available);
    for (const Region& reg : c.regions) {
      RegionBudget rb{reg.name, reg.full, reg.min, reg.full};
      const double saved_max = reg.full - reg.min;
      rb.seconds_per_gib_saved = saved_max > 0 ? reg.fwd_s / saved_max * kGiB : 0;
      if (excess > 0 && saved_max > 0) {
        const double cut = std::min(excess, saved_max);
        rb.budget_bytes = reg.full - cut;
        rb.recompute_s = reg.fwd_s * cut / saved_max;
        excess -= cut;
      }
      recompute += rb.recompute_s;
      mem.activations += rb.budget_bytes;
      ev.regions.push_back(rb);
    }
  }

  // Compute and overlap windows.
  const double sparse_fwd = s.compute_max * 0.25, sparse_bwd = s.compute_max * 0.75;
  double dense_fwd = 0;
  for (double f : c.fwd_s) dense_fwd += f;
  std::vector<Window>& win = ev.windows;
  auto window = [&](const char* what, int module, double seconds) {
    win.push_back({what, module, seconds});
    return static_cast<int>(win.size()) - 1;
  };
  std::vector<int> fwd_win(n), bwd_win(n);
  for (int i = 0; i < n; ++i) {
    fwd_win[i] = i == 0 ? window("sparse forward lookups", -1, sparse_fwd)
                        : window("forward of", i - 1, c.fwd_s[i - 1]);
  }
  for (int i = 0; i < n; ++i) bwd_win[i] = window("backward of", i, 2 * c.fwd_s[i]);
  const int sparse_bwd_win = window("sparse backward lookups", -1, sparse_bwd);
  const int input_win = window("previous step's dense compute", -1, 3 * dense_fwd);
  const int dense_bwd_win = window("dense backward", -1, 2 * dense_fwd);

  std::vector<Op>& ops = ev.ops;
  auto op = [&](const char* what, int module, Collective coll, bool grad, const GroupShape& grp,
                double bytes, int w) {
    if (grp.size <= 1 || bytes <= 0) return;
    ops.push_back({what, module, coll, grad, grp, bytes, w, CollectiveCost(t, grp, coll, bytes)});
  };
  const GroupShape replica = MakeGroup(t, c.world / g, g);
  const GroupShape fsdp = MakeGroup(t, g, 1);
  for (int i = 0; i < n; ++i) {
    const DenseModule& m = model.modules[i];
    const int e = d.ep[i];
    const GroupShape grp = e > 1 ? MakeGroup(t, g / e, e) : fsdp;
    const double wb = p.fp8_modules.count(m.name) ? 1 : p.weight_gather_bytes;
    const double params = static_cast<double>(m.params) / e;
    op("FSDP all-gather (forward)", i, Collective::kAllGather, false, grp, params * wb, fwd_win[i]);
    if (i + 1 < n) {
      op("FSDP all-gather (backward)", i, Collective::kAllGather, false, grp, params * wb,
         bwd_win[i + 1]);
    }
    const int grad_win = i == 0 ? sparse_bwd_win : bwd_win[i - 1];
    op("FSDP reduce-scatter of gradients", i, Collective::kReduceScatter, false, grp,
       params * p.gradient_reduce_bytes, grad_win);
    op("replica all-reduce of shard gradients", i, Collective::kAllReduce, true, replica,
       static_cast<double>(m.params) / g * p.gradient_reduce_bytes, grad_win);
    if (e > 1) {
      const GroupShape ep = MakeGroup(t, e, 1);
      const double act = e * b * m.io_bytes_per_sample;
      op("EP all-gather of inputs (forward)", i, Collective::kAllGather, false, ep, act, -1);
      op("EP reduce-scatter of outputs (forward)", i, Collective::kReduceScatter, false, ep, act, -1);
      op("EP all-gather of output gradients (backward)", i, Collective::kAllGather, false, ep, act, -1);
      op("EP reduce-scatter of input gradients (backward)", i, Collective::kReduceScatter, false, ep,
         act, -1);
    }
  }
  const GroupShape mp = MakeGroup(t, s.m, s.s);
  op("ids all-to-all", -1, Collective::kAllToAll, false, mp, std::max(c.ids_send_bytes, s.ids_max),
     input_win);
  op("embedding all-to-all (forward)", -1, Collective::kAllToAll, false, mp, s.out_max, -1);
  op("embedding-gradient all-to-all (backward)", -1, Collective::kAllToAll, false, mp, s.out_max, -1);
  if (s.scheme == SparseScheme::kV3) {
    const GroupShape v3 = MakeGroup(t, s.s, 1);
    op("V3 table-shard all-gather (forward)", -1, Collective::kAllGather, false, v3, s.touched_max,
       input_win);
    op("V3 table-shard all-gather (backward)", -1, Collective::kAllGather, false, v3, s.touched_max,
       dense_bwd_win);
    op("V3 reduce-scatter of updated rows", -1, Collective::kReduceScatter, false, v3,
       s.touched_max, -1);
  }
  const int span = s.m * s.s;
  if (span < c.world) {
    const double grad_rows = s.touched_max / s.s * p.embedding_grad_bytes / p.embedding_bytes;
    op("table-copy all-reduce of touched gradient rows", -1, Collective::kAllReduce, true,
       MakeGroup(t, c.world / span, span), grad_rows / r.options.embedding_sync_interval, -1);
  }

  // Exposure: ops sharing a window run back to back on its stream; what
  // does not fit in the window's compute is exposed, split over the ops
  // (and their levels) in proportion to their time.
  std::vector<double> load(win.size(), 0);
  for (const Op& o : ops) {
    if (o.window >= 0) load[o.window] += o.cost.seconds;
  }
  StepTime& st = ev.step;
  for (Op& o : ops) {
    double share = 1;
    if (o.window >= 0) {
      const double total = load[o.window];
      share = total > 0 ? std::max(0.0, total - win[o.window].compute_s) / total : 0;
    }
    o.exposed = o.cost.seconds * share;
    for (int l = 0; l < kNumLevels; ++l) {
      o.exposed_level[l] = o.cost.seconds_per_level[l] * share;
      st.exposed_s[l] += o.exposed_level[l];
    }
    if (!o.gradient_sync && o.group.HighestLevel() == kCrossZone &&
        !r.options.allow_cross_zone_non_gradient && ev.why_not.empty()) {
      ev.why_not = absl::StrCat("puts the ", OpName(model, o), " on cross-zone links");
    }
  }
  st.sparse_compute_s = s.compute_max;
  st.dense_compute_s = 3 * dense_fwd;
  st.recompute_s = recompute;
  st.total_s = st.ComputeS() + st.recompute_s + st.ExposedS();
  st.model_flops = c.model_flops;
  const double peak = t.peak_flops_per_gpu;
  st.local_mfu = st.ComputeS() > 0 ? c.model_flops / (st.ComputeS() * peak) : 0;
  st.e2e_mfu = st.total_s > 0 ? c.model_flops / (st.total_s * peak) : 0;
  st.scaling_ratio = st.total_s > 0 ? st.ComputeS() / st.total_s : 1;
  ev.feasible = ev.memory_ok && ev.why_not.empty();
  return ev;
}

// ---------------------------------------------------------------------------
// Stage 4: choose and explain.

std::string DenseLabel(const Model& model, const DenseOption& d) {
  std::string s = absl::StrCat("FSDP group ", d.fsdp_group);
  for (size_t i = 0; i < d.ep.size(); ++i) {
    if (d.ep[i] > 1) absl::StrAppend(&s, ", EP ", d.ep[i], " on ", model.modules[i].name);
  }
  return s;
}

bool Better(const Evaluation& a, const Evaluation& b) {
  if (a.step.total_s != b.step.total_s) return a.step.total_s < b.step.total_s;
  return a.peak.Total() < b.peak.Total();
}

Alternative MakeAlternative(const std::string& label, const Evaluation& ev,
                            const Evaluation& best) {
  Alternative a{label, ev.feasible, ev.step.total_s, ev.peak.Total()};
  if (!ev.feasible) {
    a.note = ev.why_not;
  } else {
    const double d = ev.step.total_s - best.step.total_s;
    a.note = d > 0 ? absl::StrCat(Ms(d), " slower (", Ms(ev.step.ExposedS()), " exposed comm, ",
                                  Ms(ev.step.recompute_s), " recompute)")
                   : "same step time, more memory";
  }
  return a;
}

struct Candidate {
  const DenseOption* dense;
  const SparseOption* sparse;
  Evaluation eval;
};

// Tracks the best evaluation per value of one plan dimension.
struct DimensionTable {
  std::vector<std::string> order;
  std::map<std::string, Evaluation> best;
  void Offer(const std::string& key, const Evaluation& ev) {
    auto it = best.find(key);
    if (it == best.end()) {
      order.push_back(key);
      best.emplace(key, ev);
    } else if ((ev.feasible && !it->second.feasible) ||
               (ev.feasible == it->second.feasible &&
                (ev.feasible ? Better(ev, it->second) : ev.over_bytes < it->second.over_bytes))) {
      it->second = ev;
    }
  }
  Decision Explain(const std::string& dimension, const std::string& chosen,
                   const std::string& reason, const Evaluation& winner) const {
    Decision dec{dimension, chosen, reason};
    for (const std::string& key : order) {
      if (key == chosen) continue;
      dec.alternatives.push_back(MakeAlternative(key, best.at(key), winner));
    }
    return dec;
  }
};

std::string ModuleCommSummary(const Model& model, const Evaluation& ev, int module) {
  double ag = 0, ag_exposed = 0, window = -1, ep = 0, ep_exposed = 0;
  for (const Op& o : ev.ops) {
    if (o.module != module) continue;
    if (std::string(o.what) == "FSDP all-gather (forward)") {
      ag = o.cost.seconds;
      ag_exposed = o.exposed;
      window = ev.windows[o.window].compute_s;
    } else if (o.window < 0) {
      ep += o.cost.seconds;
      ep_exposed += o.exposed;
    }
  }
  std::string s =
      window < 0 ? std::string("each rank holds its experts' full weights (no all-gather)")
                 : absl::StrCat("forward all-gather ", Ms(ag), " vs ", Ms(window),
                                " of previous compute -> ", Ms(ag_exposed), " exposed");
  if (ep > 0) absl::StrAppend(&s, "; EP activation traffic ", Ms(ep_exposed), " exposed");
  return s;
}

std::string Fixes(const Context& c, const Evaluation& ev, const SparseOption& s) {
  const PlanRequest& r = c.req;
  std::vector<std::string> fixes;
  if (ev.peak.embedding > 0) {
    double one_copy = 0;
    for (const double bytes : s.sharding->rank_bytes) one_copy += bytes;
    one_copy *= s.s;  // rank_bytes hold 1/s of a group's shards under V3.
    const double room = c.usable - (ev.peak.Total() - ev.peak.embedding);
    if (room > 0) {
      fixes.push_back(absl::StrFormat(
          "spread one copy of the tables (%s) over at least %d GPUs (fleet has %d)",
          GiB(one_copy), static_cast<int>(std::ceil(one_copy / room)), c.world));
    }
    if (r.precision.embedding_bytes > 2) {
      fixes.push_back(absl::StrCat("store tables in fp16 (precision.embedding: fp16): saves ",
                                   GiB(ev.peak.embedding / 2), " per GPU"));
    }
  }
  const double per_sample = (ev.peak.activations + ev.sparse_buffers) / r.local_batch;
  const double fixed = ev.peak.Total() - ev.peak.activations - ev.sparse_buffers;
  if (per_sample > 0) {
    const int b = static_cast<int>(std::floor((c.usable - fixed) / per_sample));
    if (b >= 1 && b < r.local_batch) {
      fixes.push_back(absl::StrCat("lower batch.local from ", r.local_batch, " to ", b));
    }
  }
  if (!r.precision.fp8_kept_activations && ev.peak.activations > 0) {
    fixes.push_back(absl::StrCat("keep checkpointed activations in FP8 (precision.kept_activations: "
                                 "fp8): saves ",
                                 GiB(ev.peak.activations / 2)));
  }
  if (fixes.empty()) fixes.push_back("use GPUs with more HBM");
  return absl::StrJoin(fixes, "; or ");
}

absl::Status NothingFits(const Context& c, const std::vector<SparseOption>& sparse,
                         const Candidate* closest) {
  const Model& model = c.req.model;
  std::string head = absl::StrFormat(
      "no plan fits in %s of usable HBM per GPU (%s less %.0f%% reserve) on %d GPUs",
      GiB(c.usable), GiB(c.topo.hbm_bytes_per_gpu), c.req.options.hbm_reserve_fraction * 100,
      c.world);
  if (closest == nullptr) {
    // No layout could even place the tables. First the aggregate: can the
    // fleet hold one copy at all?
    const PrecisionRecipe& p = c.req.precision;
    double total = 0, biggest = 0;
    std::string biggest_name;
    for (const Table& t : model.tables) {
      const double bytes = static_cast<double>(t.rows) *
                           (t.dim * p.embedding_bytes + p.embedding_optimizer_bytes_per_row);
      total += bytes;
      if (bytes > biggest) {
        biggest = bytes;
        biggest_name = t.name;
      }
    }
    const double fleet = c.usable * c.world;
    if (total > fleet) {
      return absl::ResourceExhaustedError(absl::StrCat(
          head, ". One copy of the ", model.tables.size(), " tables needs ", GiB(total),
          " (largest: table '", biggest_name, "' ", GiB(biggest), ") but all ", c.world,
          " GPUs together hold ", GiB(fleet), ": over by ", GiB(total - fleet),
          ". Fix: at least ", static_cast<int64_t>(std::ceil(total / c.usable)),
          " GPUs of this kind (more with dense state and activations)",
          p.embedding_bytes > 2 ? ", or fp16 tables (precision.embedding: fp16) to halve it" : "",
          ", or fewer rows"));
    }
    // Otherwise report the finest layout's error, which names the table.
    const SparseOption* finest = nullptr;
    for (const SparseOption& s : sparse) {
      if (finest == nullptr || s.m * s.s > finest->m * finest->s ||
          (s.m * s.s == finest->m * finest->s && s.s > finest->s)) {
        finest = &s;
      }
    }
    if (finest == nullptr) return absl::ResourceExhaustedError(head);
    return absl::ResourceExhaustedError(absl::StrCat(
        head, ". Even the most sharded layout (", finest->Label(), ") fails: ",
        finest->sharding.status().message(),
        ". Fix: more GPUs, fp16 tables (precision.embedding: fp16), or fewer rows in that table"));
  }
  const Evaluation& ev = closest->eval;
  const SparseOption& s = *closest->sparse;
  // Name the biggest item of each category.
  std::string table, module, region;
  double table_b = 0, module_b = 0, region_b = 0;
  for (const TableSharding& ts : s.sharding->tables) {
    if (ts.shard_bytes > table_b) {
      table_b = ts.shard_bytes;
      table = absl::StrCat("table '", model.tables[ts.table].name, "' ", GiB(ts.shard_bytes),
                           " per ", ShardingTypeName(ts.type), " shard");
    }
  }
  for (size_t i = 0; i < model.modules.size(); ++i) {
    const double bytes = static_cast<double>(model.modules[i].params) *
                         c.req.precision.weight_gather_bytes / closest->dense->ep[i];
    if (bytes > module_b) {
      module_b = bytes;
      module = absl::StrCat("module '", model.modules[i].name, "' gathers ", GiB(bytes));
    }
  }
  for (const Region& reg : c.regions) {
    if (reg.min > region_b) {
      region_b = reg.min;
      region = absl::StrCat("region '", reg.name, "' keeps ", GiB(reg.min));
    }
  }
  const MemoryBreakdown& m = ev.peak;
  return absl::ResourceExhaustedError(absl::StrCat(
      head, ". Closest: ", DenseLabel(model, *closest->dense), " + ", s.Label(), " needs ",
      GiB(m.Total()), " per GPU, over by ", GiB(ev.over_bytes), ": embedding shards ",
      GiB(m.embedding), table.empty() ? "" : absl::StrCat(" (largest: ", table, ")"),
      ", dense shards ", GiB(m.dense), ", optimizer ", GiB(m.optimizer),
      ", activations at full checkpointing ", GiB(m.activations),
      region.empty() ? "" : absl::StrCat(" (largest: ", region, ")"), ", buffers ",
      GiB(m.buffers), module.empty() ? "" : absl::StrCat(" (largest: ", module, ")"),
      ". Fix: ", Fixes(c, ev, s)));
}

std::vector<std::string> Placement(const Topology& t, const Plan& plan, int sync_interval) {
  std::vector<std::string> out;
  const int n = plan.world, g = plan.dense.fsdp_group;
  const SparseLayout& sp = plan.sparse;
  auto nodes = [&](int ranks) { return std::max(1, ranks / t.gpus_per_node); };
  out.push_back(absl::StrFormat(
      "FSDP group k = ranks [k*%d, (k+1)*%d) (%d node(s)); spans %s: parameter all-gathers and "
      "gradient reduce-scatters stay there",
      g, g, nodes(g), DescribeGroup(MakeGroup(t, g, 1))));
  if (n / g > 1) {
    out.push_back(absl::StrFormat(
        "replica group j = ranks {j + i*%d} (%d replicas); spans %s: only shard-gradient "
        "all-reduce",
        g, n / g, DescribeGroup(MakeGroup(t, n / g, g))));
  }
  for (const ExpertChoice& e : plan.dense.experts) {
    if (e.ep_degree <= 1) continue;
    out.push_back(absl::StrFormat(
        "EP group for %s = %d consecutive ranks (spans %s); its expert weights are sharded over "
        "ranks {k + i*%d} inside the FSDP group (spans %s)",
        e.module, e.ep_degree, DescribeGroup(MakeGroup(t, e.ep_degree, 1)), e.ep_degree,
        DescribeGroup(MakeGroup(t, g / e.ep_degree, e.ep_degree))));
  }
  out.push_back(absl::StrFormat(
      "model-parallel group = %d ranks with stride %d inside a block of %d consecutive ranks "
      "(%d groups); spans %s: id and embedding all-to-alls stay there",
      sp.mp_group, sp.mp_stride, sp.mp_group * sp.mp_stride, sp.num_mp_groups,
      DescribeGroup(MakeGroup(t, sp.mp_group, sp.mp_stride))));
  if (sp.scheme == SparseScheme::kV3) {
    out.push_back(absl::StrFormat(
        "V3 shard group = %d consecutive ranks (spans %s): table-shard all-gather and "
        "reduce-scatter",
        sp.v3_shard_degree, DescribeGroup(MakeGroup(t, sp.v3_shard_degree, 1))));
  }
  if (sp.table_copies > 1) {
    const int span = sp.mp_group * sp.mp_stride;
    out.push_back(absl::StrFormat(
        "table-copy group = ranks {k + i*%d} (%d copies); spans %s: touched gradient rows "
        "all-reduced every %d step(s)",
        span, sp.table_copies, DescribeGroup(MakeGroup(t, sp.table_copies, span)),
        sync_interval));
  }
  return out;
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const Topology& topology, const PlanRequest& request) {
  if (auto s = ValidateTopology(topology); !s.ok()) return s;
  if (auto s = ValidateRequest(request); !s.ok()) return s;
  const Model& model = request.model;
  const Context ctx = MakeContext(topology, request);

  // Stages 1-2: options, and the tables sharded for each sparse layout.
  const std::vector<DenseOption> dense = EnumerateDense(topology, model, request.options);
  std::vector<SparseOption> sparse = EnumerateSparse(topology, request.options);
  if (topology.WorldSize() == 1) sparse.push_back({SparseScheme::kV2, 1, 1});
  for (SparseOption& s : sparse) {
    ShardingInput in{&model, &topology, &request.precision, &request.efficiency,
                     &request.options, MakeGroup(topology, s.m, s.s), request.local_batch,
                     s.s, ctx.usable};
    s.sharding = ShardTables(in);
    if (s.sharding.ok()) Summarize(&s);
  }

  // Stage 3: estimate every pair; remember the best per dimension value.
  std::optional<Candidate> best, closest;
  DimensionTable by_group, by_layout;
  int evaluated = 0;
  for (const SparseOption& s : sparse) {
    if (!s.sharding.ok()) continue;
    for (const DenseOption& d : dense) {
      Evaluation ev = Evaluate(ctx, d, s);
      ++evaluated;
      by_group.Offer(absl::StrCat("FSDP group ", d.fsdp_group), ev);
      by_layout.Offer(s.Label(), ev);
      if (ev.feasible) {
        if (!best || Better(ev, best->eval)) best = Candidate{&d, &s, std::move(ev)};
      } else if (!ev.memory_ok && (!closest || ev.over_bytes < closest->eval.over_bytes)) {
        closest = Candidate{&d, &s, std::move(ev)};
      }
    }
  }
  if (!best) {
    if (closest) return NothingFits(ctx, sparse, &*closest);
    for (const SparseOption& s : sparse) {
      if (s.sharding.ok()) {
        return absl::FailedPreconditionError(
            "every layout puts an all-gather or all-to-all on cross-zone links; set "
            "planner.allow_cross_zone_non_gradient: true or use fewer zones");
      }
    }
    return NothingFits(ctx, sparse, nullptr);
  }

  // Stage 4: the plan and its explanations.
  const DenseOption& bd = *best->dense;
  const SparseOption& bs = *best->sparse;
  const Evaluation& ev = best->eval;
  Plan plan;
  plan.topology = topology;
  plan.model_name = model.name;
  plan.world = ctx.world;
  plan.local_batch = request.local_batch;
  plan.candidates_evaluated = evaluated;
  plan.hbm_usable_bytes = ctx.usable;
  plan.dense.fsdp_group = bd.fsdp_group;
  plan.dense.replicas = ctx.world / bd.fsdp_group;
  SparseLayout& sp = plan.sparse;
  sp.scheme = bs.scheme;
  sp.mp_group = bs.m;
  sp.mp_stride = bs.s;
  sp.v3_shard_degree = bs.s;
  sp.num_mp_groups = ctx.world / bs.m;
  sp.table_copies = ctx.world / (bs.m * bs.s);
  sp.sharding = *bs.sharding;
  plan.peak = ev.peak;
  plan.step = ev.step;
  for (const Op& o : ev.ops) {
    CommOp c;
    c.name = OpName(model, o);
    c.collective = o.collective;
    c.gradient_sync = o.gradient_sync;
    c.group_size = o.group.size;
    c.group_stride = o.group.stride;
    c.highest_level = o.group.HighestLevel();
    c.bytes = o.bytes;
    c.cost = o.cost;
    if (o.window >= 0) {
      const Window& w = ev.windows[o.window];
      c.window = w.module < 0 ? w.what : absl::StrCat(w.what, " ", model.modules[w.module].name);
      c.window_s = w.compute_s;
    }
    c.exposed_s = o.exposed;
    c.exposed_per_level = o.exposed_level;
    for (int l = 0; l < kNumLevels; ++l) plan.traffic_bytes_per_level[l] += o.cost.bytes_per_level[l];
    plan.comm.push_back(std::move(c));
  }
  plan.checkpoint = ev.regions;
  // Per-position memory: only the embedding shards (and the all-to-all
  // send buffer) differ between ranks.
  for (size_t r = 0; r < sp.sharding.rank_bytes.size(); ++r) {
    MemoryBreakdown m = ev.peak;
    m.embedding = sp.sharding.rank_bytes[r];
    m.buffers += sp.sharding.rank_out_bytes[r] - bs.out_max + sp.sharding.rank_id_bytes[r] -
                 bs.ids_max;
    plan.rank_memory.push_back(m);
  }

  const std::string usable = GiB(ctx.usable);
  // Dense mesh.
  {
    std::string levels = DescribeGroup(MakeGroup(topology, bd.fsdp_group, 1));
    std::string reason = absl::StrFormat(
        "fastest feasible step (%s, peak %s of %s usable); the FSDP group spans %s and its "
        "%d replicas exchange only shard gradients (%s)",
        Ms(ev.step.total_s), GiB(ev.peak.Total()), usable, levels, plan.dense.replicas,
        DescribeGroup(MakeGroup(topology, plan.dense.replicas, bd.fsdp_group)));
    plan.decisions.push_back(by_group.Explain(
        "dense mesh (2D FSDP)", absl::StrCat("FSDP group ", bd.fsdp_group), reason, ev));
  }
  // Expert parallelism, one decision per expert module.
  for (size_t i = 0; i < model.modules.size(); ++i) {
    if (!model.modules[i].is_expert()) continue;
    ExpertChoice choice{model.modules[i].name, bd.ep[i]};
    Decision dec{absl::StrCat("expert parallelism: ", choice.module),
                 bd.ep[i] > 1 ? absl::StrCat("EP ", bd.ep[i]) : "no EP (plain FSDP)"};
    std::vector<std::pair<int, Evaluation>> evals;
    for (int e = 1; e <= std::min(topology.NvlinkDomainSize(), bd.fsdp_group); e *= 2) {
      if (e > 1 && (model.modules[i].num_experts % e != 0 || bd.fsdp_group % e != 0)) continue;
      DenseOption alt = bd;
      alt.ep[i] = e;
      evals.emplace_back(e, Evaluate(ctx, alt, bs));
    }
    for (auto& [e, alt] : evals) {
      std::string label = e > 1 ? absl::StrCat("EP ", e) : "no EP (plain FSDP)";
      if (e == bd.ep[i]) {
        dec.reason = absl::StrCat(label, ": ", ModuleCommSummary(model, alt, i));
        continue;
      }
      Alternative a = MakeAlternative(label, alt, ev);
      absl::StrAppend(&a.note, "; ", ModuleCommSummary(model, alt, i));
      dec.alternatives.push_back(std::move(a));
    }
    choice.reason = dec.reason;
    plan.dense.experts.push_back(choice);
    plan.decisions.push_back(std::move(dec));
  }
  // Sparse layout.
  {
    const auto& sh = sp.sharding;
    std::string reason = absl::StrFormat(
        "fastest feasible layout: embedding shards %s on the fullest rank, lookup imbalance "
        "%.2fx, all-to-alls span %s",
        GiB(bs.emb_max), sh.compute_imbalance, DescribeGroup(MakeGroup(topology, bs.m, bs.s)));
    if (bs.scheme == SparseScheme::kV3) {
      absl::StrAppend(&reason, absl::StrFormat("; the shards are split %d-way over %s", bs.s,
                                               DescribeGroup(MakeGroup(topology, bs.s, 1))));
    }
    Decision dec = by_layout.Explain("sparse layout (2D model parallelism)", bs.Label(), reason, ev);
    for (const SparseOption& s : sparse) {
      if (!s.sharding.ok()) {
        dec.alternatives.push_back(
            {s.Label(), false, 0, 0, std::string(s.sharding.status().message())});
      }
    }
    plan.decisions.push_back(std::move(dec));
  }
  // Table sharding summary; each table carries its own reason.
  {
    std::map<std::string, int> counts;
    for (const TableSharding& ts : sp.sharding.tables) counts[ShardingTypeName(ts.type)]++;
    std::vector<std::string> parts;
    for (const auto& [type, count] : counts) parts.push_back(absl::StrCat(count, " ", type));
    plan.decisions.push_back(
        {"table sharding", absl::StrJoin(parts, ", "),
         absl::StrFormat("each table takes the coarsest sharding whose shard stays within one "
                         "rank's fair share; shards placed heaviest first on the least-loaded "
                         "rank with room; lookup imbalance %.2fx",
                         sp.sharding.compute_imbalance)});
  }
  // Activation checkpointing.
  {
    int cut = 0;
    double full = 0;
    for (const RegionBudget& rb : plan.checkpoint) {
      cut += rb.budget_bytes < rb.full_bytes;
      full += rb.full_bytes;
    }
    const double other = ev.peak.Total() - ev.peak.activations;
    plan.decisions.push_back(
        {"activation checkpointing",
         absl::StrCat(cut, " of ", plan.checkpoint.size(), " regions cut"),
         cut == 0 ? absl::StrFormat("all activations (%s) fit beside %s of shards and buffers",
                                    GiB(full), GiB(other))
                  : absl::StrFormat("activations need %s but only %s is left beside %s of shards "
                                    "and buffers; regions are cut cheapest recompute per GiB "
                                    "first, costing %s of recompute",
                                    GiB(full), GiB(ctx.usable - other), GiB(other),
                                    Ms(ev.step.recompute_s))});
  }
  // Closest contenders first: feasible by step time, then the infeasible.
  for (Decision& d : plan.decisions) {
    std::stable_sort(d.alternatives.begin(), d.alternatives.end(),
                     [](const Alternative& a, const Alternative& b) {
                       if (a.feasible != b.feasible) return a.feasible;
                       return a.feasible && a.step_s < b.step_s;
                     });
  }
  plan.placement = Placement(topology, plan, request.options.embedding_sync_interval);
  return plan;
}

const char* SparseSchemeName(SparseScheme scheme) {
  switch (scheme) {
    case SparseScheme::kV1:
      return "V1";
    case SparseScheme::kV2:
      return "V2";
    case SparseScheme::kV3:
      return "V3";
  }
  return "?";
}

int DenseMesh::MaxEpDegree() const {
  int e = 1;
  for (const ExpertChoice& c : experts) e = std::max(e, c.ep_degree);
  return e;
}

}  // namespace recfleet::planner
