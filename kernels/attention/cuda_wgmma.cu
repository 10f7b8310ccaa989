// Hopper forward of the jagged attention at head dim 128 without bias:
// warpgroup MMA (wgmma) from shared memory, warp-specialized.
//
// A persistent CTA has three warpgroups. Warpgroup 2 is the producer: it
// streams the 128-row query tile and 128-row K/V tiles of its work items
// into shared memory with cp.async (rows past a sequence end zero-filled),
// through a two-stage ring guarded by mbarriers, and hands most of its
// registers to the consumers (setmaxnreg; wgmma kernels are allocated
// registers per warpgroup, so a lone producer warp would cost as much).
// Warpgroups 0 and 1 each own 64 of the tile's query rows: S = Q K^T is one
// m64n128 wgmma chain with both operands in shared memory, the activation
// (online softmax, or GELU/SiLU without running max/sum) runs on the
// accumulator registers, and O += P V takes P from registers and V from
// shared memory (transposed operand). Items are the launcher's longest-first
// forward tiles; CTA c takes items c, c + grid, c + 2 grid, ... so the
// longest start first on every SM. For GELU/SiLU ptxas serializes the wgmma
// chain at this register budget, so the launcher prefers the mma.sync kernel
// for those by default (attention_cuda.cc).
//
// Shared-memory tiles use the 128-byte swizzle of the wgmma descriptors: a
// [rows][128] bf16 tile is stored as two [rows][64] halves (128 bytes a
// row), and the 16-byte chunk c of row r sits at chunk c ^ (r & 7).

#include <cmath>

#include "kernels/attention/cuda_common.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

constexpr int kD = 128;
constexpr int kRowsQ = 128;     // query rows per work item (kForwardTileRows)
constexpr int kRowsKv = 128;    // keys per K/V tile
constexpr int kWgThreads = 128;
constexpr int kCtaThreads = 3 * kWgThreads;
constexpr int kTileBytes = 128 * kD * 2;  // one 128 x 128 bf16 tile
// Q, two stages of K and V, the barriers; plus slack to align to 1024.
constexpr int kSmemBytes = 5 * kTileBytes + 128 + 1024;

static_assert(kForwardTileRows == kRowsQ, "the planner's forward tiles must be 128 rows");

// ---- mbarriers. ----
__device__ __forceinline__ void BarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void BarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void BarWait(uint32_t bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ---- wgmma. ----
// Shared-memory matrix descriptor of a 128-byte-swizzled tile at byte address
// `addr` (1024-aligned atoms): leading and stride byte offsets in 16 bytes.
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32) |
         (1ull << 62);
}
__device__ __forceinline__ void WgFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgWait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

#define RF_ACC4(a, i) "+f"(a[i][0]), "+f"(a[i][1]), "+f"(a[i][2]), "+f"(a[i][3])
#define RF_ACC64(a)                                                                           \
  RF_ACC4(a, 0), RF_ACC4(a, 1), RF_ACC4(a, 2), RF_ACC4(a, 3), RF_ACC4(a, 4), RF_ACC4(a, 5),   \
      RF_ACC4(a, 6), RF_ACC4(a, 7), RF_ACC4(a, 8), RF_ACC4(a, 9), RF_ACC4(a, 10),            \
      RF_ACC4(a, 11), RF_ACC4(a, 12), RF_ACC4(a, 13), RF_ACC4(a, 14), RF_ACC4(a, 15)
#define RF_D64                                                                                 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
  "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"   \
  "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

// acc[64 x 128] (+)= A[64 x 16] * B[128 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void WgmmaSS(float (&acc)[16][4], uint64_t a, uint64_t b,
                                        int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " RF_D64 ", %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : RF_ACC64(acc)
      : "l"(a), "l"(b), "r"(accumulate));
}
// acc[64 x 128] += A[64 x 16] (registers) * B[16 x 128], B N-major in shared
// memory (the transposed operand).
__device__ __forceinline__ void WgmmaRS(float (&acc)[16][4], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " RF_D64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
      "}\n"
      : RF_ACC64(acc)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
#undef RF_ACC4
#undef RF_ACC64
#undef RF_D64

// Byte offset of element (row, col) in a swizzled [ROWS][128] tile.
template <int ROWS>
__device__ __forceinline__ uint32_t SwzOffset(int row, int col) {
  return (col >> 6) * (ROWS * 128) + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4);
}

