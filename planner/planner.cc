#include "planner/planner.h"

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
#include "planner/candidates.h"
#include "planner/estimate.h"
#include "planner/units.h"

namespace recfleet::planner {
namespace {

// ---------------------------------------------------------------------------
// Stage 4: choose and explain (stages 1-3: candidates.h, sharding.h,
// estimate.h).

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
    a.note = d > 0 ? absl::StrCat(MsText(d), " slower (", MsText(ev.step.ExposedS()), " exposed comm, ",
                                  MsText(ev.step.recompute_s), " recompute)")
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
                 : absl::StrCat("forward all-gather ", MsText(ag), " vs ", MsText(window),
                                " of previous compute -> ", MsText(ag_exposed), " exposed");
  if (ep > 0) absl::StrAppend(&s, "; EP activation traffic ", MsText(ep_exposed), " exposed");
  return s;
}

std::string Fixes(const Context& c, const Evaluation& ev, const SparseOption& s) {
  const PlanRequest& r = c.req;
  const PlanRequest::SettingNames& names = r.setting_names;
  std::vector<std::string> fixes;
  // Over the job's activation budget even with every region checkpointed
  // (BudgetActivations leaves the least the regions can keep): the budget
  // is what to change first.
  if (r.activation_budget_bytes > 0 && ev.peak.activations > r.activation_budget_bytes) {
    fixes.push_back(absl::StrCat("raise ", names.activation_budget, " to at least ",
                                 static_cast<int64_t>(std::ceil(ev.peak.activations)),
                                 " bytes (the activations with every region checkpointed)"));
  }
  if (ev.peak.embedding > 0) {
    double one_copy = 0;
    for (const double bytes : s.sharding->rank_bytes) one_copy += bytes;
    one_copy *= s.s;  // rank_bytes hold 1/s of a group's shards under V3.
    const double room = c.usable - (ev.peak.Total() - ev.peak.embedding);
    const int gpus = room > 0 ? static_cast<int>(std::ceil(one_copy / room)) : 0;
    // Within the fleet, the planner has tried spreading the tables already.
    if (gpus > c.world) {
      fixes.push_back(absl::StrFormat("spread one copy of the tables (%s) over at least %d GPUs (fleet has %d)",
                                      GiBText(one_copy), gpus, c.world));
    }
    if (r.precision.embedding_bytes > 2 && !names.fp16_tables.empty()) {
      fixes.push_back(absl::StrCat("store tables in fp16 (", names.fp16_tables, "): saves ",
                                   GiBText(ev.peak.embedding / 2), " per GPU"));
    }
  }
  const double per_sample = (ev.peak.activations + ev.sparse_buffers) / r.local_batch;
  const double fixed = ev.peak.Total() - ev.peak.activations - ev.sparse_buffers;
  if (per_sample > 0) {
    const int b = static_cast<int>(std::floor((c.usable - fixed) / per_sample));
    if (b >= 1 && b < r.local_batch) {
      fixes.push_back(absl::StrCat("lower ", names.local_batch, " from ", r.local_batch, " to ", b));
    }
  }
  if (!r.precision.fp8_kept_activations && ev.peak.activations > 0 && !names.fp8_kept_activations.empty()) {
    fixes.push_back(absl::StrCat("keep checkpointed activations in FP8 (", names.fp8_kept_activations,
                                 "): saves ", GiBText(ev.peak.activations / 2)));
  }
  if (fixes.empty()) fixes.push_back("use GPUs with more HBM");
  return absl::StrJoin(fixes, "; or ");
}

absl::Status NothingFits(const Context& c, const std::vector<SparseOption>& sparse,
                         const Candidate* closest) {
  const Model& model = c.req.model;
  std::string head = absl::StrFormat(
      "no plan fits in %s of usable HBM per GPU (%s less %.0f%% reserve) on %d GPUs",
      GiBText(c.usable), GiBText(c.topo.hbm_bytes_per_gpu), c.req.options.hbm_reserve_fraction * 100,
      c.world);
  if (c.req.activation_budget_bytes > 0) {
    absl::StrAppend(&head, " with the job's activation budget of ", GiBText(c.req.activation_budget_bytes),
                    " (", c.req.setting_names.activation_budget, ")");
  }
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
          head, ". One copy of the ", model.tables.size(), " tables needs ", GiBText(total),
          " (largest: table '", biggest_name, "' ", GiBText(biggest), ") but all ", c.world,
          " GPUs together hold ", GiBText(fleet), ": over by ", GiBText(total - fleet),
          ". Fix: at least ", static_cast<int64_t>(std::ceil(total / c.usable)),
          " GPUs of this kind (more with dense state and activations)",
          p.embedding_bytes > 2 && !c.req.setting_names.fp16_tables.empty()
              ? absl::StrCat(", or fp16 tables (", c.req.setting_names.fp16_tables, ") to halve it")
              : "",
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
        ". Fix: more GPUs, ",
        c.req.setting_names.fp16_tables.empty() ? "" : absl::StrCat("fp16 tables (", c.req.setting_names.fp16_tables, "), "),
        "or fewer rows in that table"));
  }
  const Evaluation& ev = closest->eval;
  const SparseOption& s = *closest->sparse;
  // Name the biggest item of each category.
  std::string table, module, region;
  double table_b = 0, module_b = 0, region_b = 0;
  for (const TableSharding& ts : s.sharding->tables) {
    if (ts.shard_bytes > table_b) {
      table_b = ts.shard_bytes;
      table = absl::StrCat("table '", model.tables[ts.table].name, "' ", GiBText(ts.shard_bytes),
                           " per ", ShardingTypeName(ts.type), " shard");
    }
  }
  for (size_t i = 0; i < model.modules.size(); ++i) {
    const double bytes = static_cast<double>(model.modules[i].params) *
                         c.req.precision.GatherBytes(model.modules[i].name) / closest->dense->ep[i];
    if (bytes > module_b) {
      module_b = bytes;
      module = absl::StrCat("module '", model.modules[i].name, "' gathers ", GiBText(bytes));
    }
  }
  for (const Region& reg : c.regions) {
    if (reg.min > region_b) {
      region_b = reg.min;
      region = absl::StrCat("region '", reg.name, "' keeps ", GiBText(reg.min));
    }
  }
  const MemoryBreakdown& m = ev.peak;
  return absl::ResourceExhaustedError(absl::StrCat(
      head, ". Closest: ", DenseLabel(model, *closest->dense), " + ", s.Label(), " needs ",
      GiBText(m.Total()), " per GPU, over by ", GiBText(ev.over_bytes), ": embedding shards ",
      GiBText(m.embedding), table.empty() ? "" : absl::StrCat(" (largest: ", table, ")"),
      ", dense shards ", GiBText(m.dense), ", optimizer ", GiBText(m.optimizer),
      ", activations at full checkpointing ", GiBText(m.activations),
      region.empty() ? "" : absl::StrCat(" (largest: ", region, ")"), ", buffers ",
      GiBText(m.buffers), module.empty() ? "" : absl::StrCat(" (largest: ", module, ")"),
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

// The sizes the job's hints fix (0: the planner decides), with the hint
// that fixed each, as explanations and errors quote it.
struct FixedSizes {
  int fsdp_group = 0;
  std::string fsdp_source;
  int table_group = 0;
  std::string table_source;
};

absl::StatusOr<FixedSizes> ResolveHints(const Topology& t, const ParallelismHints& h) {
  FixedSizes fixed;
  const int n = t.WorldSize();
  const std::vector<int> sizes = GroupSizes(t, n);
  auto divides = [&](const char* field, int v) -> absl::Status {
    if (n % v == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("parallelism.", field, ": ", v,
                                                   " does not divide the world size (", n,
                                                   " ranks)"));
  };
  // A size the planner cannot form as a group of consecutive ranks.
  auto nests = [&](const char* field, int group, const std::string& valid) -> absl::Status {
    if (std::find(sizes.begin(), sizes.end(), group) != sizes.end()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "parallelism.%s: a group of %d ranks does not nest with the fleet (%d nodes of %d "
        "ranks, NVLink domains of %d, zones of %d); a group must divide the NVLink domain or be "
        "whole domains inside a zone, or whole zones. Valid values: %s",
        field, group, t.num_nodes, t.gpus_per_node, t.NvlinkDomainSize(), t.ZoneSize(), valid));
  };
  std::vector<int> replicas;
  for (int g : sizes) replicas.insert(replicas.begin(), n / g);
  const std::string valid_groups = absl::StrJoin(sizes, ", ");
  if (h.fsdp_group_size > 0) {
    if (auto s = divides("fsdp_group_size", h.fsdp_group_size); !s.ok()) return s;
    if (auto s = nests("fsdp_group_size", h.fsdp_group_size, valid_groups); !s.ok()) return s;
    fixed.fsdp_group = h.fsdp_group_size;
    fixed.fsdp_source = absl::StrCat("parallelism.fsdp_group_size = ", h.fsdp_group_size);
  }
  if (h.replicas > 0) {
    if (auto s = divides("replicas", h.replicas); !s.ok()) return s;
    const int g = n / h.replicas;
    if (fixed.fsdp_group > 0 && fixed.fsdp_group != g) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parallelism.fsdp_group_size (", h.fsdp_group_size, ") x parallelism.replicas (",
          h.replicas, ") must equal the world size (", n, "), got ",
          h.fsdp_group_size * h.replicas));
    }
    if (fixed.fsdp_group == 0) {
      if (auto s = nests("replicas", g, absl::StrJoin(replicas, ", ")); !s.ok()) return s;
      fixed.fsdp_group = g;
      fixed.fsdp_source =
          absl::StrCat("parallelism.replicas = ", h.replicas, " (FSDP groups of ", g, ")");
    }
  }
  if (h.table_sharding_group_size > 0) {
    const int m = h.table_sharding_group_size;
    if (auto s = divides("table_sharding_group_size", m); !s.ok()) return s;
    if (auto s = nests("table_sharding_group_size", m, valid_groups); !s.ok()) return s;
    fixed.table_group = m;
    fixed.table_source = absl::StrCat("parallelism.table_sharding_group_size = ", m);
  }
  return fixed;
}

