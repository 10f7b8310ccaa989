// Predicted vs measured step time on the CPU cluster: the planner's step-time
// prediction for a small recommendation model, checked against real
// distributed training steps on this machine.
//
//   bazel build //bench/planner:cpu_step_bench
//   B=bazel-bin/bench/planner/cpu_step_bench D=bench/planner
//   $B --write_topology=$D/cpu_topology.yaml --write_job=$D/cpu_job.yaml   # calibrate + run
//   $B --topology=$D/cpu_topology.yaml --job=$D/cpu_job.yaml               # run only
//
// 1. Calibration (skipped when --topology and --job are given): one thread
//    per core, all at once (so caches and memory bandwidth are shared as in
//    training), measures in seconds of its own CPU time (whatever else the
//    machine runs)
//    - the CPU GEMM rate of kernels/gemm (the engine's CPU GEMM) on the
//      model's own layers at the local batch, forward and both backward
//      GEMMs: the topology's peak, with efficiency.gemm = 1;
//    - the memory rate an Adam step streams (kernels/ops, 28 bytes per
//      parameter): the topology's memory bandwidth, with
//      efficiency.elementwise = 1;
//    - the embedding kernels' lookup rate (pooled forward plus the fused
//      rowwise-Adagrad backward) in the planner's bytes: efficiency.embedding
//      is its fraction of that bandwidth;
//    and Gloo's loopback latency and bandwidth from two-rank all-gathers of
//    4 KiB .. 8 MiB. The results are written as a planner topology (one node
//    whose ranks share cpu_cores_per_node cores) and a planner job file for
//    the model, so `recfleet plan cpu_job.yaml --topology cpu_topology.yaml`
//    prints the same prediction.
// 2. For each configuration, the planner plans the model with the
//    configuration's parallelism hints on that node (ranks = world), with
//    synchronous collectives (planner.overlap_collectives: false): the
//    prediction. Then `world` ranks (threads of this process, each with its
//    own Gloo transport on 127.0.0.1) train the same model with worker/dist:
//    dist::TrainingGroups from the same hints, FsdpFlatParameter over the
//    MLP's flat parameter (all-gather, reduce-scatter + replica all-reduce,
//    Adam on the shard), ShardedEmbeddingCollection with the planner's
//    table placement (forward and backward all-to-alls, replica exchange,
//    rowwise Adagrad), kernels/gemm for the MLP. Measured: the slowest rank's
//    mean step over --steps steps after --warmup steps, the fastest of
//    --rounds interleaved rounds (the machine is shared: the fastest round
//    is the least disturbed), with the CPU cores the process obtained
//    meanwhile (its CPU seconds per wall second). The planner's step on a
//    node of that many cores is printed beside the prediction, so the
//    machine's other load and the model's own error can be told apart.
//
// The model: kNumeric dense features plus kTables pooled tables feed an MLP
// (--hidden widths, then one logit); loss BCE on synthetic labels.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <sys/resource.h>
#include <time.h>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/linear.h"
#include "kernels/ops/adam.h"
#include "kernels/tensor.h"
#include "planner/planner.h"
#include "planner/yaml_io.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"
#include "worker/dist/fsdp.h"
#include "worker/dist/layout.h"
#include "worker/dist/sharded_embedding.h"

ABSL_FLAG(std::string, topology, "", "calibrated CPU topology YAML; empty: calibrate now");
ABSL_FLAG(std::string, job, "", "the model as a planner job YAML, with calibrated efficiencies");
ABSL_FLAG(std::string, write_topology, "/tmp/cpu_topology.yaml", "where calibration writes the topology");
ABSL_FLAG(std::string, write_job, "/tmp/cpu_job.yaml", "where calibration writes the job");
ABSL_FLAG(int, batch, 4, "samples per rank per step");
ABSL_FLAG(std::string, hidden, "1024,1024", "MLP hidden widths");
ABSL_FLAG(int, table_rows, 100000, "rows of each table");
ABSL_FLAG(int, steps, 8, "timed steps per configuration and round");
ABSL_FLAG(int, warmup, 2, "untimed steps per configuration and round");
ABSL_FLAG(int, rounds, 3, "rounds over all configurations; each keeps its fastest round");
ABSL_FLAG(std::string, configs, "2:2:0:2,4:2:2:2,4:4:0:4",
          "configurations world:fsdp_group_size:replicas:table_sharding_group_size (0: unset)");

namespace recfleet {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kNumeric = 128;   // Dense features per sample.
constexpr int kTables = 4;
constexpr int kDim = 32;
constexpr int kBag = 4;         // Ids per sample per table (the pooling factor).
constexpr int kCores = 2;       // Cores of the node the topology describes.

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU seconds of the calling thread: what a kernel costs on a core of its
// own, whatever else the machine runs.
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// User + system CPU seconds of this process, all threads.
double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

template <typename T>
T Median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string Today() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return absl::StrCat(one, " ", five, " ", fifteen);
}