// Starts copying rows [row0, row0 + 128) of one head into a swizzled tile;
// rows outside [0, len) are zero-filled. Called by the 128 producer threads.
__device__ __forceinline__ void LoadTile(uint32_t s, const bf16* g, int64_t start, int row0,
                                         int len, int head, int heads, int tid) {
#pragma unroll 4
  for (int idx = tid; idx < 128 * (kD / 8); idx += kWgThreads) {
    const int r = idx >> 4, c = (idx & 15) * 8;
    const int row = row0 + r;
    const bool ok = row >= 0 && row < len;
    const bf16* src = ok ? g + ((start + row) * heads + head) * kD + c : g;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     s + SwzOffset<128>(r, c)),
                 "l"(src), "r"(ok ? 16 : 0));
  }
}

// Waits for this thread's copies, makes them visible to the wgmma (async)
// proxy, and arrives on `bar`.
__device__ __forceinline__ void CopiesDone(uint32_t bar) {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  BarArrive(bar);
}

__device__ __forceinline__ WorkItem ItemAt(const KernelParams& p, int w) {
  WorkItem it = p.items[w / p.heads];
  it.head = w % p.heads;
  return it;
}

template <int A>
__global__ void __launch_bounds__(kCtaThreads, 1) WgmmaForwardKernel(const KernelParams p) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023) & ~1023u;
  const uint32_t q_s = base;
  const uint32_t k_s = base + kTileBytes;       // two stages
  const uint32_t v_s = base + 3 * kTileBytes;   // two stages
  const uint32_t bars = base + 5 * kTileBytes;  // full[2], empty[2], q_full, q_empty
  const uint32_t full = bars, empty = bars + 16, q_full = bars + 32, q_empty = bars + 40;
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int total = p.num_items * p.heads;

  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      BarInit(full + 8 * s, kWgThreads);
      BarInit(empty + 8 * s, 2 * kWgThreads);
    }
    BarInit(q_full, kWgThreads);
    BarInit(q_empty, 2 * kWgThreads);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 2) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    const bf16* q = static_cast<const bf16*>(p.q);
    const bf16* k = static_cast<const bf16*>(p.k);
    const bf16* v = static_cast<const bf16*>(p.v);
    int kv_iter = 0, item_iter = 0;
    for (int w = blockIdx.x; w < total; w += gridDim.x, ++item_iter) {
      const WorkItem it = ItemAt(p, w);
      const int n_tiles = (it.inner_end - it.inner_begin + kRowsKv - 1) / kRowsKv;
      BarWait(q_empty, (item_iter & 1) ^ 1);
      LoadTile(q_s, q, it.q_start, it.tile_row, it.q_len, it.head, p.heads, tid);
      CopiesDone(q_full);
      for (int n = 0; n < n_tiles; ++n, ++kv_iter) {
        const int s = kv_iter & 1;
        BarWait(empty + 8 * s, ((kv_iter >> 1) & 1) ^ 1);
        const int row0 = it.inner_begin + n * kRowsKv;
        LoadTile(k_s + s * kTileBytes, k, it.k_start, row0, it.k_len, it.head, p.heads, tid);
        LoadTile(v_s + s * kTileBytes, v, it.k_start, row0, it.k_len, it.head, p.heads, tid);
        CopiesDone(full + 8 * s);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int c = wg;  // consumer: rows [64 c, 64 c + 64) of the query tile
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int row_in_tile = c * 64 + warp * 16 + g;  // and + 8
  const float scale_log2 = p.scale * kLog2e;
  int kv_iter = 0, item_iter = 0;
  for (int w = blockIdx.x; w < total; w += gridDim.x, ++item_iter) {
    const WorkItem it = ItemAt(p, w);
    const int n_tiles = (it.inner_end - it.inner_begin + kRowsKv - 1) / kRowsKv;
    float o[16][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
    }
    BarWait(q_full, item_iter & 1);
    const uint32_t q_rows = q_s + c * 64 * 128;  // this warpgroup's 64 rows, half 0
    for (int n = 0; n < n_tiles; ++n, ++kv_iter) {
      const int s = kv_iter & 1;
      BarWait(full + 8 * s, (kv_iter >> 1) & 1);
      const uint32_t kb = k_s + s * kTileBytes, vb = v_s + s * kTileBytes;
      float sc[16][4];
      WgFence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t off = (kk >> 2) * (128 * 128) + (kk & 3) * 32;
        WgmmaSS(sc, Desc(q_rows + off, 16, 1024), Desc(kb + off, 16, 1024), kk > 0);
      }
      WgCommit();
      WgWait0();

      const int col0 = it.inner_begin + n * kRowsKv;
      if (TileFull(p, it.q_len, it.k_len, it.tile_row, kRowsQ, col0, kRowsKv)) {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if constexpr (A == kActSoftmax) {
              sc[nt][e] *= scale_log2;
            } else {
              sc[nt][e] = Act<A>(sc[nt][e] * p.scale);
            }
          }
        }
      } else {
        int lo[2], hi[2];
        RowKeyRanges(p, it.q_len, it.k_len, it.tile_row + row_in_tile, lo, hi);
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1, j = col0 + nt * 8 + 2 * t + (e & 1);
            const bool vis = j >= lo[r] && j < hi[r];
            if constexpr (A == kActSoftmax) {
              sc[nt][e] = vis ? sc[nt][e] * scale_log2 : -INFINITY;
            } else {
              sc[nt][e] = vis ? Act<A>(sc[nt][e] * p.scale) : 0.f;
            }
          }
        }
      }
      if constexpr (A == kActSoftmax) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < 16; ++nt) mx = fmaxf(mx, fmaxf(sc[nt][2 * r], sc[nt][2 * r + 1]));
          const float m_new = fmaxf(m[r], QuadMax(mx));
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          const float corr = Exp2(m[r] - m_use);
          m[r] = m_new;
          l[r] *= corr;
