#ifndef RECFLEET_ENGINE_CUDA_DEVICE_H_
#define RECFLEET_ENGINE_CUDA_DEVICE_H_

// The CUDA device a process trains on, seen from the host: which devices
// there are, binding the process to one, host <-> device copies of tensor
// views, and GPU time on the engine's compute stream (the legacy default
// stream, engine/tensor.h). Every function fails with a Status when there
// is no driver or device; nothing here aborts.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tensor.h"
#include "kernels/tensor.h"

namespace recfleet::engine {

// A CUDA device of this host.
struct CudaDeviceInfo {
  int index = 0;             // CUDA device index.
  std::string name;          // e.g. "NVIDIA H200".
  int64_t memory_bytes = 0;  // Total device memory.
};
// The CUDA devices this process sees; FailedPrecondition (naming the CUDA
// error) when there is no driver or no device.
absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices();
// Makes `index` the calling thread's current device. CudaAllocator() binds
// to the device current when it is first called, so a process trains on one
// device: call this before the first CudaAllocator() (recfleet-worker runs
// one process per GPU).
absl::Status SetCudaDevice(int index);
// Blocks until the legacy default stream (the engine's compute stream) has
// finished its work.
absl::Status SynchronizeCudaStream();

// Raw copies between a tensor view on either device and host bytes
// (view.nbytes() of them, same dtype, no conversion); synchronous, ordered
// after the legacy default stream's work. For checkpoints.
absl::Status CopyViewToHost(const TensorView& src, void* dst);
absl::Status CopyHostToView(const void* src, const TensorView& dst);

// GPU times between marks on the legacy default stream (the engine's
// compute stream), from CUDA events: Mark(i) enqueues event i; Seconds(from,
// to) waits for event `to` and returns the stream time between the two.
// Stream time counts the device's work, plus any time the device sat idle
// between the marks waiting for the host to issue more. Not thread-safe.
class CudaStreamTimer {
 public:
  explicit CudaStreamTimer(int marks) : events_(marks, nullptr) {}
  ~CudaStreamTimer();
  CudaStreamTimer(const CudaStreamTimer&) = delete;
  CudaStreamTimer& operator=(const CudaStreamTimer&) = delete;
  absl::Status Mark(int i);
  absl::StatusOr<double> Seconds(int from, int to);

 private:
  std::vector<void*> events_;  // cudaEvent_t, created on first use.
};

// A part of a training step that issues the same launches on the same
// buffers step after step (the dense interaction, MoE and heads of GEM-lite
// at a fixed batch size), replayed as one CUDA graph instead of being issued
// launch by launch: the host's issue time, not the GPU, paces a small-batch
// step. The legacy default stream cannot be captured, so the region runs on
// a stream of its own (made this thread's ComputeStream while the body
// runs), ordered after the legacy stream's earlier work and before its later
// work by events. Per key (whatever the launches depend on: the caller's
// shapes), the first Run runs the body eagerly on that stream (the warm-up:
// buffers the body keeps, GEMM plans and workspaces are made outside
// capture), the second captures the body and launches the graph, later ones
// launch the graph without running the body. A new key drops the graph.
// The caller must keep every buffer the body touches at the address it had
// when captured for as long as the key holds (Reset when they may move),
// must not use the legacy stream inside the body (capture fails, and Run
// returns the error), and must redo on the host whatever the body does
// besides launches (counters) when Run answers kReplayed. Not thread-safe.
class CudaGraphRegion {
 public:
  enum class Mode { kEager, kCaptured, kReplayed };

  CudaGraphRegion() = default;
  ~CudaGraphRegion();
  CudaGraphRegion(const CudaGraphRegion&) = delete;
  CudaGraphRegion& operator=(const CudaGraphRegion&) = delete;

  template <typename Body>
  absl::StatusOr<Mode> Run(uint64_t key, Body&& body);

  // Drops the graph; the next Run warms up again.
  void Reset();
  bool holds(uint64_t key) const { return state_ != State::kEmpty && key_ == key; }
  int64_t replays() const { return replays_; }

 private:
  enum class State { kEmpty, kWarm, kCaptured };
  absl::Status Enter();
  absl::Status BeginCapture();
  absl::Status EndCapture(absl::Status body);
  absl::Status Launch();
  absl::Status Leave();

  void* stream_ = nullptr;  // cudaStream_t, non-blocking
  void* before_ = nullptr;  // cudaEvent_t: the legacy stream's work so far
  void* after_ = nullptr;   // cudaEvent_t: the region's work
  void* exec_ = nullptr;    // cudaGraphExec_t
  uint64_t key_ = 0;
  State state_ = State::kEmpty;
  int64_t replays_ = 0;
};

template <typename Body>
absl::StatusOr<CudaGraphRegion::Mode> CudaGraphRegion::Run(uint64_t key, Body&& body) {
  if (state_ != State::kEmpty && key_ != key) Reset();
  key_ = key;
  if (absl::Status s = Enter(); !s.ok()) return s;
  Mode mode = Mode::kReplayed;
  if (state_ == State::kEmpty) {
    mode = Mode::kEager;
    {
      const ScopedComputeStream on(stream_);
      if (absl::Status s = body(); !s.ok()) return s;
    }
    state_ = State::kWarm;
  } else if (state_ == State::kWarm) {
    mode = Mode::kCaptured;
    if (absl::Status s = BeginCapture(); !s.ok()) return s;
    absl::Status captured;
    {
      const ScopedComputeStream on(stream_);
      captured = body();
    }
    if (absl::Status s = EndCapture(captured); !s.ok()) return s;
    state_ = State::kCaptured;
  }
  if (state_ == State::kCaptured) {
    if (absl::Status s = Launch(); !s.ok()) return s;
    if (mode == Mode::kReplayed) ++replays_;
  }
  if (absl::Status s = Leave(); !s.ok()) return s;
  return mode;
}

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_CUDA_DEVICE_H_