void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

// ---------------------------------------------------------------------------
// The model.

struct ModelShape {
  int batch = 0;
  std::vector<int64_t> widths;  // Input width, hidden widths, 1.
  int64_t rows = 0;

  int64_t Params() const {
    int64_t p = 0;
    for (size_t l = 0; l + 1 < widths.size(); ++l) p += widths[l] * widths[l + 1] + widths[l + 1];
    return p;
  }
  double ForwardFlopsPerSample() const {
    double f = 0;
    for (size_t l = 0; l + 1 < widths.size(); ++l) f += 2.0 * widths[l] * widths[l + 1];
    return f;
  }
};

// The planner's view of the model: one dense module (the MLP is one flat
// FSDP parameter, so one all-gather and one gradient reduction per step),
// fp32 everywhere (Gloo moves fp32), no overlap.
planner::PlanRequest Describe(const ModelShape& m, double embedding_efficiency) {
  planner::PlanRequest r;
  r.model.name = "cpu-mlp";
  r.local_batch = m.batch;
  planner::DenseModule mlp;
  mlp.name = "mlp";
  mlp.params = m.Params();
  mlp.flops_per_sample = m.ForwardFlopsPerSample();
  double units = 0;
  for (size_t l = 1; l < m.widths.size(); ++l) units += static_cast<double>(m.widths[l]);
  mlp.activation_bytes_per_sample = 2 * units * 4;
  mlp.io_bytes_per_sample = static_cast<double>(m.widths[0]) * 4;
  r.model.modules.push_back(mlp);
  for (int t = 0; t < kTables; ++t) {
    planner::Table table;
    table.name = absl::StrCat("t_", t);
    table.rows = m.rows;
    table.dim = kDim;
    table.pooling_factor = kBag;
    r.model.tables.push_back(table);
  }
  planner::PrecisionRecipe& p = r.precision;
  p.weight_gather_bytes = 4;
  p.gradient_reduce_bytes = 4;
  p.embedding_comm_bytes = 4;
  r.efficiency.gemm = 1;         // The topology's peak is this GEMM's measured rate,
  r.efficiency.elementwise = 1;  // its bandwidth what Adam streams.
  r.efficiency.embedding = embedding_efficiency;
  r.options.hbm_reserve_fraction = 0;
  r.options.overlap_collectives = false;
  return r;
}

// `request` (from Describe) in the planner's job format.
std::string JobYaml(const planner::PlanRequest& r) {
  const planner::DenseModule& mlp = r.model.modules[0];
  const planner::Table& t = r.model.tables[0];
  return absl::StrFormat(
      "# The cpu_step_bench model as the planner sees it, written by the bench's\n"
      "# calibration on %s (see bench/planner/cpu_step_bench.cc): efficiencies are\n"
      "# fractions of cpu_topology.yaml's measured rates.\n"
      "name: %s\n"
      "batch: {local: %d}\n"
      "precision: {weights: fp32, gradients: fp32, embedding: fp32, embedding_comm: fp32}\n"
      "efficiency: {gemm: %.6g, elementwise: %.6g, embedding: %.6g}\n"
      "planner: {hbm_reserve: 0, overlap_collectives: false}\n"
      "model:\n"
      "  dense:\n"
      "    - {name: %s, params: %lld, flops_per_sample: %.10g,\n"
      "       activation_bytes_per_sample: %.10g, io_bytes_per_sample: %.10g}\n"
      "  tables:\n"
      "    - {name: t, count: %d, rows: %lld, dim: %d, pooling_factor: %.10g}\n",
      Today(), r.model.name, r.local_batch, r.efficiency.gemm, r.efficiency.elementwise,
      r.efficiency.embedding, mlp.name, static_cast<long long>(mlp.params), mlp.flops_per_sample,
      mlp.activation_bytes_per_sample, mlp.io_bytes_per_sample,
      static_cast<int>(r.model.tables.size()), static_cast<long long>(t.rows), t.dim,
      t.pooling_factor);
}

TensorView View(std::vector<float>& v, Shape shape) {
  return MakeView(v.data(), DType::kFloat32, std::move(shape));
}

// MLP forward and backward over a flat parameter [W0, b0, W1, b1, ...] with
// ReLU between layers, a logit and BCE loss; fills the flat gradient and
// the input gradient. Every GEMM is kernels/gemm at native fp32.
class Mlp {
 public:
  explicit Mlp(const ModelShape& m) : m_(m) {
    const size_t layers = m.widths.size() - 1;
    acts_.resize(layers + 1);
    grads_.resize(layers + 1);
    for (size_t l = 0; l <= layers; ++l) {
      acts_[l].resize(m.batch * m.widths[l]);
      grads_[l].resize(m.batch * m.widths[l]);
    }
  }