#pragma unroll
          for (int dt = 0; dt < 16; ++dt) {
            o[dt][2 * r] *= corr;
            o[dt][2 * r + 1] *= corr;
          }
#pragma unroll
          for (int nt = 0; nt < 16; ++nt) {
            sc[nt][2 * r] = Exp2(sc[nt][2 * r] - m_use);
            sc[nt][2 * r + 1] = Exp2(sc[nt][2 * r + 1] - m_use);
            l[r] += sc[nt][2 * r] + sc[nt][2 * r + 1];
          }
        }
      }
      uint32_t pa[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        pa[kk][0] = Pack(sc[2 * kk][0], sc[2 * kk][1]);
        pa[kk][1] = Pack(sc[2 * kk][2], sc[2 * kk][3]);
        pa[kk][2] = Pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        pa[kk][3] = Pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
      }
      WgFence();
#pragma unroll
      for (int kk = 0; kk < kRowsKv / 16; ++kk) {
        // Keys [16 kk, 16 kk + 16): two 8-row groups 1024 bytes apart; the
        // two 64-column halves of V 128 * 128 bytes apart.
        WgmmaRS(o, pa[kk], Desc(vb + kk * 16 * 128, 128 * 128, 1024));
      }
      WgCommit();
      WgWait0();
      BarArrive(empty + 8 * s);
    }
    BarArrive(q_empty);

    const int row_base = it.tile_row + row_in_tile;
    float mul[2] = {1.f, 1.f};
    if constexpr (A == kActSoftmax) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float sum = QuadSum(l[r]);
        mul[r] = sum > 0.f ? 1.f / sum : 0.f;
        const int i = row_base + 8 * r;
        if (t == 0 && i < it.q_len) {
          p.lse[(it.q_start + i) * p.heads + it.head] =
              sum > 0.f ? (m[r] + log2f(sum)) * kLn2 : -INFINITY;
        }
      }
    }
    StoreRows<kD>(p.o, o, it.q_start, row_base, it.q_len, it.head, p.heads, mul);
  }
}

template <int A>
int LaunchWgmma(const KernelParams& p, int sms, void* stream) {
  const int total = p.num_items * p.heads;
  if (total == 0) return 0;
  auto kernel = WgmmaForwardKernel<A>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<min(total, sms), kCtaThreads, kSmemBytes, static_cast<cudaStream_t>(stream)>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool WgmmaForwardSupports(const KernelParams& p) {
  return p.head_dim == kD && p.bias == nullptr && !p.rope;
}

int LaunchJaggedForwardWgmma(const KernelParams& p, int sms, void* stream) {
  if (p.activation == kActSoftmax) return LaunchWgmma<kActSoftmax>(p, sms, stream);
  if (p.activation == kActGelu) return LaunchWgmma<kActGelu>(p, sms, stream);
  return LaunchWgmma<kActSilu>(p, sms, stream);
}

}  // namespace recfleet::attention::cuda_impl
