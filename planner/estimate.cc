#include "planner/estimate.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "planner/sharding.h"
#include "planner/units.h"

namespace recfleet::planner {
namespace {

// Everything but the activations: shards, optimizer state and buffers.
void StaticMemory(const Context& c, const DenseOption& d, const SparseOption& s,
                  Evaluation* ev) {
  const PrecisionRecipe& p = c.req.precision;
  const double b = c.req.local_batch;
  MemoryBreakdown& mem = ev->peak;
  mem.embedding = s.emb_max;
  // FSDP keeps the current module's gathered weights and the prefetched
  // next one, plus one module's unsharded gradients; the backward, one
  // module's scratch (DenseModule::backward_scratch_bytes_per_sample).
  double gathered1 = 0, gathered2 = 0, grad_full = 0, ep_act = 0, scratch = 0;
  for (size_t i = 0; i < c.req.model.modules.size(); ++i) {
    const DenseModule& m = c.req.model.modules[i];
    const double params = static_cast<double>(m.params);
    const double shard = params / d.fsdp_group;
    mem.dense += shard * p.master_weight_bytes;
    mem.optimizer += shard * (p.optimizer_bytes_per_param + p.gradient_shard_bytes);
    // A group of one holds its whole module already: nothing is gathered
    // and the full gradient is the shard gradient counted above.
    const double gathered = d.fsdp_group > 1 ? params / d.ep[i] * p.GatherBytes(m.name) : 0;
    if (gathered > gathered1) {
      gathered2 = gathered1;
      gathered1 = gathered;
    } else {
      gathered2 = std::max(gathered2, gathered);
    }
    if (d.fsdp_group > 1) grad_full = std::max(grad_full, params / d.ep[i] * p.gradient_reduce_bytes);
    if (d.ep[i] > 1) ep_act = std::max(ep_act, 2.0 * d.ep[i] * b * m.io_bytes_per_sample);
    scratch = std::max(scratch, b * m.backward_scratch_bytes_per_sample);
  }
  // The sent outputs, the received ones and the sent ids; see
  // PlanRequest::activations_hold_lookups. The activations hold one copy of
  // the rank's own lookups; a row-sharded table's all-to-all delivers one
  // partial sum per shard, so only the copies beyond the first are buffers.
  double own_lookups = 0;
  for (const Table& t : c.req.model.tables) {
    own_lookups += LookupOutputBytes(t, b * t.access_frequency, t.dim, 1.0, p);
  }
  const double lookups =
      !c.req.activations_hold_lookups ? s.out_max + s.out_mean + s.ids_max
      : s.m > 1 ? s.out_max + std::max(0.0, s.out_mean - own_lookups) + s.ids_max
                : 0;
  ev->sparse_buffers = lookups + (s.scheme == SparseScheme::kV3 ? s.largest_touched_table : 0);
  mem.buffers = gathered1 + gathered2 + grad_full + ep_act + scratch + ev->sparse_buffers +
                c.req.other_memory_bytes;
  if (c.req.shadow_model) mem.buffers += mem.embedding + mem.dense + mem.optimizer;
}

// Fits the activations into what is left (and into the job's activation
// budget), recomputing the regions the job names whole and then cutting the
// others with the least recompute per byte saved first; a region with
// recompute units is cut in whole units. Returns the recompute time.
double BudgetActivations(const Context& c, Evaluation* ev) {
  MemoryBreakdown& mem = ev->peak;
  const double hbm_left = c.usable - mem.Total();
  const double budget = c.req.activation_budget_bytes;
  const double available = budget > 0 ? std::min(hbm_left, budget) : hbm_left;
  auto forced = [&](const Region& reg) { return c.req.recompute_regions.count(reg.name) > 0; };
  // The least a region can keep: its minimum, plus one unit's activations
  // for a region cut in several units whose last unit is recomputed before
  // the peak (see below).
  auto least = [](const Region& reg) {
    return reg.units > 1 && !reg.after_peak ? reg.min + (reg.full - reg.min) / reg.units : reg.min;
  };
  double full = 0, minimum = 0;
  for (const Region& reg : c.regions) {
    full += forced(reg) ? least(reg) : reg.full;
    minimum += least(reg);
  }
  ev->memory_ok = minimum <= available;
  if (!ev->memory_ok) {
    ev->over_bytes = minimum - available;
    ev->why_not = available < hbm_left
                      ? absl::StrCat("activations over the job's budget (activation_memory.budget_bytes ",
                                     GiBText(budget), ") by ", GiBText(ev->over_bytes),
                                     " even with every region checkpointed")
                      : absl::StrCat("over HBM by ", GiBText(ev->over_bytes),
                                     " even with every region checkpointed");
    mem.activations = minimum;
    return 0;
  }
  double excess = std::max(0.0, full - available), recompute = 0;
  for (const Region& reg : c.regions) {
    RegionBudget rb{reg.name, reg.full, reg.min, reg.full};
    rb.units = reg.units;
    const double saved_max = reg.full - reg.min;
    rb.seconds_per_gib_saved = saved_max > 0 ? reg.fwd_s / saved_max * kGiB : 0;
    // A region cut in units recomputes each unit in that unit's backward,
    // which comes first for the last unit of the forward: its activations
    // are all back at the backward's start, where the step's memory peaks.
    // So k of n units recomputed (the first ones) lower the peak by k units'
    // bytes up to n - 1, and recomputing the last one saves nothing more,
    // unless the runtime recomputes it after the peak (Region::after_peak).
    const int useful_units = reg.units > 1 && !reg.after_peak ? reg.units - 1 : reg.units;
    auto saving = [&](int k) { return saved_max * std::min(k, useful_units) / reg.units; };
    double cut = forced(reg) ? saved_max : excess > 0 ? std::min(excess, saved_max) : 0;
    if (cut > 0 && saved_max > 0) {
      double recomputed = cut;  // Of saved_max: what the backward recomputes.
      if (reg.units > 0) {
        if (forced(reg)) {
          rb.recomputed_units = reg.units;
        } else {
          // Whole units: the last one may save more than the excess needs.
          rb.recomputed_units = std::min(
              useful_units, static_cast<int>(std::ceil(cut / saved_max * reg.units - 1e-9)));
        }
        cut = saving(rb.recomputed_units);
        recomputed = saved_max * rb.recomputed_units / reg.units;
      }
      if (!forced(reg)) excess = std::max(0.0, excess - cut);
      rb.budget_bytes = reg.full - cut;
      rb.recompute_s = reg.fwd_s * recomputed / saved_max;
    }
    recompute += rb.recompute_s;
    mem.activations += rb.budget_bytes;
    ev->regions.push_back(rb);
  }
  return recompute;
}

// The step's collectives and the windows they hide behind (see estimate.h).
void ScheduleStep(const Context& c, const DenseOption& d, const SparseOption& s,
                  Evaluation* ev) {
  const Topology& t = c.topo;
  const PrecisionRecipe& p = c.req.precision;
  const Model& model = c.req.model;
  const int n = static_cast<int>(model.modules.size());
  const int g = d.fsdp_group;
  const double b = c.req.local_batch;
  double dense_fwd = 0;
  for (double f : c.fwd_s) dense_fwd += f;

  std::vector<Window>& win = ev->windows;
  auto window = [&](const char* what, int module, double seconds) {
    win.push_back({what, module, seconds});
    return static_cast<int>(win.size()) - 1;
  };
  std::vector<int> fwd_win(n), bwd_win(n);
  for (int i = 0; i < n; ++i) {
    fwd_win[i] = i == 0 ? window("sparse forward lookups", -1, s.compute_max * 0.25)
                        : window("forward of", i - 1, c.fwd_s[i - 1]);
  }
  for (int i = 0; i < n; ++i) bwd_win[i] = window("backward of", i, 2 * c.fwd_s[i]);
  const int sparse_bwd_win = window("sparse backward lookups", -1, s.compute_max * 0.75);
  const int input_win = window("previous step's dense compute", -1, 3 * dense_fwd);
  const int dense_bwd_win = window("dense backward", -1, 2 * dense_fwd);

  auto op = [&](const char* what, int module, Collective coll, bool grad, const GroupShape& grp,
                double bytes, int w) {
    if (grp.size <= 1 || bytes <= 0) return;
    ev->ops.push_back({what, module, coll, grad, grp, bytes, w, CollectiveCost(t, grp, coll, bytes)});
  };
  const GroupShape replica = MakeGroup(t, c.world / g, g);
  const GroupShape fsdp = MakeGroup(t, g, 1);
  for (int i = 0; i < n; ++i) {
    const DenseModule& m = model.modules[i];
    const int e = d.ep[i];
    // With EP, an expert's weights are sharded over the ranks of the FSDP
    // group that own the same experts: every e-th rank.
    const GroupShape grp = e > 1 ? MakeGroup(t, g / e, e) : fsdp;
    const double params = static_cast<double>(m.params) / e;
    const double weights = params * p.GatherBytes(m.name);
    op("FSDP all-gather (forward)", i, Collective::kAllGather, false, grp, weights, fwd_win[i]);
    if (i + 1 < n) {
      op("FSDP all-gather (backward)", i, Collective::kAllGather, false, grp, weights,
         bwd_win[i + 1]);
    }
    const int grad_win = i == 0 ? sparse_bwd_win : bwd_win[i - 1];
    op("FSDP reduce-scatter of gradients", i, Collective::kReduceScatter, false, grp,
       params * p.gradient_reduce_bytes, grad_win);
    op("replica all-reduce of shard gradients", i, Collective::kAllReduce, true, replica,
       static_cast<double>(m.params) / g * p.gradient_reduce_bytes, grad_win);
    if (e > 1) {
      // Every rank runs its experts on the EP group's whole batch.
      const GroupShape ep = MakeGroup(t, e, 1);
      const double act = e * b * m.io_bytes_per_sample;
      op("EP all-gather of inputs (forward)", i, Collective::kAllGather, false, ep, act, -1);
      op("EP reduce-scatter of outputs (forward)", i, Collective::kReduceScatter, false, ep, act,
         -1);
      op("EP all-gather of output gradients (backward)", i, Collective::kAllGather, false, ep, act,
         -1);
      op("EP reduce-scatter of input gradients (backward)", i, Collective::kReduceScatter, false,
         ep, act, -1);
    }
  }
  const GroupShape mp = MakeGroup(t, s.m, s.s);
  op("ids all-to-all", -1, Collective::kAllToAll, false, mp, std::max(c.ids_send_bytes, s.ids_max),
     input_win);
  op("embedding all-to-all (forward)", -1, Collective::kAllToAll, false, mp, s.out_max, -1);
  op("embedding-gradient all-to-all (backward)", -1, Collective::kAllToAll, false, mp, s.out_max,
     -1);
  if (s.scheme == SparseScheme::kV3) {
    const GroupShape v3 = MakeGroup(t, s.s, 1);
    op("V3 table-shard all-gather (forward)", -1, Collective::kAllGather, false, v3, s.touched_max,
       input_win);
    op("V3 table-shard all-gather (backward)", -1, Collective::kAllGather, false, v3,
       s.touched_max, dense_bwd_win);
    op("V3 reduce-scatter of updated rows", -1, Collective::kReduceScatter, false, v3,
       s.touched_max, -1);
  }
  const int span = s.m * s.s;
  if (span < c.world) {
    // Each rank syncs the touched rows of the 1/s of the shard it stores.
    const double grad_rows = s.touched_max / s.s * p.embedding_grad_bytes / p.embedding_bytes;
    op("table-copy all-reduce of touched gradient rows", -1, Collective::kAllReduce, true,
       MakeGroup(t, c.world / span, span), grad_rows / c.req.options.embedding_sync_interval, -1);
  }
}

// Charges what each window cannot hide (everything when collectives do not
// overlap compute) and enforces the cross-zone rule.
void ApplyOverlap(const Context& c, Evaluation* ev) {
  std::vector<double> load(ev->windows.size(), 0);
  for (const Op& o : ev->ops) {
    if (o.window >= 0) load[o.window] += o.cost.seconds;
  }
  for (Op& o : ev->ops) {
    double share = 1;
    if (o.window >= 0 && c.req.options.overlap_collectives) {
      const double total = load[o.window];
      share = total > 0 ? std::max(0.0, total - ev->windows[o.window].compute_s) / total : 0;
    }
    o.exposed = o.cost.seconds * share;
    for (int l = 0; l < kNumLevels; ++l) {
      o.exposed_level[l] = o.cost.seconds_per_level[l] * share;
      ev->step.exposed_s[l] += o.exposed_level[l];
    }
    if (!o.gradient_sync && o.group.HighestLevel() == kCrossZone &&
        !c.req.options.allow_cross_zone_non_gradient && ev->why_not.empty()) {
      ev->why_not = absl::StrCat("puts the ", OpName(c.req.model, o), " on cross-zone links");
    }
  }
}

}  // namespace

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
    c.fwd_s.push_back(ComputeSeconds(flops, t.peak_flops_per_gpu * t.ComputeShare(), eff));
    auto [it, fresh] = region_index.emplace(m.RegionName(), c.regions.size());
    if (fresh) {
      c.regions.push_back({m.RegionName()});
      c.regions.back().after_peak = m.recompute_after_peak;
      // A region recomputed in units keeps each unit's input.
      c.regions.back().min = m.io_bytes_per_sample * b * kept * std::max(1, m.recompute_units);
    }
    Region& reg = c.regions[it->second];
    reg.recomputable = reg.recomputable && m.recomputable;
    reg.units = std::max(reg.units, m.recompute_units);
    reg.after_peak = reg.after_peak && m.recompute_after_peak;
    reg.full += model.ActivationBytesPerSample(m) * b * kept;
    reg.fwd_s += c.fwd_s.back();
  }
  for (Region& reg : c.regions) reg.min = reg.recomputable ? std::min(reg.min, reg.full) : reg.full;
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