  // x: [batch, widths[0]]; params/grad: flat, at least Params() long.
  absl::Status Step(const std::vector<float>& x, const std::vector<float>& labels,
                    std::vector<float>& params, std::vector<float>& grad, std::vector<float>& dx) {
    const LinearRecipe native{GemmPrecision::kNative, GemmPrecision::kNative,
                              GemmPrecision::kNative};
    const int64_t b = m_.batch;
    const size_t layers = m_.widths.size() - 1;
    acts_[0] = x;
    std::vector<int64_t> offsets;
    int64_t off = 0;
    for (size_t l = 0; l < layers; ++l) {
      offsets.push_back(off);
      off += m_.widths[l] * m_.widths[l + 1] + m_.widths[l + 1];
    }
    auto w = [&](std::vector<float>& flat, size_t l) {
      return MakeView(flat.data() + offsets[l], DType::kFloat32, {m_.widths[l + 1], m_.widths[l]});
    };
    auto bias = [&](std::vector<float>& flat, size_t l) {
      return MakeView(flat.data() + offsets[l] + m_.widths[l] * m_.widths[l + 1], DType::kFloat32,
                      {m_.widths[l + 1]});
    };
    for (size_t l = 0; l < layers; ++l) {
      absl::Status s = LinearForward(View(acts_[l], {b, m_.widths[l]}), w(params, l),
                                     bias(params, l), View(acts_[l + 1], {b, m_.widths[l + 1]}),
                                     native);
      if (!s.ok()) return s;
      if (l + 1 < layers) {
        for (float& v : acts_[l + 1]) v = std::max(v, 0.0f);
      }
    }
    // d(mean BCE)/d(logit) = (sigmoid(z) - y) / b.
    for (int64_t i = 0; i < b; ++i) {
      grads_[layers][i] = (1.0f / (1.0f + std::exp(-acts_[layers][i])) - labels[i]) / b;
    }
    for (size_t l = layers; l-- > 0;) {
      if (l + 1 < layers) {
        for (size_t i = 0; i < grads_[l + 1].size(); ++i) {
          if (acts_[l + 1][i] <= 0) grads_[l + 1][i] = 0;
        }
      }
      const TensorView dy = View(grads_[l + 1], {b, m_.widths[l + 1]});
      absl::Status s = LinearBackwardWeight(dy, View(acts_[l], {b, m_.widths[l]}), w(grad, l),
                                            bias(grad, l), false, native);
      if (!s.ok()) return s;
      s = LinearBackwardInput(dy, w(params, l), View(grads_[l], {b, m_.widths[l]}), native);
      if (!s.ok()) return s;
    }
    dx = grads_[0];
    return absl::OkStatus();
  }

 private:
  ModelShape m_;
  std::vector<std::vector<float>> acts_, grads_;
};

// One rank's synthetic batch: numeric features, labels, and per table
// kBag ids per sample from a skewed distribution.
struct Batch {
  std::vector<float> numeric, labels;
  std::vector<std::vector<int64_t>> ids, offsets;
  std::vector<JaggedView> views;
};

Batch MakeBatch(const ModelShape& m, int rank, int step) {
  std::mt19937_64 rng(1000003ull * rank + step);
  std::uniform_real_distribution<float> u(-1, 1);
  Batch b;
  b.numeric.resize(m.batch * kNumeric);
  for (float& v : b.numeric) v = u(rng);
  for (int i = 0; i < m.batch; ++i) b.labels.push_back(b.numeric[i * kNumeric] > 0 ? 1.0f : 0.0f);
  b.ids.resize(kTables);
  b.offsets.resize(kTables);
  for (int t = 0; t < kTables; ++t) {
    b.offsets[t].push_back(0);
    for (int i = 0; i < m.batch; ++i) {
      for (int k = 0; k < kBag; ++k) {
        const double r = std::pow(std::uniform_real_distribution<double>(0, 1)(rng), 3);
        b.ids[t].push_back(static_cast<int64_t>(r * (m.rows - 1)));
      }
      b.offsets[t].push_back(static_cast<int64_t>(b.ids[t].size()));
    }
  }
  for (int t = 0; t < kTables; ++t) {
    b.views.push_back(JaggedView{
        MakeView(b.ids[t].data(), DType::kInt64, {static_cast<int64_t>(b.ids[t].size())}),
        MakeView(b.offsets[t].data(), DType::kInt64, {static_cast<int64_t>(b.offsets[t].size())})});
  }
  return b;
}

// ---------------------------------------------------------------------------
// Calibration.

