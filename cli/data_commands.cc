// `recfleet data ...`: ingest, synth, balance-report, calibrate, info, planted-auc.
// Registered into the recfleet command table (cli/command.h).

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "cli/jobs/spec_file.h"
#include "data/balance.h"
#include "data/dataset_file.h"
#include "data/ingest.h"
#include "data/loader.h"
#include "data/synth.h"
#include "engine/calibrate.h"
#include "engine/cuda_device.h"
#include "engine/step_rates.h"
#include "worker/rank_sync.h"
#include "engine/job_model.h"

namespace recfleet::data {
namespace {

using cli::Flags;

int Fail(const absl::Status& s, const char* command) {
  std::fprintf(stderr, "recfleet data %s: %s\n", command, std::string(s.message()).c_str());
  bool usage = s.code() == absl::StatusCode::kInvalidArgument;
  if (usage) std::fprintf(stderr, "run `recfleet help data %s` for the flags\n", command);
  return usage                                     ? cli::kExitUsage
         : s.code() == absl::StatusCode::kNotFound ? cli::kExitNotFound
                                                   : cli::kExitFailure;
}

#define RETURN_USAGE_IF_ERROR(expr, cmd)  \
  do {                                    \
    absl::Status _st = (expr);            \
    if (!_st.ok()) return Fail(_st, cmd); \
  } while (0)

std::vector<std::string> List(const std::string& s) {
  return absl::StrSplit(s, ',', absl::SkipEmpty());
}

int RunIngest(const std::vector<std::string>& args) {
  auto flags = cli::ParseCommandFlags("data ingest", args, {"input",
                                   "format",
                                   "out",
                                   "delimiter",
                                   "header",
                                   "user-column",
                                   "item-column",
                                   "time-column",
                                   "rating-column",
                                   "label-threshold",
                                   "max-history",
                                   "negatives",
                                   "split",
                                   "eval-fraction",
                                   "user-features",
                                   "item-features",
                                   "user-feature-columns",
                                   "item-feature-columns",
                                   "seed",
                                   "rows-per-block",
                                   "negative-sampling",
                                   "bad-ratings",
                                   "sort-buffer-events"});
  if (!flags.ok()) return cli::kExitUsage;
  IngestOptions o;
  o.path = flags->Str("input");
  std::string out = flags->Str("out");
  if (o.path.empty() || out.empty()) {
    return Fail(absl::InvalidArgumentError("--input and --out are required"), "ingest");
  }
  std::string format = flags->Str("format", "events");
  if (format == "sequences") {
    o.input = IngestOptions::Input::kSequences;
  } else if (format != "events") {
    return Fail(absl::InvalidArgumentError("--format must be events or sequences"), "ingest");
  }
  std::string delim = flags->Str("delimiter", "auto");
  o.delimiter = delim == "tab" ? "\t" : delim == "comma" ? "," : delim == "space" ? " " : delim;
  std::string header = flags->Str("header", "auto");
  o.header = header == "yes"  ? IngestOptions::Header::kYes
             : header == "no" ? IngestOptions::Header::kNo
                              : IngestOptions::Header::kAuto;
  o.user_column = flags->Str("user-column", o.user_column);
  o.item_column = flags->Str("item-column", o.item_column);
  o.time_column = flags->Str("time-column", o.time_column);
  o.rating_column = flags->Str("rating-column", o.rating_column);
  o.user_features = flags->Str("user-features");
  o.item_features = flags->Str("item-features");
  o.user_feature_columns = List(flags->Str("user-feature-columns"));
  o.item_feature_columns = List(flags->Str("item-feature-columns"));
  std::string split = flags->Str("split", "time");
  if (split == "user") {
    o.split = IngestOptions::Split::kUser;
  } else if (split != "time") {
    return Fail(absl::InvalidArgumentError("--split must be time or user"), "ingest");
  }
  RETURN_USAGE_IF_ERROR(flags->Get("label-threshold", &o.label_threshold), "ingest");
  RETURN_USAGE_IF_ERROR(flags->Get("max-history", &o.max_history), "ingest");
  RETURN_USAGE_IF_ERROR(flags->Get("negatives", &o.negatives_per_positive), "ingest");
  RETURN_USAGE_IF_ERROR(flags->Get("eval-fraction", &o.eval_fraction), "ingest");
  RETURN_USAGE_IF_ERROR(flags->Get("seed", &o.seed), "ingest");
  RETURN_USAGE_IF_ERROR(flags->Get("rows-per-block", &o.rows_per_block), "ingest");
  RETURN_USAGE_IF_ERROR(flags->Get("sort-buffer-events", &o.sort_buffer_events), "ingest");
  const std::string sampling = flags->Str("negative-sampling", "uniform");
  if (sampling == "popularity") {
    o.negative_sampling = IngestOptions::Negatives::kPopularity;
  } else if (sampling != "uniform") {
    return Fail(absl::InvalidArgumentError("--negative-sampling must be uniform or popularity"),
                "ingest");
  }
  const std::string bad_ratings = flags->Str("bad-ratings", "error");
  if (bad_ratings == "skip") {
    o.bad_ratings = IngestOptions::BadRatings::kSkip;
  } else if (bad_ratings != "error") {
    return Fail(absl::InvalidArgumentError("--bad-ratings must be error or skip"), "ingest");
  }
  // A line rewritten in place, only for a person watching a terminal (logs
  // and pipes get the summary alone). The total is not known before the end.
  cli::Progress progress("ingest: reading", 0, "events read");
  double seconds = 0;
  o.progress = [&progress, &seconds](const IngestProgress& p) {
    seconds = p.seconds;
    progress.SetLabel(absl::StrCat("ingest: ", p.phase, ", ", p.samples, " samples written,"));
    progress.Update(p.events);
  };
  auto stats = Ingest(o, out);
  progress.Finish();
  if (!stats.ok()) return Fail(stats.status(), "ingest");
  std::printf("ingested %s -> %s/{train,eval}.rfd + %s in %.2f s (%.0f events/s): %s\n",
              o.path.c_str(), out.c_str(), kSequenceFileName, seconds,
              seconds > 0 ? stats->events / seconds : 0.0, stats->ToString().c_str());
  return cli::kExitOk;
}

int RunSynth(const std::vector<std::string>& args) {
  auto flags = cli::ParseCommandFlags("data synth", args, {"out", "samples", "lengths", "items", "users", "zipf", "dense",
                                   "clusters", "eval-fraction", "seed", "rows-per-block"});
  if (!flags.ok()) return cli::kExitUsage;
  SynthOptions o;
  std::string out = flags->Str("out");
  if (out.empty()) return Fail(absl::InvalidArgumentError("--out is required"), "synth");
  if (flags->Has("lengths")) {
    auto d = LengthDistribution::Parse(flags->Str("lengths"));
    if (!d.ok()) return Fail(d.status(), "synth");
    o.lengths = *d;
  }
  RETURN_USAGE_IF_ERROR(flags->Get("samples", &o.samples), "synth");
  RETURN_USAGE_IF_ERROR(flags->Get("items", &o.num_items), "synth");
  RETURN_USAGE_IF_ERROR(flags->Get("users", &o.num_users), "synth");
  RETURN_USAGE_IF_ERROR(flags->Get("zipf", &o.zipf), "synth");
  RETURN_USAGE_IF_ERROR(flags->Get("dense", &o.dense_features), "synth");
  RETURN_USAGE_IF_ERROR(flags->Get("clusters", &o.clusters), "synth");
  RETURN_USAGE_IF_ERROR(flags->Get("eval-fraction", &o.eval_fraction), "synth");
  RETURN_USAGE_IF_ERROR(flags->Get("seed", &o.seed), "synth");
  RETURN_USAGE_IF_ERROR(flags->Get("rows-per-block", &o.rows_per_block), "synth");
  cli::Progress progress("synth", o.samples, "samples");
  o.progress = [&progress](int64_t done) { progress.Update(done); };
  absl::Status generated = GenerateSynthetic(o, out);
  progress.Finish();
  if (!generated.ok()) return Fail(generated, "synth");
  auto auc = PlantedAuc(out + "/eval.rfd");
  if (!auc.ok()) return Fail(auc.status(), "synth");
  std::printf("wrote %s/{train,eval}.rfd: %lld samples; planted-model (Bayes) AUC on eval: %.4f\n",
              out.c_str(), static_cast<long long>(o.samples), *auc);
  return cli::kExitOk;
}

int RunBalanceReport(const std::vector<std::string>& args) {
  auto flags = cli::ParseCommandFlags("data balance-report", args, {"dataset", "ranks", "batch-size", "base-batch", "cost", "seed",
                                   "length-feature", "epochs"});
  if (!flags.ok()) return cli::kExitUsage;
  int ranks = 8, batch = 1024, base = 128, epochs = 1;
  uint64_t seed = 1;
  RETURN_USAGE_IF_ERROR(flags->Get("ranks", &ranks), "balance-report");
  RETURN_USAGE_IF_ERROR(flags->Get("batch-size", &batch), "balance-report");
  RETURN_USAGE_IF_ERROR(flags->Get("base-batch", &base), "balance-report");
  RETURN_USAGE_IF_ERROR(flags->Get("seed", &seed), "balance-report");
  RETURN_USAGE_IF_ERROR(flags->Get("epochs", &epochs), "balance-report");
  if (ranks < 1 || epochs < 1 || base < 1 || batch < base || batch % base != 0) {
    return Fail(
        absl::InvalidArgumentError(
            "need --ranks, --epochs >= 1 and --batch-size a positive multiple of --base-batch"),
        "balance-report");
  }
  auto cost = CostModel::Parse(flags->Str("cost", "linear"));
  if (!cost.ok()) return Fail(cost.status(), "balance-report");
  if (!flags->Has("dataset")) {
    return Fail(absl::InvalidArgumentError("--dataset is required"), "balance-report");
  }
  auto files = ExpandDatasetPaths(flags->Str("dataset"));
  if (!files.ok()) return Fail(files.status(), "balance-report");
  // The windows come from the loader a job with these settings would use,
  // so the report compares the policies on what that loader deals.
  LoaderOptions lo;
  lo.files = *files;
  lo.deal.ranks = ranks;
  lo.deal.base_batch = base;
  lo.deal.base_batches_per_rank = batch / base;
  lo.cost = *cost;
  lo.seed = seed;
  lo.length_feature = flags->Str("length-feature");
  auto loader = Loader::Open(lo);
  if (!loader.ok()) return Fail(loader.status(), "balance-report");
  auto windows = EpochWindows(**loader, epochs);
  if (!windows.ok()) return Fail(windows.status(), "balance-report");
  auto rows = BalanceOfWindows(*windows, *cost, lo.deal);
  double sum = 0;
  int64_t mx = 0, n = 0;
  for (const auto& w : *windows) {
    for (int64_t l : w) {
      sum += l;
      mx = std::max(mx, l);
      ++n;
    }
  }
  if (n == 0) {
    // A table of zeros would read as perfect balance.
    return Fail(absl::InvalidArgumentError(absl::StrCat(
                    "no full step: ", (*loader)->samples_per_epoch(), " samples per epoch are fewer than one step of ",
                    ranks, " ranks x --batch-size ", batch, "; lower --ranks or --batch-size")),
                "balance-report");
  }
  const std::string feature =
      (*loader)->schema()->features[(*loader)->length_column()].name;
  std::printf("dataset %s: %lld samples per epoch, %lld in full steps, %s length mean %.1f max "
              "%lld\n",
              flags->Str("dataset").c_str(),
              static_cast<long long>((*loader)->samples_per_epoch()),
              static_cast<long long>(n / epochs), feature.c_str(), n == 0 ? 0.0 : sum / n,
              static_cast<long long>(mx));
  std::printf("%d ranks x batch %d (%d base batches of %d), cost %s, seed %llu\n", ranks, batch,
              batch / base, base, cost->ToString().c_str(), static_cast<unsigned long long>(seed));
  std::printf(
      "straggler gap = max rank cost / mean - 1, per full step in the loader's order "
      "(job seed %llu), over %d epoch(s):\n%s",
      static_cast<unsigned long long>(seed), epochs, FormatBalance(rows).c_str());
  return cli::kExitOk;
}

// Prints the fit's relative error on `batches` under `title`: per batch
// when `each`, then the largest and the mean.
void PrintErrors(const char* title, const std::vector<BatchTime>& batches, const CostModel& fit,
                 bool each) {
  if (batches.empty()) return;
  std::printf("%s\n", title);
  for (const BatchTime& b : each ? batches : std::vector<BatchTime>()) {
    const double predicted = engine::PredictedSeconds(fit, b.lengths);
    std::printf("  measured %.6g s, predicted %.6g s, error %+.2f%%\n", b.seconds, predicted,
                100 * (predicted - b.seconds) / b.seconds);
  }
  const engine::PredictionError e = engine::FitError(fit, batches);
  std::printf("  %zu batches: largest error %.2f%%, mean |error| %.2f%%\n", batches.size(),
              100 * e.largest, 100 * e.mean);
}

// Where the rate table was measured: the GPU's name, or the CPU model.
std::string MachineName(Device device) {
  if (device == Device::kCuda) {
    auto gpus = engine::ListCudaDevices();
    if (gpus.ok() && !gpus->empty()) {
      return absl::StrCat(gpus->front().name, ", ", gpus->front().memory_bytes >> 30, " GiB");
    }
    return "CUDA device";
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      return absl::StrCat(std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))), ", ",
                          sysconf(_SC_NPROCESSORS_ONLN), " cores");
    }
  }
  return "CPU";
}

