#ifndef RECFLEET_WORKER_GPU_SELECTION_H_
#define RECFLEET_WORKER_GPU_SELECTION_H_

// How `recfleet-worker --device cuda` maps GPUs to ranks: one worker (one
// rank, one process) per GPU. The engine's device allocator binds a process
// to one device (engine/cuda_device.h, SetCudaDevice), so a worker given several
// GPUs starts one child process per GPU, each registering that GPU with the
// coordinator under the host's topology labels. Pure functions, so the CPU
// tests cover them.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "recfleet/v1/worker_service.pb.h"

namespace recfleet::worker {

// The GPUs named by --gpus ("0,2"; "" or "all" = every one of the
// `available` devices), in the order given. InvalidArgument for an index
// that is not a number, out of [0, available), or repeated.
absl::StatusOr<std::vector<int>> SelectGpus(absl::string_view flag, int available);

// The command line of the child process for GPU `gpu`: `argv` without its
// --gpus and --work_dir flags (in either "--f=v" or "--f v" form), plus
// --gpus=<gpu> and --work_dir=<work_dir>/gpu-<gpu>, so children never share
// a scratch directory.
std::vector<std::string> ChildCommandLine(const std::vector<std::string>& argv, int gpu,
                                          const std::string& work_dir);

// What a GPU worker registers: its host, the one GPU it owns, and its
// topology labels. Node defaults to the host; the NVLink domain defaults to
// the node (the GPUs of one HGX host share one NVLink switch domain; pass
// --nvlink_domain where that does not hold).
struct GpuWorkerLabels {
  std::string host;
  std::string node;
  std::string nvlink_domain;
  std::string zone;
};
v1::RegisterWorkerRequest GpuWorkerRegistration(const GpuWorkerLabels& labels, int gpu_index,
                                                const std::string& gpu_name, int64_t gpu_memory_bytes);

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_GPU_SELECTION_H_