// Runs `measure` (which returns rates) on every core of the node at once,
// each thread on its own data, and returns the median rate: the per-core
// rate while all cores train, sharing caches and memory bandwidth.
double OnEveryCore(const std::function<std::vector<double>()>& measure) {
  std::vector<std::vector<double>> per_thread(kCores);
  std::vector<std::thread> threads;
  for (int c = 0; c < kCores; ++c) threads.emplace_back([&, c] { per_thread[c] = measure(); });
  for (std::thread& t : threads) t.join();
  std::vector<double> all;
  for (const auto& r : per_thread) all.insert(all.end(), r.begin(), r.end());
  return Median(all);
}

// FLOP/s of the MLP's GEMMs (forward + both backward) at the local batch.
std::vector<double> MeasureGemm(const ModelShape& m) {
  Mlp mlp(m);
  std::vector<float> params(m.Params(), 0.01f), grad(m.Params()), dx;
  const Batch b = MakeBatch(m, 0, 0);
  std::vector<float> x(m.batch * m.widths[0], 0.5f), labels = b.labels;
  std::vector<double> rates;
  Check(mlp.Step(x, labels, params, grad, dx), "gemm warmup");
  for (int i = 0; i < 5; ++i) {
    const double t0 = ThreadCpuSeconds();
    Check(mlp.Step(x, labels, params, grad, dx), "gemm");
    rates.push_back(3 * m.ForwardFlopsPerSample() * m.batch / (ThreadCpuSeconds() - t0));
  }
  return rates;
}

// Bytes per second an Adam step streams (fp32 master weights, gradient,
// m and v read; weights, m and v written: 28 bytes per parameter).
std::vector<double> MeasureAdam(const ModelShape& m) {
  const int64_t n = m.Params();
  std::vector<float> p(n, 0.01f), g(n, 0.001f), mm(n, 0.0f), vv(n, 0.0f);
  std::vector<double> rates;
  for (int i = 0; i < 5; ++i) {
    const double t0 = ThreadCpuSeconds();
    Check(AdamStep(AdamConfig{}, i + 1, View(p, {n}), View(g, {n}), View(mm, {n}), View(vv, {n})),
          "adam");
    rates.push_back(28.0 * n / (ThreadCpuSeconds() - t0));
  }
  return rates;
}

// The lookup rate in the planner's units: 4 passes (forward read, backward
// read-modify-write and its optimizer row) of dim x 4 bytes per looked-up id.
std::vector<double> MeasureLookups(const ModelShape& m) {
  std::vector<float> table(m.rows * kDim, 0.01f), momentum(m.rows, 0.0f);
  std::vector<float> out(m.batch * kDim), grad(m.batch * kDim, 0.001f);
  const TensorView tv = View(table, {m.rows, kDim});
  std::vector<double> rates;
  for (int i = 0; i < 7; ++i) {
    Batch b = MakeBatch(m, 0, i);
    const double t0 = ThreadCpuSeconds();
    for (int t = 0; t < kTables; ++t) {
      Check(EmbeddingBagForward(tv, b.views[t], Pooling::kSum, View(out, {m.batch, kDim})),
            "lookup");
      Check(EmbeddingBagBackwardAdagrad(View(grad, {m.batch, kDim}), b.views[t], Pooling::kSum,
                                        RowwiseAdagradConfig{}, tv, View(momentum, {m.rows})),
            "lookup backward");
    }
    const double bytes = 4.0 * kTables * m.batch * kBag * kDim * 4;
    if (i > 0) rates.push_back(bytes / (ThreadCpuSeconds() - t0));
  }
  return rates;
}

// `world` Gloo ranks as threads, each with its own transport and store view.
struct ThreadedRanks {
  comm::InProcessKvStore store;
  absl::Status Run(int world, const std::function<absl::Status(int, comm::KvStore&,
                                                                 const comm::CommFactory&)>& fn) {
    std::vector<std::thread> threads;
    std::vector<absl::Status> status(world);
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        absl::StatusOr<std::shared_ptr<comm::GlooTransport>> transport =
            comm::GlooTransport::Create("127.0.0.1");
        if (!transport.ok()) {
          status[r] = transport.status();
          return;
        }
        comm::CommFactory factory = [t = *transport](comm::KvStore& s, int rank, int size) {
          return comm::ConnectGloo(s, rank, size, t, comm::CommOptions{});
        };
        status[r] = fn(r, store, factory);
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : status) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
};

struct AlphaBeta {
  double alpha_s = 0, beta_bytes_per_s = 0;
  std::vector<std::pair<double, double>> points;  // (bytes sent per rank, seconds).
};