// `data calibrate --rates FILE`: measures the engine's rate table.
int RunRates(const cli::Flags& flags, const std::vector<std::string>& args, Device device,
             bool bf16) {
  engine::RateProbeOptions o;
  o.device = device;
  o.bf16 = bf16;
  RETURN_USAGE_IF_ERROR(flags.Get("warmup", &o.warmup), "calibrate");
  RETURN_USAGE_IF_ERROR(flags.Get("repeats", &o.repeats), "calibrate");
  RETURN_USAGE_IF_ERROR(flags.Get("seed", &o.seed), "calibrate");
  // Checked before the probes run (minutes), not after.
  int sync_ranks = device == Device::kCpu ? std::max<int>(2, sysconf(_SC_NPROCESSORS_ONLN)) : 0;
  RETURN_USAGE_IF_ERROR(flags.Get("sync-ranks", &sync_ranks), "calibrate");
  if (sync_ranks == 1 || sync_ranks < 0) {
    return Fail(absl::InvalidArgumentError("--sync-ranks is 0 (skip) or >= 2"), "calibrate");
  }
  if (sync_ranks >= 2 && device != Device::kCpu) {
    return Fail(absl::InvalidArgumentError("--sync-ranks: measured on CPU ranks (Gloo) only"), "calibrate");
  }
  auto r = engine::MeasureStepRates(o);
  if (!r.ok()) return Fail(r.status(), "calibrate");
  engine::StepRates rates = r->rates;
  rates.machine = MachineName(device);
  rates.date = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  rates.command = absl::StrCat("recfleet data calibrate ", absl::StrJoin(args, " "));
  std::printf("%-28s %12s %12s %8s %12s %12s %8s\n", "probe step", "measured ms", "fitted ms",
              "error%", "peak MiB", "fitted MiB", "error%");
  for (size_t i = 0; i < r->steps.size(); ++i) {
    const engine::ProbeStep& p = r->steps[i];
    const engine::StepPrediction f = engine::PredictStep(p.counts, rates);
    const double mib = 1.0 / (1 << 20);
    std::printf("%-28s %12.3f %12.3f %8.2f %12.1f %12.1f %8.2f\n", r->names[i].c_str(),
                1e3 * p.seconds, 1e3 * f.seconds, 100 * (f.seconds / p.seconds - 1),
                p.peak_bytes * mib, f.peak_bytes * mib,
                p.peak_bytes > 0 ? 100 * (f.peak_bytes / p.peak_bytes - 1) : 0.0);
  }
  if (sync_ranks >= 2) {
    // CPU ranks of one host stepping together (the local cluster's workers):
    // what they add to one rank's step, measured with the worker's code.
    absl::StatusOr<worker::RankSyncResult> sync = worker::MeasureRankSync(sync_ranks, o);
    if (!sync.ok()) return Fail(sync.status(), "calibrate");
    std::printf("\n%-28s %12s %12s %8s\n", "probe step", "1 rank ms", absl::StrCat(sync_ranks, " ranks ms").c_str(),
                "ratio");
    for (const worker::RankSyncProbe& p : sync->probes) {
      std::printf("%-28s %12.3f %12.3f %8.3f\n", p.name.c_str(), 1e3 * p.single_seconds, 1e3 * p.ranks_seconds,
                  p.ranks_seconds / p.single_seconds);
    }
    rates.rank_sync_ranks = sync->ranks;
    rates.rank_sync_overhead = sync->overhead;
  }
  const std::string yaml = engine::StepRatesToYaml(rates);
  std::ofstream out(flags.Str("rates"));
  out << "# The engine's step rates (engine/step_rates.h), measured by the command below.\n" << yaml;
  if (!out) {
    return Fail(absl::UnavailableError("cannot write " + flags.Str("rates")), "calibrate");
  }
  std::printf("%s", yaml.c_str());
  return cli::kExitOk;
}