std::string OpName(const Model& model, const Op& op) {
  return op.module < 0 ? op.what : absl::StrCat(op.what, " ", model.modules[op.module].name);
}

std::string WindowName(const Model& model, const Window& w) {
  return w.module < 0 ? w.what : absl::StrCat(w.what, " ", model.modules[w.module].name);
}

Evaluation Evaluate(const Context& c, const DenseOption& d, const SparseOption& s) {
  Evaluation ev;
  StaticMemory(c, d, s, &ev);
  const double recompute = BudgetActivations(c, &ev);
  ScheduleStep(c, d, s, &ev);
  ApplyOverlap(c, &ev);
  StepTime& st = ev.step;
  double dense_fwd = 0;
  for (double f : c.fwd_s) dense_fwd += f;
  st.sparse_compute_s = s.compute_max;
  st.dense_compute_s = 3 * dense_fwd;
  // Read master weights, shard gradient and optimizer state; write weights
  // and state back.
  const PrecisionRecipe& p = c.req.precision;
  const double bytes_per_param =
      2.0 * p.master_weight_bytes + p.gradient_shard_bytes + 2.0 * p.optimizer_bytes_per_param;
  double shard_params = 0;
  for (const DenseModule& m : c.req.model.modules) {
    shard_params += static_cast<double>(m.params) / d.fsdp_group;
  }
  st.optimizer_s = shard_params * bytes_per_param /
                   (c.topo.hbm_bandwidth_bytes_per_s * c.topo.ComputeShare() *
                    c.req.efficiency.elementwise);
  st.other_compute_s = c.req.other_compute_s * (1.0 / c.topo.ComputeShare());
  st.recompute_s = recompute;
  if (c.world > 1) st.rank_sync_s = c.req.rank_sync_fraction * (st.ComputeS() + st.recompute_s);
  st.total_s = st.ComputeS() + st.recompute_s + st.ExposedS() + st.rank_sync_s;
  st.model_flops = c.model_flops;
  const double peak = c.topo.peak_flops_per_gpu * c.topo.ComputeShare();
  st.local_mfu = st.ComputeS() > 0 ? c.model_flops / (st.ComputeS() * peak) : 0;
  st.e2e_mfu = st.total_s > 0 ? c.model_flops / (st.total_s * peak) : 0;
  st.scaling_ratio = st.total_s > 0 ? st.ComputeS() / st.total_s : 1;
  ev.feasible = ev.memory_ok && ev.why_not.empty();
  return ev;
}

}  // namespace recfleet::planner