// "set by the job's hints (...)"; empty when `source` is.
std::string HintPrefix(const std::string& source) {
  return source.empty() ? "" : absl::StrCat("set by the job's hints (", source, "); ");
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const Topology& topology, const PlanRequest& request) {
  if (auto s = ValidateTopology(topology); !s.ok()) return s;
  if (auto s = ValidateRequest(request); !s.ok()) return s;
  absl::StatusOr<FixedSizes> fixed = ResolveHints(topology, request.hints);
  if (!fixed.ok()) return fixed.status();
  const Model& model = request.model;
  const Context ctx = MakeContext(topology, request);

  // Stages 1-2: options, and the tables sharded for each sparse layout. A
  // hinted size the planner would not consider itself (a group crossing
  // zones, a table group above planner.max_model_parallel_group) is added
  // as an option of its own, which the planner's own choice never takes.
  std::vector<DenseOption> dense = EnumerateDense(topology, model, request.options);
  const size_t own_dense = dense.size();
  std::vector<SparseOption> sparse = EnumerateSparse(topology, request.options);
  const size_t own_sparse = sparse.size();
  const int n = ctx.world;
  auto dense_fits_hint = [&](const DenseOption& d) {
    return fixed->fsdp_group == 0 || d.fsdp_group == fixed->fsdp_group;
  };
  // A table group of consecutive ranks with the tables replicated across
  // groups: V2, or V1 over the whole fleet.
  auto sparse_fits_hint = [&](const SparseOption& s) {
    return fixed->table_group == 0 ||
           (s.m == fixed->table_group && s.s == 1 &&
            s.scheme == (s.m == n && n > 1 ? SparseScheme::kV1 : SparseScheme::kV2));
  };
  if (fixed->fsdp_group > 0 && std::none_of(dense.begin(), dense.end(), dense_fits_hint)) {
    for (DenseOption& d : EnumerateDenseGroup(topology, model, fixed->fsdp_group)) {
      dense.push_back(std::move(d));
    }
  }
  if (fixed->table_group > 0 && std::none_of(sparse.begin(), sparse.end(), sparse_fits_hint)) {
    const int m = fixed->table_group;
    sparse.push_back({m == n && n > 1 ? SparseScheme::kV1 : SparseScheme::kV2, m, 1});
  }
  for (SparseOption& s : sparse) {
    ShardingInput in{&model, &topology, &request.precision, &request.efficiency,
                     &request.options, MakeGroup(topology, s.m, s.s), request.local_batch,
                     s.s, ctx.usable};
    s.sharding = ShardTables(in);
    if (s.sharding.ok()) s.Summarize();
  }
  if (fixed->table_group > 0) {
    const auto hinted = std::find_if(sparse.begin(), sparse.end(), sparse_fits_hint);
    if (!hinted->sharding.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          fixed->table_source, ": the tables do not fit a group of ", fixed->table_group, ": ",
          hinted->sharding.status().message(),
          ". Fix: a larger parallelism.table_sharding_group_size, or leave it unset (0) for the "
          "planner to choose"));
    }
  }

  // Stage 3: estimate every pair; remember the best per dimension value,
  // under the job's hints, and the planner's own best without them.
  std::optional<Candidate> best, closest, own_best;
  DimensionTable by_group, by_layout;
  int evaluated = 0;
  bool fits_if_crossing_zones = false;
  for (size_t si = 0; si < sparse.size(); ++si) {
    const SparseOption& s = sparse[si];
    if (!s.sharding.ok()) continue;
    const bool sparse_hinted = sparse_fits_hint(s);
    for (size_t di = 0; di < dense.size(); ++di) {
      const DenseOption& d = dense[di];
      const bool dense_hinted = dense_fits_hint(d);
      const bool own = si < own_sparse && di < own_dense;
      if (!(dense_hinted && sparse_hinted) && !own) continue;
      Evaluation ev = Evaluate(ctx, d, s);
      ++evaluated;
      if (own && ev.feasible && (!own_best || Better(ev, own_best->eval))) {
        own_best = Candidate{&d, &s, ev};
      }
      // Each dimension's alternatives keep the other dimension's hint.
      if (sparse_hinted) by_group.Offer(absl::StrCat("FSDP group ", d.fsdp_group), ev);
      if (dense_hinted) by_layout.Offer(s.Label(), ev);
      if (!(dense_hinted && sparse_hinted)) continue;
      if (ev.feasible) {
        if (!best || Better(ev, best->eval)) best = Candidate{&d, &s, std::move(ev)};
      } else if (ev.memory_ok) {
        fits_if_crossing_zones = true;
      } else if (!closest || ev.over_bytes < closest->eval.over_bytes) {
        closest = Candidate{&d, &s, std::move(ev)};
      }
    }
  }
  std::vector<std::string> hint_sources;
  for (const std::string* h : {&fixed->fsdp_source, &fixed->table_source}) {
    if (!h->empty()) hint_sources.push_back(*h);
  }
  const std::string hints_text = absl::StrJoin(hint_sources, "; ");
  if (!best) {
    const std::string under_hints =
        hints_text.empty() ? "" : absl::StrCat("with the job's hints (", hints_text, "): ");
    if (!closest && fits_if_crossing_zones) {
      return absl::FailedPreconditionError(absl::StrCat(
          under_hints,
          "every layout that fits puts an all-gather or all-to-all on cross-zone links; set "
          "planner.allow_cross_zone_non_gradient: true, use fewer zones",
          hints_text.empty() ? ""
                             : absl::StrCat(", or hinted groups of at most a zone (",
                                            topology.ZoneSize(), " ranks)")));
    }
    absl::Status error = NothingFits(ctx, sparse, closest ? &*closest : nullptr);
    std::string message = absl::StrCat(under_hints, error.message());
    if (fits_if_crossing_zones) {
      absl::StrAppend(&message, "; or allow all-to-alls and all-gathers across zones "
                                "(planner.allow_cross_zone_non_gradient: true), which some "
                                "layouts fit");
    }
    if (!hints_text.empty() && own_best) {
      absl::StrAppend(&message, "; or drop the hints: the planner's own choice (",
                      DenseLabel(model, *own_best->dense), " + ", own_best->sparse->Label(),
                      ") fits");
    }
    return absl::Status(error.code(), message);
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
      c.window = WindowName(model, ev.windows[o.window]);
      c.window_s = ev.windows[o.window].compute_s;
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

  const std::string usable = GiBText(ctx.usable);
  // Dense mesh.
  {
    std::string levels = DescribeGroup(MakeGroup(topology, bd.fsdp_group, 1));
    std::string reason = absl::StrFormat(
        "%s (%s, peak %s of %s usable); the FSDP group spans %s and its "
        "%d replicas exchange only shard gradients (%s)",
        fixed->fsdp_group > 0 ? "step" : "fastest feasible step", MsText(ev.step.total_s), GiBText(ev.peak.Total()), usable, levels, plan.dense.replicas,
        DescribeGroup(MakeGroup(topology, plan.dense.replicas, bd.fsdp_group)));
    plan.decisions.push_back(by_group.Explain("dense mesh (2D FSDP)",
                                              absl::StrCat("FSDP group ", bd.fsdp_group),
                                              HintPrefix(fixed->fsdp_source) + reason, ev));
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
        "%s: embedding shards %s on the fullest rank, lookup imbalance %.2fx, all-to-alls span %s",
        fixed->table_group > 0 ? "tables" : "fastest feasible layout", GiBText(bs.emb_max), sh.compute_imbalance, DescribeGroup(MakeGroup(topology, bs.m, bs.s)));
    if (bs.scheme == SparseScheme::kV3) {
      absl::StrAppend(&reason, absl::StrFormat("; the shards are split %d-way over %s", bs.s,
                                               DescribeGroup(MakeGroup(topology, bs.s, 1))));
    }
    Decision dec = by_layout.Explain("sparse layout (2D model parallelism)", bs.Label(),
                                     HintPrefix(fixed->table_source) + reason, ev);
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
    std::string chosen = absl::StrCat(cut, " of ", plan.checkpoint.size(), " regions cut");
    for (const RegionBudget& rb : plan.checkpoint) {
      if (rb.recomputed_units > 0) {
        absl::StrAppend(&chosen, "; ", rb.region, ": ", rb.recomputed_units, " of ", rb.units,
                        " blocks recomputed");
      }
    }
    std::string asked;
    if (!request.recompute_regions.empty()) {
      asked = absl::StrCat("the job recomputes ", absl::StrJoin(request.recompute_regions, ", "),
                           " (activation_memory.recompute); ");
    } else if (request.activation_budget_bytes > 0) {
      asked = absl::StrCat("the job's budget is ", GiBText(request.activation_budget_bytes),
                           " of activations (activation_memory.budget_bytes); ");
    }
    const double left = request.activation_budget_bytes > 0
                            ? std::min(ctx.usable - other, request.activation_budget_bytes)
                            : ctx.usable - other;
    plan.decisions.push_back(
        {"activation checkpointing", chosen,
         asked + (cut == 0 ? absl::StrFormat("all activations (%s) fit beside %s of shards and buffers",
                                             GiBText(full), GiBText(other))
                           : absl::StrFormat("activations need %s and %s is allowed beside %s of "
                                             "shards and buffers; regions are cut cheapest recompute "
                                             "per GiB first, costing %s of recompute",
                                             GiBText(full), GiBText(left), GiBText(other),
                                             MsText(ev.step.recompute_s)))});
  }
  // The job's per-layer precision recipe, as the step estimate used it.
  if (!request.precision.recipe.empty()) {
    plan.decisions.push_back(
        {"precision", request.precision.recipe,
         absl::StrFormat("the job's recipe (model.precision); GEMMs of %s estimated at %.2fx the bf16 rate",
                         request.precision.fp8_modules.empty()
                             ? std::string("no planned module")
                             : absl::StrJoin(request.precision.fp8_modules, ", "),
                         request.precision.fp8_speedup)});
  }
  // Where the compute rates came from.
  if (!request.rates_source.empty()) {
    plan.decisions.push_back(
        {"compute rates", request.rates_source,
         absl::StrFormat("GEMMs at %.0f%% and attention at %.0f%% of the %.0f TFLOP/s peak, the "
                         "optimizer at %.0f%% of HBM bandwidth, %s of other measured work per step "
                         "and %s of fixed memory",
                         100 * request.efficiency.gemm, 100 * request.efficiency.attention,
                         topology.peak_flops_per_gpu / 1e12, 100 * request.efficiency.elementwise,
                         MsText(ev.step.other_compute_s), GiBText(request.other_memory_bytes))});
  }
  // What the hints cost against the planner's own best.
  if (!hints_text.empty()) {
    Decision dec{"parallelism hints", hints_text};
    const std::string hinted = absl::StrCat(DenseLabel(model, bd), " + ", bs.Label());
    if (!own_best) {
      dec.reason = absl::StrFormat(
          "the hinted plan (%s) predicts %s per step; without the hints no plan the planner "
          "forms itself fits",
          hinted, MsText(ev.step.total_s));
    } else {
      const Evaluation& own = own_best->eval;
      const std::string own_label =
          absl::StrCat(DenseLabel(model, *own_best->dense), " + ", own_best->sparse->Label());
      const double cost = ev.step.total_s - own.step.total_s;
      if (own_best->dense == best->dense && own_best->sparse == best->sparse) {
        dec.reason = absl::StrFormat(
            "the hints match the planner's own choice (%s, %s per step, peak %s)", hinted,
            MsText(ev.step.total_s), GiBText(ev.peak.Total()));
      } else {
        dec.reason = absl::StrFormat(
            "the hinted plan (%s) predicts %s per step, peak %s; the planner's own best (%s) "
            "predicts %s, peak %s: the hints cost %s per step (%+.1f%%)",
            hinted, MsText(ev.step.total_s), GiBText(ev.peak.Total()), own_label,
            MsText(own.step.total_s), GiBText(own.peak.Total()), MsText(cost),
            100 * cost / own.step.total_s);
        Alternative a{absl::StrCat("planner's own choice: ", own_label), true, own.step.total_s,
                      own.peak.Total()};
        a.note = cost >= 0 ? absl::StrCat(MsText(cost), " faster than the hinted plan")
                           : absl::StrCat(MsText(-cost), " slower, less memory");
        dec.alternatives.push_back(std::move(a));
      }
    }
    plan.decisions.push_back(std::move(dec));
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
