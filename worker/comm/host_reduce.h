#ifndef RECFLEET_WORKER_COMM_HOST_REDUCE_H_
#define RECFLEET_WORKER_COMM_HOST_REDUCE_H_

// Element-wise reductions on host memory for the CPU backend: out = a (op) b
// over n elements of `dtype`. bf16 is widened to fp32, combined and rounded
// back to nearest-even, as NCCL does for its bf16 reductions.

#include <cstddef>
#include <cstdint>

#include "kernels/tensor.h"
#include "worker/comm/communicator.h"

namespace recfleet {
namespace comm {

float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float value);

// `out` may alias `a` or `b`. kAvg combines as kSum (the division by the
// group size happens once, in ScaleInPlace).
void CombineHost(DType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t n);

// x *= factor over n floating elements (for kAvg).
void ScaleInPlace(DType dtype, void* x, size_t n, double factor);

}  // namespace comm
}  // namespace recfleet

#endif  // RECFLEET_WORKER_COMM_HOST_REDUCE_H_
