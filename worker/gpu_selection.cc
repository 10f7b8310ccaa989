#include "worker/gpu_selection.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace recfleet::worker {

absl::StatusOr<std::vector<int>> SelectGpus(absl::string_view flag, int available) {
  std::vector<int> gpus;
  if (flag.empty() || flag == "all") {
    for (int i = 0; i < available; ++i) gpus.push_back(i);
    return gpus;
  }
  for (absl::string_view part : absl::StrSplit(flag, ',')) {
    int index = -1;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &index) || index < 0 || index >= available) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus: '", part, "' is not a GPU index of this host (0..",
                                                     available - 1, "); pass e.g. --gpus=0,1 or --gpus=all"));
    }
    if (std::find(gpus.begin(), gpus.end(), index) != gpus.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus: GPU ", index, " named twice"));
    }
    gpus.push_back(index);
  }
  return gpus;
}

std::vector<std::string> ChildCommandLine(const std::vector<std::string>& argv, int gpu,
                                          const std::string& work_dir) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    bool dropped = false;
    for (const char* flag : {"--gpus", "--work_dir", "-gpus", "-work_dir"}) {
      if (a == flag) {
        ++i;  // "--flag value": the value goes too.
        dropped = true;
        break;
      }
      if (absl::StartsWith(a, absl::StrCat(flag, "="))) {
        dropped = true;
        break;
      }
    }
    if (!dropped) out.push_back(a);
  }
  out.push_back(absl::StrCat("--gpus=", gpu));
  out.push_back(absl::StrCat("--work_dir=", work_dir, "/gpu-", gpu));
  return out;
}

v1::RegisterWorkerRequest GpuWorkerRegistration(const GpuWorkerLabels& labels, int gpu_index,
                                                const std::string& gpu_name, int64_t gpu_memory_bytes) {
  v1::RegisterWorkerRequest r;
  r.set_host(labels.host);
  v1::Topology* t = r.mutable_topology();
  t->set_node(labels.node.empty() ? labels.host : labels.node);
  t->set_nvlink_domain(labels.nvlink_domain.empty() ? t->node() : labels.nvlink_domain);
  t->set_zone(labels.zone);
  v1::Gpu* g = r.add_gpus();
  g->set_index(gpu_index);
  g->set_name(gpu_name);
  g->set_memory_bytes(gpu_memory_bytes);
  return r;
}

}  // namespace recfleet::worker