int RunCalibrate(const std::vector<std::string>& args) {
  auto flags = cli::ParseCommandFlags("data calibrate", args,
                                      {"spec", "lengths", "batch-size", "repeats", "warmup",
                                       "fit-batches", "check-batches", "seed", "device", "precision",
                                       "rates", "sync-ranks"});
  if (!flags.ok()) return cli::kExitUsage;
  if (!flags->Has("spec") && !flags->Has("rates")) {
    return Fail(absl::InvalidArgumentError("--spec (or --rates FILE) is required"), "calibrate");
  }
  if (flags->Has("sync-ranks") && !flags->Has("rates")) {
    return Fail(absl::InvalidArgumentError("--sync-ranks applies only with --rates FILE"), "calibrate");
  }
  engine::CalibrationOptions o;
  const std::string device = flags->Str("device", "cpu");
  const std::string precision = flags->Str("precision", "bf16");
  if (device != "cpu" && device != "cuda") {
    return Fail(absl::InvalidArgumentError("--device is cpu or cuda, got '" + device + "'"),
                "calibrate");
  }
  if (precision != "bf16" && precision != "fp32") {
    return Fail(absl::InvalidArgumentError("--precision is bf16 or fp32, got '" + precision + "'"),
                "calibrate");
  }
  o.device = device == "cuda" ? Device::kCuda : Device::kCpu;
  o.bf16 = precision == "bf16";
  if (flags->Has("rates")) return RunRates(*flags, args, o.device, o.bf16);
  // A GPU step's time is only worth fitting at the batch the job's ranks
  // train (small batches are bound by kernel launches, not by lengths);
  // the CUDA engine's first steps pick GEMM algorithms: two warm-up rounds.
  if (o.device == Device::kCuda) o.warmup = 2;
  RETURN_USAGE_IF_ERROR(flags->Get("batch-size", &o.batch_size), "calibrate");
  RETURN_USAGE_IF_ERROR(flags->Get("warmup", &o.warmup), "calibrate");
  RETURN_USAGE_IF_ERROR(flags->Get("repeats", &o.repeats), "calibrate");
  RETURN_USAGE_IF_ERROR(flags->Get("fit-batches", &o.fit_batches), "calibrate");
  RETURN_USAGE_IF_ERROR(flags->Get("check-batches", &o.check_batches), "calibrate");
  RETURN_USAGE_IF_ERROR(flags->Get("seed", &o.seed), "calibrate");
  if (flags->Has("lengths")) {
    o.lengths.clear();
    for (const std::string& l : List(flags->Str("lengths"))) {
      int64_t v;
      if (!absl::SimpleAtoi(l, &v)) {
        return Fail(absl::InvalidArgumentError(absl::StrCat("--lengths: '", l, "' is not a number")),
                    "calibrate");
      }
      o.lengths.push_back(v);
    }
  }
  auto spec = cli::LoadJobSpec(flags->Str("spec"));
  if (!spec.ok()) return Fail(spec.status(), "calibrate");
  auto model = engine::BuildJobModel(*spec);
  if (!model.ok()) return Fail(model.status(), "calibrate");
  if (!flags->Has("lengths")) o.lengths = engine::CalibrationLengths(*model);
  if (o.device == Device::kCuda && !flags->Has("batch-size")) {
    o.batch_size = std::max(1, spec->data().local_batch_size());
  }
  auto c = engine::Calibrate(*model, o);
  if (!c.ok()) return Fail(c.status(), "calibrate");
  const CostModel& fit = c->fit;
  if (o.device == Device::kCuda) {
    std::printf(
        "CUDA engine (%s) training step (forward+backward+update), batches of %d samples, median "
        "of %d rounds after %d warm-up rounds (CUDA events)\n",
        precision.c_str(), o.batch_size, o.repeats, o.warmup);
  } else {
    std::printf(
        "CPU engine forward+backward, batches of %d samples, median of %d rounds after %d "
        "warm-up round(s) (thread CPU time)\n",
        o.batch_size, o.repeats, o.warmup);
  }
  std::printf("one-length batches (seen by the fit):\n%8s %16s %16s %8s\n", "length",
              "measured s/smp", "fitted s/smp", "error%");
  for (const BatchTime& b : c->one_length) {
    const double measured = b.seconds / b.lengths.size();
    const double predicted = fit.SampleCost(b.lengths[0]);
    std::printf("%8lld %16.6g %16.6g %8.2f\n", static_cast<long long>(b.lengths[0]), measured,
                predicted, 100 * (predicted - measured) / measured);
  }
  const int64_t longest = *std::max_element(o.lengths.begin(), o.lengths.end());
  const std::string mixed = absl::StrCat(
      "batches of mixed lengths (uniform in 1..cap, cap per batch in ", std::max<int64_t>(1, longest / 8),
      "..", longest, ")");
  PrintErrors((mixed + ", seen by the fit:").c_str(), c->mixed_fit, fit, false);
  PrintErrors((mixed + ", held out, predicted vs measured:").c_str(), c->held_out, fit, true);
  std::printf("# seconds per sample; paste into the job spec:\ndata:\n  bbs:\n    cost_weights:\n"
              "      per_sample: %.6g\n      linear: %.6g\n      quadratic: %.6g\n",
              fit.per_sample, fit.linear, fit.quadratic);
  return cli::kExitOk;
}

