// Draws engine batches of a job's data shape and describes its model, for
// the end-to-end benchmark (bench/e2e/run.sh):
//
//   make_batches --job bench/e2e/config_a.yaml --batch-size 128 --batches 20 \
//                --seed 1 --out DIR
//
// writes DIR/batches.bin (bench/e2e/batch_file.h) and DIR/model.json
// (bench/e2e/synthetic_batches.h: ModelJson) and prints one line of
// history-length statistics.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/e2e/batch_file.h"
#include "bench/e2e/synthetic_batches.h"
#include "cli/flags.h"
#include "cli/jobs/spec_file.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "make_batches: %s\n", message.c_str());
  return 1;
}

int Usage(const std::string& message) {
  return Fail(absl::StrCat(message,
                           "\nusage: make_batches --job JOB.yaml --batch-size N --batches N [--seed S] --out DIR"));
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<recfleet::cli::Flags> flags = recfleet::cli::Flags::Parse(
      std::vector<std::string>(argv + 1, argv + argc), {"job", "batch-size", "batches", "seed", "out"});
  if (!flags.ok()) return Usage(std::string(flags.status().message()));
  int64_t batch_size = 0, batches = 0;
  uint64_t seed = 1;
  for (const absl::Status& s :
       {flags->Get("batch-size", &batch_size), flags->Get("batches", &batches), flags->Get("seed", &seed)}) {
    if (!s.ok()) return Usage(std::string(s.message()));
  }
  const std::string job = flags->Str("job"), out = flags->Str("out");
  if (job.empty() || out.empty()) return Usage("--job and --out are required");
  if (batch_size < 1 || batches < 1) return Usage("--batch-size and --batches must be >= 1");

  absl::StatusOr<recfleet::v1::JobSpec> spec = recfleet::cli::LoadJobSpec(job);
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  absl::StatusOr<recfleet::bench::SyntheticBatches> gen = recfleet::bench::SyntheticBatches::Create(*spec, seed);
  if (!gen.ok()) return Fail(absl::StrCat(job, ": ", gen.status().message()));

  std::vector<recfleet::engine::Batch> all;
  int64_t tokens = 0, longest = 0;
  for (int64_t i = 0; i < batches; ++i) {
    all.push_back(gen->Next(batch_size));
    const std::vector<int64_t>& offsets = all.back().sequence[0].offsets;
    tokens += offsets.back();
    for (size_t s = 1; s < offsets.size(); ++s) longest = std::max(longest, offsets[s] - offsets[s - 1]);
  }
  const std::string batch_path = out + "/batches.bin", model_path = out + "/model.json";
  if (absl::Status s = recfleet::bench::WriteBatchFile(batch_path, all); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  FILE* f = std::fopen(model_path.c_str(), "w");
  if (f == nullptr) return Fail(absl::StrCat("cannot write ", model_path));
  const std::string json = recfleet::bench::ModelJson(gen->model());
  const bool written = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if (std::fclose(f) != 0 || !written) return Fail(absl::StrCat("writing ", model_path, " failed"));
  std::printf("%s: %lld batches of %lld samples, history tokens mean %.1f max %lld (cap %lld) -> %s, %s\n",
              job.c_str(), static_cast<long long>(batches), static_cast<long long>(batch_size),
              static_cast<double>(tokens) / static_cast<double>(batches * batch_size),
              static_cast<long long>(longest), static_cast<long long>(gen->lengths().max), batch_path.c_str(),
              model_path.c_str());
  return 0;
}
