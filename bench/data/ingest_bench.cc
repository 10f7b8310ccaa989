// Ingest throughput on one core: `ingest_bench --input LOG --out DIR
// [--repeats 3 --format events|sequences --max-history 1024 --negatives -1]`.
// Runs data::Ingest on the log `repeats` times (the first warms the page
// cache and the allocator and is not counted) and prints, per run, events
// per second of process CPU time (user + system) and of wall time, and the
// median of the counted runs. CPU time, because the machine may be shared.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "data/ingest.h"

namespace {

double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return t.tv_sec + 1e-6 * t.tv_usec; };
  return s(u.ru_utime) + s(u.ru_stime);
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = recfleet::cli::Flags::Parse(std::vector<std::string>(argv + 1, argv + argc),
                                           {"input", "out", "repeats", "format", "max-history",
                                            "negatives"});
  recfleet::data::IngestOptions o;
  int repeats = 3;
  absl::Status parsed = flags.status();
  if (parsed.ok()) parsed = flags->Get("repeats", &repeats);
  if (parsed.ok()) parsed = flags->Get("max-history", &o.max_history);
  if (parsed.ok()) parsed = flags->Get("negatives", &o.negatives_per_positive);
  if (!parsed.ok() || !flags->Has("input") || !flags->Has("out") || repeats < 2) {
    std::fprintf(stderr,
                 "usage: ingest_bench --input LOG --out DIR [--repeats N>=2 --format "
                 "events|sequences --max-history 1024 --negatives -1]%s%s\n",
                 parsed.ok() ? "" : ": ", std::string(parsed.message()).c_str());
    return 2;
  }
  o.path = flags->Str("input");
  if (flags->Str("format", "events") == "sequences") {
    o.input = recfleet::data::IngestOptions::Input::kSequences;
  }
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    const double cpu0 = ProcessCpuSeconds();
    const auto wall0 = std::chrono::steady_clock::now();
    auto stats = recfleet::data::Ingest(o, flags->Str("out"));
    const double cpu = ProcessCpuSeconds() - cpu0;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    if (!stats.ok()) {
      std::fprintf(stderr, "ingest_bench: %s\n", std::string(stats.status().message()).c_str());
      return 1;
    }
    const double rate = stats->events / cpu;
    std::printf("run %d%s: %lld events, %.3f CPU s, %.3f wall s, %.0f events per CPU-second, "
                "%.0f per wall second\n",
                r, r == 0 ? " (warm-up)" : "", static_cast<long long>(stats->events), cpu, wall,
                rate, stats->events / wall);
    if (r > 0) rates.push_back(rate);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("median of %zu runs: %.0f events per CPU-second\n", rates.size(),
              rates[rates.size() / 2]);
  return 0;
}