int RunInfo(const std::vector<std::string>& args) {
  auto flags = cli::ParseCommandFlags("data info", args, {"dataset", "verify"});
  if (!flags.ok()) return cli::kExitUsage;
  auto files = ExpandDatasetPaths(flags->Str("dataset"));
  if (!files.ok()) return Fail(files.status(), "info");
  for (const std::string& path : *files) {
    auto f = DatasetFile::Open(path);
    if (!f.ok()) return Fail(f.status(), "info");
    std::printf("%s: %llu rows in %zu blocks\n%s", path.c_str(),
                static_cast<unsigned long long>((*f)->num_rows()), (*f)->num_blocks(),
                (*f)->schema()->DebugString().c_str());
    if (flags->Str("verify", "no") == "yes") {
      Batch block;
      for (size_t b = 0; b < (*f)->num_blocks(); ++b) {
        if (auto st = (*f)->ReadBlock(b, &block); !st.ok()) return Fail(st, "info");
      }
      std::printf("verified: every block checksum and structure is intact\n");
    }
  }
  return cli::kExitOk;
}

int RunPlantedAuc(const std::vector<std::string>& args) {
  auto flags = cli::ParseCommandFlags("data planted-auc", args, {"dataset"});
  if (!flags.ok()) return cli::kExitUsage;
  auto auc = PlantedAuc(flags->Str("dataset"));
  if (!auc.ok()) return Fail(auc.status(), "planted-auc");
  std::printf("%.6f\n", *auc);
  return cli::kExitOk;
}

}  // namespace

