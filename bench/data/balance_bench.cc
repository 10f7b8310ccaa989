// Straggler gap of the dealing policies on lengths drawn from a synthetic
// distribution (no data file needed, so heavy tails at mean ~1,000 fit in
// memory): `balance_bench --lengths SPEC --samples N --cost C [--ranks R
// --batch-size B --base-batch 128 --seed S]`. For a dataset file use
// `recfleet data balance-report`.

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/flags.h"
#include "data/balance.h"
#include "data/synth.h"

namespace {

int Usage(const char* why) {
  std::fprintf(stderr,
               "balance_bench: %s\nusage: balance_bench --lengths SPEC --samples N --cost SPEC "
               "[--ranks 8] [--batch-size 1024] [--base-batch 128] [--seed 1]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string lengths_spec = "lognormal:mean=1000,sigma=1.2,min=10,max=50000";
  std::string cost_spec = "linear";
  int64_t samples = 819200, ranks = 8, batch = 1024, base = 128, seed = 1;
  absl::StatusOr<recfleet::cli::Flags> flags = recfleet::cli::Flags::Parse(
      std::vector<std::string>(argv + 1, argv + argc),
      {"lengths", "cost", "samples", "ranks", "batch-size", "base-batch", "seed"});
  if (!flags.ok()) return Usage(std::string(flags.status().message()).c_str());
  lengths_spec = flags->Str("lengths", lengths_spec);
  cost_spec = flags->Str("cost", cost_spec);
  for (auto [name, value] : {std::pair<const char*, int64_t*>{"samples", &samples},
                             {"ranks", &ranks},
                             {"batch-size", &batch},
                             {"base-batch", &base},
                             {"seed", &seed}}) {
    if (absl::Status s = flags->Get(name, value); !s.ok()) return Usage(std::string(s.message()).c_str());
  }
  auto dist = recfleet::data::LengthDistribution::Parse(lengths_spec);
  auto cost = recfleet::data::CostModel::Parse(cost_spec);
  if (!dist.ok()) return Usage(std::string(dist.status().message()).c_str());
  if (!cost.ok()) return Usage(std::string(cost.status().message()).c_str());
  if (base <= 0 || batch % base != 0)
    return Usage("--batch-size must be a multiple of --base-batch");
  std::mt19937_64 rng(seed);
  std::vector<int64_t> lengths(samples);
  double sum = 0;
  int64_t mx = 0;
  for (auto& l : lengths) {
    l = dist->Sample(rng);
    sum += l;
    mx = std::max(mx, l);
  }
  recfleet::data::DealOptions o;
  o.ranks = static_cast<int>(ranks);
  o.base_batch = static_cast<int>(base);
  o.base_batches_per_rank = static_cast<int>(batch / base);
  std::printf("lengths %s: %lld samples, mean %.1f, max %lld; cost %s; %lld ranks x %lld\n",
              lengths_spec.c_str(), static_cast<long long>(samples), sum / samples,
              static_cast<long long>(mx), cost_spec.c_str(), static_cast<long long>(ranks),
              static_cast<long long>(batch));
  std::printf("%s",
              recfleet::data::FormatBalance(recfleet::data::ComputeBalance(lengths, *cost, o, seed))
                  .c_str());
  return 0;
}