// Two-rank all-gathers; per size the fastest of 30 calls (the slower rank):
// the machine is shared, and the fastest call is the least disturbed.
AlphaBeta MeasureLoopback() {
  const std::vector<int64_t> sizes = {1 << 12, 1 << 15, 1 << 18, 1 << 20, 1 << 21, 1 << 22,
                                      1 << 23};
  std::vector<std::vector<double>> times(2, std::vector<double>(sizes.size()));
  ThreadedRanks ranks;
  Check(ranks.Run(2,
                  [&](int rank, comm::KvStore& store, const comm::CommFactory& factory) {
                    comm::PrefixKvStore scoped(&store, "loopback/");
                    absl::StatusOr<std::unique_ptr<comm::Communicator>> c = factory(scoped, rank, 2);
                    if (!c.ok()) return c.status();
                    for (size_t i = 0; i < sizes.size(); ++i) {
                      const int64_t n = sizes[i] / 4;  // Floats in the gathered buffer.
                      std::vector<float> in(n / 2, 1.0f), out(n);
                      std::vector<double> t;
                      for (int k = 0; k < 33; ++k) {
                        const auto t0 = Clock::now();
                        absl::Status s = (*c)->AllGather(View(in, {n / 2}), View(out, {n}));
                        if (!s.ok()) return s;
                        if (k >= 3) t.push_back(Seconds(t0, Clock::now()));
                      }
                      times[rank][i] = *std::min_element(t.begin(), t.end());
                    }
                    return absl::OkStatus();
                  }),
        "loopback all-gather");
  AlphaBeta ab;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ab.points.push_back({sizes[i] / 2.0, std::max(times[0][i], times[1][i])});
  }
  // Alpha: the smallest message, which is all latency; beta: the slope
  // between the two largest, which is all bandwidth.
  const auto& [x0, y0] = ab.points[ab.points.size() - 2];
  const auto& [x1, y1] = ab.points.back();
  ab.alpha_s = ab.points.front().second;
  ab.beta_bytes_per_s = (x1 - x0) / std::max(y1 - y0, 1e-9);
  return ab;
}

std::string TopologyYaml(double gemm_flops, double stream_bytes, const AlphaBeta& ab) {
  std::string points;
  for (const auto& [bytes, s] : ab.points) {
    absl::StrAppendFormat(&points, "#   %9.0f bytes per rank: %9.1f us\n", bytes, s * 1e6);
  }
  return absl::StrFormat(
      "# This machine as the planner sees it, measured by bench/planner/cpu_step_bench\n"
      "# on %s: peak_tflops is kernels/gemm's fp32 CPU rate on the bench model's\n"
      "# layers and hbm_bandwidth_gbps what an Adam step streams (kernels/ops), both\n"
      "# per second of a thread's CPU time with every core busy; the link is Gloo over\n"
      "# loopback,\n"
      "# two-rank all-gathers (fastest of 30 calls; latency = the smallest, bandwidth =\n"
      "# the slope between the two largest):\n%s"
      "# gpus_per_node is the number of ranks; the bench sets it per configuration.\n"
      "name: cpu-loopback\n"
      "nodes: 1\n"
      "gpus_per_node: %d\n"
      "cpu_cores_per_node: %d\n"
      "gpu: {hbm_gib: 16, peak_tflops: %.6g, hbm_bandwidth_gbps: %.4g}\n"
      "links:\n"
      "  nvlink: {bandwidth_gbps: %.4g, latency_us: %.4g}\n",
      Today(), points, kCores, kCores, gemm_flops / 1e12, stream_bytes / 1e9, ab.beta_bytes_per_s / 1e9,
      ab.alpha_s * 1e6);
}

// ---------------------------------------------------------------------------
// Measurement: real training steps with worker/dist.

struct Config {
  int world = 0;
  planner::ParallelismHints hints;
  std::string Label() const {
    return absl::StrFormat("world %d, fsdp_group_size %d, replicas %d, tables over %d", world,
                           hints.fsdp_group_size, hints.replicas,
                           hints.table_sharding_group_size);
  }
};

// The planner's table layout in worker/dist's terms, as the workers read
// it from a plan (dist::PlacementsFromPlan).
absl::StatusOr<dist::EmbeddingShardingPlan> Placement(const planner::Plan& plan,
                                                      const ModelShape& m) {
  std::vector<dist::EmbeddingTableConfig> tables;
  std::vector<dist::PlannedTable> planned;
  for (const planner::TableSharding& ts : plan.sparse.sharding.tables) {
    tables.push_back({ts.name, m.rows, kDim, Pooling::kSum});
    planned.push_back({ts.name, planner::ShardingTypeName(ts.type), ts.num_shards, ts.ranks});
  }
  absl::StatusOr<std::vector<dist::TablePlacement>> placements =
      dist::PlacementsFromPlan(tables, planned, plan.sparse.mp_group);
  if (!placements.ok()) return placements.status();
  return dist::EmbeddingShardingPlan::Create(std::move(tables), *std::move(placements),
                                             plan.sparse.mp_group);
}