RECFLEET_REGISTER_COMMAND({
    "data ingest",
    "Turn an event log or per-user sequence file into train/eval datasets",
    "recfleet data ingest --input FILE --out DIR [--format events|sequences]\n"
    "  [--delimiter auto|tab|comma|space|::] [--header auto|yes|no]\n"
    "  [--user-column user_id] [--item-column item_id] [--time-column timestamp]\n"
    "  [--rating-column rating]   (names from the header, or 0-based indices; '' = absent)\n"
    "  [--label-threshold 4] [--max-history 1024] [--negatives -1 (auto)]\n"
    "  [--split time|user] [--eval-fraction 0.2] [--seed 1] [--rows-per-block 1024]\n"
    "  [--user-features FILE] [--item-features FILE]\n"
    "  [--user-feature-columns a,b] [--item-feature-columns a,b]\n"
    "  [--negative-sampling uniform|popularity] [--bad-ratings error|skip]\n"
    "  [--sort-buffer-events 8388608]   (events sorted in memory; more spill to DIR)\n"
    "Writes DIR/train.rfd, DIR/eval.rfd (samples referencing histories), DIR/sequences.rfs\n"
    "(each user's events, once), DIR/vocab_user.tsv, DIR/vocab_item.tsv. Shows progress\n"
    "(events read, rate) when stdout and stderr are terminals.",
    RunIngest,
});

