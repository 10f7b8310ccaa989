#ifndef RECFLEET_WORKER_COMM_CONFORMANCE_H_
#define RECFLEET_WORKER_COMM_CONFORMANCE_H_

// Backend-independent conformance checks: each runs one collective on every
// rank of a group (one thread per rank) with small-integer test values,
// which are exact in every dtype and every summation order, and compares the
// output with a direct evaluation of the collective's definition through
// gtest expectations. The Gloo tests and the NCCL tests run the same checks,
// so both backends are held to the same reference.

#include <cstddef>
#include <vector>

#include "worker/comm/communicator.h"

namespace recfleet {
namespace comm {

// Where a backend's buffers live. Rank r's calls run on rank r's thread.
class TestMemory {
 public:
  virtual ~TestMemory() = default;
  virtual Device device() const = 0;
  virtual void* Alloc(int rank, size_t bytes) = 0;
  virtual void Free(int rank, void* p) = 0;
  virtual void Upload(int rank, void* dst, const void* src, size_t bytes) = 0;
  virtual void Download(int rank, void* dst, const void* src, size_t bytes) = 0;
};

// Plain host memory (Gloo).
class HostTestMemory : public TestMemory {
 public:
  Device device() const override { return Device::kCpu; }
  void* Alloc(int rank, size_t bytes) override;
  void Free(int rank, void* p) override;
  void Upload(int rank, void* dst, const void* src, size_t bytes) override;
  void Download(int rank, void* dst, const void* src, size_t bytes) override;
};

// `comms[r]` is rank r's communicator of one group.
void CheckAllReduce(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory);
void CheckAllGather(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory);
void CheckReduceScatter(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory);
void CheckAllToAllUneven(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory);
void CheckBroadcast(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory);
void CheckBarrier(const std::vector<Communicator*>& comms);
// StartAllGather, StartReduceScatter and StartAllReduce in flight together,
// then a blocking all-reduce issued behind them: all four give the blocking
// collectives' results.
void CheckStartedCollectives(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory);

}  // namespace comm
}  // namespace recfleet

#endif  // RECFLEET_WORKER_COMM_CONFORMANCE_H_