struct Measured {
  double step_s = 0;  // The slowest rank's mean step.
  double cores = 0;   // CPU seconds this process got per wall second meanwhile.
  double rank_cpu_s = 0;  // CPU seconds of a rank's own thread per step, mean over ranks.
};

absl::StatusOr<Measured> Measure(const Config& cfg, const planner::Plan& plan, const ModelShape& m,
                               int warmup, int steps) {
  absl::StatusOr<dist::EmbeddingShardingPlan> sharding = Placement(plan, m);
  if (!sharding.ok()) return sharding.status();
  absl::StatusOr<dist::ParallelLayout> layout = dist::ParallelLayout::FromHints(
      cfg.world, {cfg.hints.fsdp_group_size, cfg.hints.replicas, cfg.hints.table_sharding_group_size});
  if (!layout.ok()) return layout.status();
  std::vector<double> step_s(cfg.world), rank_cpu_s(cfg.world);
  double cpu_start = 0, cpu_end = 0;
  ThreadedRanks ranks;
  absl::Status s = ranks.Run(cfg.world, [&](int rank, comm::KvStore& store,
                                            const comm::CommFactory& factory) -> absl::Status {
    absl::StatusOr<dist::TrainingGroups> groups =
        dist::TrainingGroups::Build(*layout, rank, store, factory);
    if (!groups.ok()) return groups.status();
    const int64_t params = m.Params();
    absl::StatusOr<dist::FsdpFlatParameter> fsdp =
        dist::FsdpFlatParameter::Create(params, groups->fsdp(), groups->replica());
    if (!fsdp.ok()) return fsdp.status();
    const dist::FlatShardLayout fl = fsdp->layout();
    std::vector<float> shard(fl.shard_numel), shard_grad(fl.shard_numel), am(fl.shard_numel),
        av(fl.shard_numel), full(fl.padded_numel), full_grad(fl.padded_numel, 0.0f);
    std::mt19937 rng(7);
    std::normal_distribution<float> init(0, 0.02f);
    for (float& v : shard) v = init(rng);
    absl::StatusOr<std::unique_ptr<dist::ShardedEmbeddingCollection>> emb =
        dist::ShardedEmbeddingCollection::Create(*sharding, groups->tables(),
                                                 groups->table_replica(), RowwiseAdagradConfig{});
    if (!emb.ok()) return emb.status();
    absl::Status st = (*emb)->Initialize([](int t, int64_t row, int64_t col) {
      return 0.01f * std::sin(0.1f * t + 0.37f * row + col);
    });
    if (!st.ok()) return st;
    Mlp mlp(m);
    std::vector<std::vector<float>> pooled(kTables, std::vector<float>(m.batch * kDim)),
        pooled_grad(kTables, std::vector<float>(m.batch * kDim));
    std::vector<TensorView> out_views, grad_views;
    for (int t = 0; t < kTables; ++t) {
      out_views.push_back(View(pooled[t], {m.batch, kDim}));
      grad_views.push_back(View(pooled_grad[t], {m.batch, kDim}));
    }
    std::vector<Batch> batches;
    for (int k = 0; k < warmup + steps; ++k) batches.push_back(MakeBatch(m, rank, k));
    std::vector<float> x(m.batch * m.widths[0]), dx;
    const AdamConfig adam{1e-3, 0.9, 0.999, 1e-8, 0.0, true};
    Clock::time_point start;
    double thread_cpu_start = 0;
    for (int k = 0; k < warmup + steps; ++k) {
      if (k == warmup) {
        start = Clock::now();
        thread_cpu_start = ThreadCpuSeconds();
        if (rank == 0) cpu_start = ProcessCpuSeconds();
      }
      const Batch& b = batches[k];
      st = fsdp->AllGather(View(shard, {fl.shard_numel}), View(full, {fl.padded_numel}));
      if (!st.ok()) return st;
      st = (*emb)->Forward(b.views, out_views);
      if (!st.ok()) return st;
      for (int i = 0; i < m.batch; ++i) {
        float* row = &x[i * m.widths[0]];
        std::copy_n(&b.numeric[i * kNumeric], kNumeric, row);
        for (int t = 0; t < kTables; ++t) {
          std::copy_n(&pooled[t][i * kDim], kDim, row + kNumeric + t * kDim);
        }
      }
      st = mlp.Step(x, b.labels, full, full_grad, dx);
      if (!st.ok()) return st;
      for (int i = 0; i < m.batch; ++i) {
        for (int t = 0; t < kTables; ++t) {
          std::copy_n(&dx[i * m.widths[0] + kNumeric + t * kDim], kDim, &pooled_grad[t][i * kDim]);
        }
      }
      st = (*emb)->BackwardAndUpdate(grad_views);
      if (!st.ok()) return st;
      st = fsdp->ReduceGradients(View(full_grad, {fl.padded_numel}),
                                 View(shard_grad, {fl.shard_numel}), dist::GradReduction::kMean);
      if (!st.ok()) return st;
      st = AdamStep(adam, k + 1, View(shard, {fl.shard_numel}), View(shard_grad, {fl.shard_numel}),
                    View(am, {fl.shard_numel}), View(av, {fl.shard_numel}));
      if (!st.ok()) return st;
    }
    step_s[rank] = Seconds(start, Clock::now()) / steps;
    rank_cpu_s[rank] = (ThreadCpuSeconds() - thread_cpu_start) / steps;
    if (rank == 0) cpu_end = ProcessCpuSeconds();
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  Measured out;
  out.step_s = *std::max_element(step_s.begin(), step_s.end());
  out.cores = (cpu_end - cpu_start) / (step_s[0] * steps);
  for (double c : rank_cpu_s) out.rank_cpu_s += c / cfg.world;
  return out;
}

absl::StatusOr<std::vector<Config>> ParseConfigs(const std::string& text) {
  std::vector<Config> out;
  for (absl::string_view c : absl::StrSplit(text, ',')) {
    std::vector<std::string> f = absl::StrSplit(c, ':');
    Config cfg;
    if (f.size() != 4 || !absl::SimpleAtoi(f[0], &cfg.world) ||
        !absl::SimpleAtoi(f[1], &cfg.hints.fsdp_group_size) ||
        !absl::SimpleAtoi(f[2], &cfg.hints.replicas) ||
        !absl::SimpleAtoi(f[3], &cfg.hints.table_sharding_group_size) || cfg.world < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--configs: '", c, "' must be world:fsdp_group_size:replicas:table_sharding_group_size"));
    }
    out.push_back(cfg);
  }
  return out;
}

int Main() {
  ModelShape m;
  m.batch = absl::GetFlag(FLAGS_batch);
  m.rows = absl::GetFlag(FLAGS_table_rows);
  m.widths.push_back(kNumeric + kTables * kDim);
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_hidden), ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(w, &v) || v < 1) {
      std::fprintf(stderr, "--hidden: '%s' is not a width\n", std::string(w).c_str());
      return 2;
    }
    m.widths.push_back(v);
  }
  m.widths.push_back(1);
  absl::StatusOr<std::vector<Config>> configs = ParseConfigs(absl::GetFlag(FLAGS_configs));
  if (!configs.ok()) {
    std::fprintf(stderr, "%s\n", std::string(configs.status().message()).c_str());
    return 2;
  }
  std::printf("model: %d numeric + %d tables (%lld rows x %d, %d ids per sample) -> MLP", kNumeric,
              kTables, static_cast<long long>(m.rows), kDim, kBag);
  for (int64_t w : m.widths) std::printf(" %lld", static_cast<long long>(w));
  std::printf("; %lld dense params, %.3g forward FLOPs per sample, batch %d per rank\n",
              static_cast<long long>(m.Params()), m.ForwardFlopsPerSample(), m.batch);

  std::string topo_path = absl::GetFlag(FLAGS_topology);
  std::string job_path = absl::GetFlag(FLAGS_job);
  if (topo_path.empty() || job_path.empty()) {
    const double gemm = OnEveryCore([&] { return MeasureGemm(m); });
    const double stream = OnEveryCore([&] { return MeasureAdam(m); });
    const double lookups = OnEveryCore([&] { return MeasureLookups(m); });
    const AlphaBeta ab = MeasureLoopback();
    std::printf(
        "calibration: GEMM %.3f GFLOP/s; Adam streams %.3f GB/s (%.1f ms for all parameters); "
        "lookups %.3f GB/s (efficiency %.3f); loopback latency %.1f us, bandwidth %.3f GB/s\n",
        gemm / 1e9, stream / 1e9, 28.0 * m.Params() / stream * 1e3, lookups / 1e9,
        lookups / stream, ab.alpha_s * 1e6, ab.beta_bytes_per_s / 1e9);
    topo_path = absl::GetFlag(FLAGS_write_topology);
    job_path = absl::GetFlag(FLAGS_write_job);
    std::ofstream(topo_path) << TopologyYaml(gemm, stream, ab);
    std::ofstream(job_path) << JobYaml(Describe(m, std::min(1.0, lookups / stream)));
    std::printf("wrote %s and %s\n", topo_path.c_str(), job_path.c_str());
  }
  absl::StatusOr<planner::Topology> topo = planner::LoadTopologyYaml(topo_path);
  if (!topo.ok()) {
    std::fprintf(stderr, "%s\n", std::string(topo.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<planner::PlanRequest> job = planner::LoadJobYaml(job_path);
  if (!job.ok()) {
    std::fprintf(stderr, "%s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  if (job->local_batch != m.batch || job->model.modules.size() != 1 ||
      job->model.modules[0].params != m.Params() || job->model.tables.size() != kTables ||
      job->model.tables[0].rows != m.rows) {
    std::fprintf(stderr,
                 "%s describes another model than --batch, --hidden and --table_rows; "
                 "calibrate again without --topology and --job\n",
                 job_path.c_str());
    return 2;
  }
  // Plan every configuration, then measure them in interleaved rounds so a
  // burst of load from the machine's other users hits one round, not one
  // configuration.
  std::vector<planner::Plan> plans;
  for (const Config& cfg : *configs) {
    planner::Topology t = *topo;
    t.gpus_per_node = cfg.world;
    planner::PlanRequest request = *job;
    request.hints = cfg.hints;
    absl::StatusOr<planner::Plan> plan = planner::MakePlan(t, request);
    if (!plan.ok()) {
      std::fprintf(stderr, "%s: %s\n", cfg.Label().c_str(),
                   std::string(plan.status().message()).c_str());
      return 1;
    }
    plans.push_back(*std::move(plan));
  }
  std::printf("load average before: %s\n", LoadAverage().c_str());
  std::vector<std::vector<Measured>> rounds(configs->size());
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (size_t c = 0; c < configs->size(); ++c) {
      absl::StatusOr<Measured> measured = Measure((*configs)[c], plans[c], m,
                                                  absl::GetFlag(FLAGS_warmup),
                                                  absl::GetFlag(FLAGS_steps));
      if (!measured.ok()) {
        std::fprintf(stderr, "%s: %s\n", (*configs)[c].Label().c_str(),
                     std::string(measured.status().message()).c_str());
        return 1;
      }
      std::printf("round %d, %s: %.1f ms per step, %.2f cores, %.1f ms CPU per rank and step\n",
                  round, (*configs)[c].Label().c_str(), measured->step_s * 1e3, measured->cores,
                  measured->rank_cpu_s * 1e3);
      std::fflush(stdout);
      rounds[c].push_back(*measured);
    }
  }
  std::printf("load average after: %s\n", LoadAverage().c_str());

  std::printf(
      "\n| configuration | planner's mesh and layout | predicted ms (compute + exposed comm) | "
      "measured ms (fastest round; all rounds) | error | cores obtained | predicted ms with "
      "the cores obtained | error | rank CPU ms per step |\n|---|---|---|---|---|---|---|---|---|\n");
  for (size_t c = 0; c < configs->size(); ++c) {
    const Config& cfg = (*configs)[c];
    const planner::Plan& plan = plans[c];
    std::string tables, all;
    for (const planner::TableSharding& ts : plan.sparse.sharding.tables) {
      absl::StrAppend(&tables, tables.empty() ? "" : " ", planner::ShardingTypeName(ts.type));
    }
    const Measured best = *std::min_element(
        rounds[c].begin(), rounds[c].end(),
        [](const Measured& a, const Measured& b) { return a.step_s < b.step_s; });
    for (const Measured& r : rounds[c]) {
      absl::StrAppendFormat(&all, "%s%.0f", all.empty() ? "" : ", ", r.step_s * 1e3);
    }
    // The same plan's step on a node whose ranks got only the cores this
    // process was given during its fastest round.
    planner::Topology shared = plan.topology;
    shared.cpu_cores_per_node = std::min(best.cores, shared.cpu_cores_per_node);
    planner::PlanRequest request = *job;
    request.hints = cfg.hints;
    absl::StatusOr<planner::Plan> on_shared = planner::MakePlan(shared, request);
    if (!on_shared.ok()) {
      std::fprintf(stderr, "%s\n", std::string(on_shared.status().message()).c_str());
      return 1;
    }
    const planner::StepTime& st = plan.step;
    std::printf(
        "| %s | FSDP %d x %d, %s groups of %d (%s) | %.1f (%.1f + %.1f) | %.1f (%s) | %+.1f%% | "
        "%.2f | %.1f | %+.1f%% | %.1f |\n",
        cfg.Label().c_str(), plan.dense.fsdp_group, plan.dense.replicas,
        planner::SparseSchemeName(plan.sparse.scheme), plan.sparse.mp_group, tables.c_str(),
        st.total_s * 1e3, (st.ComputeS() + st.recompute_s) * 1e3, st.ExposedS() * 1e3,
        best.step_s * 1e3, all.c_str(), 100 * (st.total_s - best.step_s) / best.step_s,
        best.cores, on_shared->step.total_s * 1e3,
        100 * (on_shared->step.total_s - best.step_s) / best.step_s, best.rank_cpu_s * 1e3);
  }
  std::printf("\nerror = (predicted - measured) / measured\n");
  return 0;
}

}  // namespace
}  // namespace recfleet

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return recfleet::Main();
}