RECFLEET_REGISTER_COMMAND({
    "data synth",
    "Generate heavy-tailed synthetic data with a planted, learnable label model",
    "recfleet data synth --out DIR [--samples 10000]\n"
    "  [--lengths lognormal:mean=1000,sigma=1.2,min=10,max=50000 | powerlaw:alpha=1.5,min=10,"
    "max=50000 | fixed:N]\n"
    "  [--items 100000] [--users 10000] [--zipf 1.1] [--dense 4] [--clusters 32]\n"
    "  [--eval-fraction 0.1] [--seed 1] [--rows-per-block 256]\n"
    "Prints the planted model's (best achievable) AUC on the eval split. Shows a progress\n"
    "bar (rate, ETA) when stdout and stderr are terminals.",
    RunSynth,
});

RECFLEET_REGISTER_COMMAND({
    "data calibrate",
    "Time the job's model per sequence length (CPU or CUDA engine) and fit BBS cost weights",
    "recfleet data calibrate --spec JOB.yaml [--lengths L1,L2,... (default: 1 to the\n"
    "  spec's longest sequence)] [--device cpu|cuda] [--precision bf16|fp32 (cuda)]\n"
    "  [--batch-size 16 (cpu) | the spec's local_batch_size (cuda)] [--repeats 9]\n"
    "  [--warmup 1 (cpu) | 2 (cuda)] [--fit-batches 8] [--check-batches 8] [--seed 1]\n"
    "Builds the spec's GEM-lite and times it on synthetic batches: one per length (every\n"
    "sample that long) and fit + check batches of mixed lengths, each batch once per round,\n"
    "median of the rounds. cpu: forward+backward in thread CPU time (CPU jobs). cuda: the\n"
    "GPU worker's step (forward+backward+update) with CUDA events on the current device.\n"
    "Fits per_sample + linear * L + quadratic * L^2\n"
    "(seconds, weights >= 0) to the one-length and fit batches, shows its error on the\n"
    "held-out check batches and prints the weights as spec.data.bbs.cost_weights.\n"
    "recfleet data calibrate --rates FILE [--device cpu|cuda] [--precision bf16|fp32]\n"
    "  [--warmup 2] [--repeats 3] [--seed 1] [--sync-ranks N]\n"
    "Measures the engine's rate table instead (engine/step_rates.h): trains a fixed family of\n"
    "probe models a few steps each, fits effective GEMM and attention rates, elementwise,\n"
    "optimizer and per-step time and (cuda) activation bytes, and writes them to FILE with\n"
    "the machine, date and command; `recfleet plan --rates FILE` and the coordinator\n"
    "(its step-rates flag) predict step time and peak memory from it. cpu: then times the\n"
    "probes on --sync-ranks Gloo ranks over loopback (default: the cores, at least 2; 0\n"
    "skips) against one rank alone: rank_sync_overhead, what ranks of one host stepping\n"
    "together add (waits for the slowest rank, collectives, shared cores).",
    RunCalibrate,
});

RECFLEET_REGISTER_COMMAND({
    "data balance-report",
    "Per-step straggler gap of naive, sort-interleave BBS and recfleet dealing",
    "recfleet data balance-report --dataset FILES|DIR --ranks R --batch-size B\n"
    "  [--base-batch 128] [--cost linear|quadratic|windowed|block|linear=1,quadratic=0.001,...]\n"
    "  [--seed 1] [--epochs 1] [--length-feature history_items]\n"
    "Windows are those the job's loader deals (its block and row order for --seed), full\n"
    "steps only; steps of all epochs are pooled.",
    RunBalanceReport,
});

RECFLEET_REGISTER_COMMAND({
    "data info",
    "Show a dataset's schema and blocks; --verify yes checks every block",
    "recfleet data info --dataset FILES|DIR [--verify yes]",
    RunInfo,
});

RECFLEET_REGISTER_COMMAND({
    "data planted-auc",
    "The planted model's (Bayes) AUC on a synthetic dataset file",
    "recfleet data planted-auc --dataset DIR/eval.rfd",
    RunPlantedAuc,
});

}  // namespace recfleet::data
