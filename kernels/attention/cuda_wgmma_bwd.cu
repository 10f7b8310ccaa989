// Hopper backward of the jagged attention (head dim 64 or 128, any
// activation, mask and bias): two warp-specialized persistent passes
// without atomics, built from the forward's pieces (cuda_wgmma.cuh: the tile
// scheduler, ring positions, producer tile loads, GEMMs and barriers) and
// configured by BwdConfig (head dim, stationary side, tile shapes, ring
// depth, shared-memory layout).
//
// Both passes have one shape. A CTA owns a 128-row stationary tile pair
// (X, Y) of one (sequence, head) and streams the 64-row tile pairs (A, B)
// of the other side that see it:
//   dK/dV pass: X = K, Y = V, A = Q, B = dO (items: 128-key tiles);
//   dQ pass:    X = Q, Y = dO, A = K, B = V (items: 128-query tiles).
// Warpgroup 2 is the producer (TMA where a tile lies inside its sequence,
// cp.async with zero fill where it crosses the end; for the softmax dK/dV
// pass also the streamed queries' log-sum-exp and rowsum(dO * O) into shared
// memory). Warpgroups 0 and 1 each own 64 stationary rows. Per streamed
// tile a consumer computes
//   T1 = X A^T and T2 = Y B^T  (wgmma, both operands in shared memory),
// which are S^T and dP^T in the dK/dV pass, S and dP in the dQ pass; turns
// them into P and dS in registers (mask, bias, softmax from the saved
// log-sum-exp, or GELU/SiLU and their derivatives; dbias in the dK/dV
// pass, which visits every visible pair once); and accumulates
//   dK += dS^T Q, dV += P^T dO   or   dQ += dS K
// with the left operand from registers (the accumulator layout is the A
// fragment layout) and the right one read transposed from the same
// streamed tile in shared memory. The two consumers run unsynchronized, so
// one's element-wise work overlaps the other's GEMMs. Streamed tiles pass
// through a ring of BwdConfig::kStages stages; the stationary pair is
// reloaded once both consumers finished an item.

#include <cmath>
#include <cstdint>

#include "kernels/attention/cuda_wgmma.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

// One pass's compile-time configuration: head dim, which side is
// stationary, tile shapes, ring depth and the shared-memory layout.
template <int kHeadDim, bool kKeysStationary, bool kFusedDqAtomics = false>
struct BwdConfig {
  static constexpr int D = kHeadDim;
  static constexpr bool kDkDv = kKeysStationary;
  // dK/dV pass only: it also forms dQ = dS K per streamed query tile and adds
  // it into KernelParams::dq_accum by TMA reduce-add (no dQ pass).
  static constexpr bool kFusedDq = kFusedDqAtomics;
  static_assert(!kFusedDq || kDkDv, "fused dQ: dK/dV pass only");
  static constexpr int kStatRows = 128;   // 64 per consumer warpgroup
  static constexpr int kStreamRows = 64;  // rows of a streamed tile
  static constexpr int kStages = 3;
  static constexpr int kStatBytes = kStatRows * D * 2;
  static constexpr int kStreamBytes = kStreamRows * D * 2;
  static constexpr int kDsBytes = kStatRows * kStreamRows * 2;
  static constexpr int kDqBlockBytes = kStreamRows * 64 * 4;
  static constexpr int kNumBars = 6 + 3 * kStages;
  static constexpr int SmemBytes(int stat_bufs) {
    return stat_bufs * 2 * kStatBytes + 2 * kStages * kStreamBytes +
           (kFusedDq ? 2 * kDsBytes + 2 * kDqBlockBytes : 0) + kStages * 2 * kStreamRows * 4 +
           8 * kNumBars + 1024;
  }
  // Buffers of the stationary pair: two where shared memory allows (every
  // configuration but the fused dQ at d = 128), so that the next item's pair
  // loads while this item's last streamed tiles are still computed (items
  // with few streamed tiles otherwise wait for that load each time).
  static constexpr int kStatBufs = SmemBytes(2) <= 227 * 1024 ? 2 : 1;
  // Byte offsets from the 1024-aligned base (swizzled tiles 1024-aligned):
  // the stationary pairs (X, Y of buffer b at b * kStatPairBytes), the A and
  // B rings; for the fused dQ, dS^T of the key tile x the streamed queries
  // (bf16, swizzled, two buffers) and each consumer's fp32 dQ block
  // [kStreamRows][64]; the streamed rows' softmax statistics ([stage][lse2 |
  // dsum][row] floats); the barriers.
  static constexpr int kStatPairBytes = 2 * kStatBytes;
  static constexpr int kX = 0;
  static constexpr int kY = kStatBytes;
  static constexpr int kA = kStatBufs * kStatPairBytes;
  static constexpr int kB = kA + kStages * kStreamBytes;
  static constexpr int kDs = kB + kStages * kStreamBytes;
  static constexpr int kDq = kDs + (kFusedDq ? 2 * kDsBytes : 0);
  static constexpr int kStats = kDq + (kFusedDq ? 2 * kDqBlockBytes : 0);
  static constexpr int kBars = kStats + kStages * 2 * kStreamRows * 4;
  static_assert(kDs % 1024 == 0 && kDsBytes % 1024 == 0, "swizzled tiles are 1024-aligned");
  static constexpr int kSmemBytes = SmemBytes(kStatBufs);
  static_assert(kSmemBytes == kBars + 8 * kNumBars + 1024, "layout");
  static constexpr int kCtaThreads = 3 * kWgThreads;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};
static_assert(kForwardTileRows == 128, "the dQ pass's items are the forward's query tiles");

// Named barriers of the fused dQ: per consumer, its dQ block written (1, 2);
// per step parity and consumer, its half of dS^T written (3..6).
constexpr int kDqBar = 1;
constexpr int kDsBar = 3;

// Which part of Grads to run: everything once T1 and T2 are complete, or,
// for softmax, P from T1 alone (while the T2 GEMM still runs) and then dS.
enum GradsPart { kGradsAll, kGradsP, kGradsDs };

// Turns a consumer's T1 (scores) and T2 (dO V^T) tiles into P (in t1) and
// dS * scale (in t2). Rows are the thread's two stationary rows row0 and
// row0 + 8, columns the streamed rows col0 + 8 nt + 2 t + e % 2; [lo[r],
// hi[r]) are the streamed rows row r sees. Softmax statistics: per row (dQ
// pass: lse2_r, dsum_r) or per column from shared memory (dK/dV pass).
// kFull: every pair of the tile is visible and there is no bias.
template <bool kDkDv, int A, int N, GradsPart kPart, bool kFull>
__device__ __forceinline__ void GradsTile(const KernelParams& p, const WorkItem& it,
                                          float (&t1)[N / 8][4], float (&t2)[N / 8][4], int row0,
                                          int col0, int t, const int (&lo)[2], const int (&hi)[2],
                                          const float (&lse2_r)[2], const float (&dsum_r)[2],
                                          const float* lse2_c, const float* dsum_c) {
  constexpr bool full = kFull;
  static_assert(kPart == kGradsAll || A == kActSoftmax, "split parts: softmax only");
  static_assert(N > 0, "tile");
  constexpr bool kP = kPart != kGradsDs, kDs = kPart != kGradsP;
  const float scale_log2 = p.scale * kLog2e;
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) {
    // dK/dV pass: the statistics of this thread's two columns, one 8-byte
    // shared-memory load each.
    float2 lse2_cc = {0.f, 0.f}, dsum_cc = {0.f, 0.f};
    if constexpr (kDkDv && A == kActSoftmax) {
      if constexpr (kP) lse2_cc = *reinterpret_cast<const float2*>(lse2_c + nt * 8 + 2 * t);
      if constexpr (kDs) dsum_cc = *reinterpret_cast<const float2*>(dsum_c + nt * 8 + 2 * t);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, cl = nt * 8 + 2 * t + (e & 1);
      const int col = col0 + cl, row = row0 + 8 * r;
      const bool vis = full || (col >= lo[r] && col < hi[r]);
      const int i = kDkDv ? col : row, j = kDkDv ? row : col;
      float pr = t1[nt][e], ds;
      if constexpr (A == kActSoftmax) {
        if constexpr (kP) {
          const float l2 = kDkDv ? ((e & 1) ? lse2_cc.y : lse2_cc.x) : lse2_r[r];
          if (full) {
            pr = Exp2(fmaf(t1[nt][e], scale_log2, -l2));
          } else {
            float x = t1[nt][e] * p.scale;
            if (p.bias != nullptr && vis) x += BiasAt(p, it, i, j);
            pr = vis ? Exp2(x * kLog2e - l2) : 0.f;
          }
        }
        if constexpr (kDs) {
          ds = pr * (t2[nt][e] - (kDkDv ? ((e & 1) ? dsum_cc.y : dsum_cc.x) : dsum_r[r]));
        }
      } else {
        float x = t1[nt][e] * p.scale;
        if (!full && p.bias != nullptr && vis) x += BiasAt(p, it, i, j);
        float y, dy;
        ActAndGrad<A>(x, y, dy);
        pr = vis ? y : 0.f;
        ds = vis ? t2[nt][e] * dy : 0.f;
      }
      if constexpr (kDs && kDkDv) {
        if (!full && p.dbias != nullptr && vis) StoreBias(p, it, i, j, ds);
      }
      if constexpr (kP) t1[nt][e] = pr;
      if constexpr (kDs) t2[nt][e] = ds * p.scale;
    }
  }
}

template <bool kDkDv, int A, int N, GradsPart kPart>
__device__ __forceinline__ void Grads(const KernelParams& p, const WorkItem& it,
                                      float (&t1)[N / 8][4], float (&t2)[N / 8][4], int row0,
                                      int col0, int t, bool full, const int (&lo)[2],
                                      const int (&hi)[2], const float (&lse2_r)[2],
                                      const float (&dsum_r)[2], const float* lse2_c,
                                      const float* dsum_c) {
  if (full) {
    GradsTile<kDkDv, A, N, kPart, true>(p, it, t1, t2, row0, col0, t, lo, hi, lse2_r, dsum_r,
                                        lse2_c, dsum_c);
  } else {
    GradsTile<kDkDv, A, N, kPart, false>(p, it, t1, t2, row0, col0, t, lo, hi, lse2_r, dsum_r,
                                         lse2_c, dsum_c);
  }
}

// Stores a consumer's dS^T (bf16 A fragments of its 64 key rows x N
// streamed queries, first row `row`) into the swizzled [128 keys][N] tile
// `ds`: the M-major A operand of dQ = dS K.
template <int N>
__device__ __forceinline__ void StoreDsT(uint32_t ds, const uint32_t (&pa)[N / 16][4], int row,
                                         int t) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = row + 8 * (j & 1), col = kk * 16 + 8 * (j >> 1) + 2 * t;
      StoreShared(ds + SwzOffset<128>(r, col) + (col & 7) * 2, pa[kk][j]);
    }
  }
}

// dQ[64 queries x 64 columns] = dS[64 x 128 keys] K[128 keys x 64 columns]:
// dS from the dS^T tile (M-major), K from the stationary tile's column block
// at `kb` (N-major). Not committed.
__device__ __forceinline__ void GemmDq(float (&dq)[8][4], uint32_t ds, uint32_t kb) {
#pragma unroll
  for (int kk = 0; kk < 128 / 16; ++kk) {
    WgmmaSS<64, 1, 1>(dq, Desc(ds + kk * 16 * 128, 128 * 128, 1024),
                      Desc(kb + kk * 16 * 128, 128 * 128, 1024), kk > 0);
  }
}

// One CTA's shared memory (BwdConfig's layout at run time): the stationary
// pairs, the A and B rings, the softmax statistics, and the barriers: per
// stationary buffer, the pair landed (x_full, y_full) and released
// (stat_empty); per stage, A and B landed and the stage released (empty).
template <class C>
struct BwdSmem {
  uint32_t x, y, a, b, ds, dq;
  float* stats;
  uint32_t x_full, y_full, stat_empty, a_full, b_full, empty;
  int stat_bufs;
  __device__ BwdSmem(unsigned char* smem_raw, const KernelParams& p) {
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw + 1023) & ~1023u;
    stats = reinterpret_cast<float*>(smem_raw + (base - raw) + C::kStats);
    x = base + C::kX;
    y = base + C::kY;
    a = base + C::kA;
    b = base + C::kB;
    ds = base + C::kDs;
    dq = base + C::kDq;
    x_full = base + C::kBars;
    y_full = x_full + 16;
    stat_empty = x_full + 32;
    a_full = x_full + 48;
    b_full = a_full + 8 * C::kStages;
    empty = b_full + 8 * C::kStages;
    stat_bufs = p.wgmma_stat_prefetch ? C::kStatBufs : 1;
  }
  // Item i's stationary pair: buffer i % stat_bufs, its (i / stat_bufs)-th use.
  __device__ int StatBuf(int item) const { return stat_bufs == 2 ? item & 1 : 0; }
  __device__ int StatPhase(int item) const { return (stat_bufs == 2 ? item >> 1 : item) & 1; }
  __device__ void Init() const {
    for (int i = 0; i < 2; ++i) {
      BarInit(x_full + 8 * i, kWgThreads);
      BarInit(y_full + 8 * i, kWgThreads);
      BarInit(stat_empty + 8 * i, 2 * kWgThreads);
    }
    for (int s = 0; s < C::kStages; ++s) {
      BarInit(a_full + 8 * s, kWgThreads);
      BarInit(b_full + 8 * s, kWgThreads);
      BarInit(empty + 8 * s, 2 * kWgThreads);
    }
    BarInitDone();
  }
};

// The softmax statistics of streamed query row i: its log2-domain
// log-sum-exp and rowsum(dO * O) (zeros past the sequence end).
__device__ __forceinline__ float2 StreamedRowStats(const KernelParams& p, const WorkItem& it,
                                                   int i) {
  if (i >= it.q_len) return make_float2(0.f, 0.f);
  const int64_t rh = (it.q_start + i) * p.heads + it.head;
  return make_float2(Lse2(p, rh), p.dsum[rh]);
}

// The four global tensors of a pass: the stationary pair (X, Y) and the
// streamed pair (A, B).
template <class C>
struct BwdOperands {
  const bf16 *x, *y, *a, *b;
  __device__ explicit BwdOperands(const KernelParams& p) {
    const bf16* q = static_cast<const bf16*>(p.q);
    const bf16* k = static_cast<const bf16*>(p.k);
    const bf16* v = static_cast<const bf16*>(p.v);
    const bf16* dout = static_cast<const bf16*>(p.dout);
    x = C::kDkDv ? k : q;
    y = C::kDkDv ? v : dout;
    a = C::kDkDv ? q : k;
    b = C::kDkDv ? dout : v;
  }
};

// ---- Producer (warpgroup 2). ----
// Per work item its stationary pair (X, Y) into the item's buffer, then the
// streamed tile pairs (A, B) that see it through the ring (for the softmax
// dK/dV pass with the streamed queries' log-sum-exp and rowsum(dO * O)).
template <class C, int A>
__device__ __forceinline__ void BwdProducer(const KernelParams& p, const BwdSmem<C>& sm,
                                            const CUtensorMap& x_map, const CUtensorMap& y_map,
                                            const CUtensorMap& a_map, const CUtensorMap& b_map,
                                            bool tma, int tid, const TileScheduler& sched,
                                            const BwdOperands<C>& src) {
  constexpr int D = C::D, R = C::kStreamRows, kS = C::kStages;
  constexpr bool kDkDv = C::kDkDv;
  ProducerRegs();
  const bf16* xg = src.x;
  const bf16* yg = src.y;
  const bf16* ag = src.a;
  const bf16* bg = src.b;
  int iter = 0, item = 0;
  for (int w = sched.First(); sched.Valid(w); w = sched.Next(w), ++item) {
    const WorkItem it = ItemAt(p, w);
    const int64_t x_start = kDkDv ? it.k_start : it.q_start;
    const int64_t a_start = kDkDv ? it.q_start : it.k_start;
    const int x_len = kDkDv ? it.k_len : it.q_len, a_len = kDkDv ? it.q_len : it.k_len;
    const int n_tiles = (it.inner_end - it.inner_begin + R - 1) / R;
    const int sb = sm.StatBuf(item);
    BarWait(sm.stat_empty + 8 * sb, sm.StatPhase(item) ^ 1);
    FillTile<D, C::kStatRows>(sm.x + sb * C::kStatPairBytes, &x_map, tma, xg, x_start,
                              it.tile_row, x_len, it.head, p.heads, tid, sm.x_full + 8 * sb);
    FillTile<D, C::kStatRows>(sm.y + sb * C::kStatPairBytes, &y_map, tma, yg, x_start,
                              it.tile_row, x_len, it.head, p.heads, tid, sm.y_full + 8 * sb);
    for (int n = 0; n < n_tiles; ++n, ++iter) {
      const RingPos<kS> rp(iter);
      const int s = rp.stage, parity = rp.phase ^ 1;
      const int row0 = it.inner_begin + n * R;
      BarWait(sm.empty + 8 * s, parity);
      if constexpr (kDkDv && A == kActSoftmax) {
        // Published by this thread's arrive on a_full (release).
        if (tid < R) {
          const float2 st = StreamedRowStats(p, it, row0 + tid);
          sm.stats[s * 2 * R + tid] = st.x;
          sm.stats[s * 2 * R + R + tid] = st.y;
        }
      }
      FillTile<D, R>(sm.a + s * C::kStreamBytes, &a_map, tma, ag, a_start, row0, a_len,
                     it.head, p.heads, tid, sm.a_full + 8 * s);
      FillTile<D, R>(sm.b + s * C::kStreamBytes, &b_map, tma, bg, a_start, row0, a_len,
                     it.head, p.heads, tid, sm.b_full + 8 * s);
    }
  }
}

// ---- Epilogue. ----
// A consumer's stationary rows of the item's gradients (this thread's rows
// row0 and row0 + 8): dK and dV in the dK/dV pass, dQ in the dQ pass.
template <class C>
__device__ __forceinline__ void BwdEpilogue(const KernelParams& p, const WorkItem& it, int row0,
                                            const float (&o1)[C::D / 8][4],
                                            const float (&o2)[C::kDkDv ? C::D / 8 : 1][4]) {
  const float one[2] = {1.f, 1.f};
  if constexpr (C::kDkDv) {
    StoreRows<C::D>(p.dk, o1, it.k_start, row0, it.k_len, it.head, p.heads, one);
    StoreRows<C::D>(p.dv, o2, it.k_start, row0, it.k_len, it.head, p.heads, one);
  } else {
    StoreRows<C::D>(p.dq, o1, it.q_start, row0, it.q_len, it.head, p.heads, one);
  }
}

// ---- Consumers (warpgroups 0 and 1): main loop and epilogue. ----
// Consumer c owns stationary rows [64 c, 64 c + 64) of each item's tile: per
// streamed tile T1 and T2 (wgmma), P and dS (GradsTile), the accumulating
// GEMMs (and the fused dQ block); then the epilogue stores dK and dV (or
// dQ).
template <class C, int A>
__device__ __forceinline__ void BwdConsumer(const KernelParams& p, const BwdSmem<C>& sm,
                                            const CUtensorMap& dq_map, int c, int tid,
                                            const TileScheduler& sched) {
  constexpr int D = C::D, R = C::kStreamRows, kS = C::kStages;
  constexpr bool kDkDv = C::kDkDv;
  // Fused dQ: who forms a streamed tile's dQ block. At d = 128 each consumer
  // the 64 columns from 64 c; at d = 64 (one 64-column block) the consumers
  // take turns by step parity, so each pays for every other step's GEMM.
  constexpr bool kSplitDqColumns = D == 128;
  ConsumerRegs();
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  int iter = 0, item = 0;
  for (int w = sched.First(); sched.Valid(w); w = sched.Next(w), ++item) {
    const WorkItem it = ItemAt(p, w);
    const int n_tiles = (it.inner_end - it.inner_begin + R - 1) / R;
    const int wg_row0 = it.tile_row + c * 64;
    const int row0 = wg_row0 + warp * 16 + g;  // and row0 + 8
    int lo[2], hi[2];
    float lse2_r[2] = {0.f, 0.f}, dsum_r[2] = {0.f, 0.f};
    if constexpr (kDkDv) {
#pragma unroll
      for (int r = 0; r < 2; ++r) QueryRangeOf(p, it.q_len, it.k_len, row0 + 8 * r, lo[r], hi[r]);
    } else {
      RowKeyRanges(p, it.q_len, it.k_len, row0, lo, hi);
      if constexpr (A == kActSoftmax) QueryRowStats(p, it, row0, lse2_r, dsum_r);
    }
    float o1[D / 8][4], o2[kDkDv ? D / 8 : 1][4];
    Zero(o1);
    Zero(o2);
    const int sb = sm.StatBuf(item);
    const uint32_t x_sb = sm.x + sb * C::kStatPairBytes, y_sb = sm.y + sb * C::kStatPairBytes;
    const uint32_t x_rows = x_sb + c * 64 * 128, y_rows = y_sb + c * 64 * 128;
    BarWait(sm.x_full + 8 * sb, sm.StatPhase(item));
    BarWait(sm.y_full + 8 * sb, sm.StatPhase(item));
    // This warpgroup's 64 stationary rows against a streamed tile
    // (tile_mask.h). The tiles none of whose pairs is visible (the window's
    // far edge for one warpgroup or the other, stationary rows past the
    // sequence end) come first or last in the stream (the ranges are
    // monotone); the loop bounds skip them, so they cost a release each and
    // no GEMM, and the main loop keeps one code path (a branch around its
    // GEMMs made ptxas spill). The fused dQ needs both halves of dS^T, so it
    // computes them (all zero). GELU and SiLU compute them too: at d = 128
    // the bounds' two registers made their dK/dV pass spill ~130 bytes
    // (against ~30 without), softmax's 16.
    auto tile_class = [&](int col0) {
      return kDkDv ? ClassOf(p, it.q_len, it.k_len, col0, R, wg_row0, 64)
                   : ClassOf(p, it.q_len, it.k_len, wg_row0, 64, col0, R);
    };
    int n_begin = 0, n_end = n_tiles;
    if constexpr (!C::kFusedDq && A == kActSoftmax) {
      while (n_begin < n_end && tile_class(it.inner_begin + n_begin * R) == kTileOutside) {
        ++n_begin;
      }
      while (n_end > n_begin && tile_class(it.inner_begin + (n_end - 1) * R) == kTileOutside) {
        --n_end;
      }
    }
    // A skipped tile is released once it has landed, which keeps this
    // warpgroup's releases in step with the producer's refills.
    auto skip = [&](int& iter) {
      const RingPos<kS> rp(iter);
      const int s = rp.stage, parity = rp.phase;
      BarWait(sm.a_full + 8 * s, parity);
      BarWait(sm.b_full + 8 * s, parity);
      BarArrive(sm.empty + 8 * s);
      ++iter;
    };
    for (int n = 0; n < n_begin; ++n) skip(iter);
    for (int n = n_begin; n < n_end; ++n, ++iter) {
      const RingPos<kS> rp(iter);
      const int s = rp.stage, parity = rp.phase;
      const int col0 = it.inner_begin + n * R;
      const uint32_t as = sm.a + s * C::kStreamBytes, bs = sm.b + s * C::kStreamBytes;
      float t1[R / 8][4], t2[R / 8][4];
      BarWait(sm.a_full + 8 * s, parity);
      BarWait(sm.b_full + 8 * s, parity);
      WgFence();
      GemmSS<D, R, C::kStatRows>(t1, x_rows, as);
      if constexpr (A == kActSoftmax) WgCommit();  // its own group: P starts first
      GemmSS<D, R, C::kStatRows>(t2, y_rows, bs);
      WgCommit();
      const bool full = p.bias == nullptr && tile_class(col0) == kTileFull;
      const float* lse2_c = sm.stats + s * 2 * R;
      const float* dsum_c = lse2_c + R;
      if constexpr (A == kActSoftmax) {
        // P while the dP GEMM runs.
        WgWait1();
        FenceRegs(t1);
        Grads<kDkDv, A, R, kGradsP>(p, it, t1, t2, row0, col0, t, full, lo, hi, lse2_r, dsum_r,
                                    lse2_c, dsum_c);
        WgWait0();
        FenceRegs(t2);
        Grads<kDkDv, A, R, kGradsDs>(p, it, t1, t2, row0, col0, t, full, lo, hi, lse2_r, dsum_r,
                                     lse2_c, dsum_c);
      } else {
        WgWait0();
        FenceRegs(t1);
        FenceRegs(t2);
        Grads<kDkDv, A, R, kGradsAll>(p, it, t1, t2, row0, col0, t, full, lo, hi, lse2_r,
                                      dsum_r, lse2_c, dsum_c);
      }
      uint32_t pds[R / 16][4], pp[kDkDv ? R / 16 : 1][4];
      PackA<R>(t2, pds);
      if constexpr (kDkDv) PackA<R>(t1, pp);
      const uint32_t ds_buf = sm.ds + (iter & 1) * C::kDsBytes;
      if constexpr (C::kFusedDq) {
        // dS^T to shared memory for dQ = dS K, which needs all 128 keys:
        // both consumers' halves, hence the barrier. Two buffers, so that a
        // consumer writing step n + 1's cannot meet the other's step n GEMM.
        StoreDsT<R>(ds_buf, pds, c * 64 + warp * 16 + g, t);
        FenceProxyAsync();
        if (kSplitDqColumns || c != (iter & 1)) {
          NamedBarArrive(kDsBar + 2 * (iter & 1) + c, 2 * kWgThreads);
        }
      }
      FenceRegs(pds);
      FenceRegs(o1);
      if constexpr (kDkDv) {
        FenceRegs(pp);
        FenceRegs(o2);
      }
      WgFence();
      GemmRS<D, R>(o1, pds, as);  // dK += dS^T Q, or dQ += dS K
      if constexpr (kDkDv) GemmRS<D, R>(o2, pp, bs);  // dV += P^T dO
      WgCommit();
      WgWait0();
      FenceRegs(o1);
      if constexpr (kDkDv) FenceRegs(o2);
      BarArrive(sm.empty + 8 * s);
      if constexpr (C::kFusedDq) {
        if (!kSplitDqColumns && c != (iter & 1)) continue;  // the other's turn (d = 64)
        // A GEMM step of its own: with dS and P still held by the one above,
        // the registers would not suffice (ptxas serializes the chain).
        float dq[8][4];
        // The other consumer's half of dS^T (it arrives there after
        // writing it; a consumer is at most one step ahead of the other, so
        // two barriers per consumer, by step parity, keep the counts apart;
        // at d = 64 the consumer whose turn it is waits for the other's
        // half, and the other waits in the next step, which bounds the lead
        // to one step the same way).
        const int dq_col0 = kSplitDqColumns ? 64 * c : 0;
        NamedBarSync(kDsBar + 2 * (iter & 1) + (1 - c), 2 * kWgThreads);
        WgFence();
        GemmDq(dq, ds_buf, x_sb + (dq_col0 / 64) * C::kStatRows * 128);
        WgCommit();
        WgWait0();
        FenceRegs(dq);
        FenceRegs(o1);
        FenceRegs(o2);
        // This consumer's dQ block [64 queries][64 columns from dq_col0] through
        // shared memory into dq_accum; the previous block's reduce must have
        // read the buffer first.
        const uint32_t blk = sm.dq + c * C::kDqBlockBytes;
        if (tid == 0) BulkWait<true>();
        NamedBarSync(kDqBar + c, kWgThreads);
        // Two 32-column halves [64 rows][128 bytes], 128-byte swizzled (the
        // 16-byte chunk c of row r at c ^ (r & 7)), so that the quad-strided
        // rows of a warp's stores hit distinct banks.
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int row = warp * 16 + g + 8 * r, chunk = 2 * (nt & 3) + (t >> 1);
            const uint32_t at = blk + (nt >> 2) * (64 * 128) + row * 128 +
                                ((chunk ^ (row & 7)) << 4) + (t & 1) * 8;
            StoreShared(at, dq[nt][2 * r], dq[nt][2 * r + 1]);
          }
        }
        FenceProxyAsync();
        NamedBarSync(kDqBar + c, kWgThreads);
        if (tid == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            TmaReduceAdd(&dq_map, blk + h * 64 * 128, dq_col0 + 32 * h, it.head,
                         static_cast<int>(it.q_start + col0));
          }
        }
      }
    }
    for (int n = n_end; n < n_tiles; ++n) skip(iter);
    BarArrive(sm.stat_empty + 8 * sb);
    BwdEpilogue<C>(p, it, row0, o1, o2);
  }
  if constexpr (C::kFusedDq) {
    if (tid == 0) BulkWait<false>();
  }
}

template <class C, int A>
__global__ void __launch_bounds__(C::kCtaThreads, 1)
    WgmmaBackwardKernel(const KernelParams p, const __grid_constant__ CUtensorMap x_map,
                        const __grid_constant__ CUtensorMap y_map,
                        const __grid_constant__ CUtensorMap a_map,
                        const __grid_constant__ CUtensorMap b_map,
                        const __grid_constant__ CUtensorMap dq_map, bool tma) {
  extern __shared__ unsigned char smem_raw[];
  const BwdSmem<C> sm(smem_raw, p);
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const TileScheduler sched(p);
  const BwdOperands<C> src(p);
  if (threadIdx.x == 0) sm.Init();
  __syncthreads();
  if (wg == 2) {
    BwdProducer<C, A>(p, sm, x_map, y_map, a_map, b_map, tma, tid, sched, src);
  } else {
    BwdConsumer<C, A>(p, sm, dq_map, wg, tid, sched);
  }
}

template <class C, int A>
int LaunchBackward(const KernelParams& p, int sms, void* stream) {
  if (p.num_items * p.heads == 0) return 0;
  const void* x = C::kDkDv ? p.k : p.q;
  const void* y = C::kDkDv ? p.v : p.dout;
  const void* a = C::kDkDv ? p.q : p.k;
  const void* b = C::kDkDv ? p.dout : p.v;
  const int64_t x_rows = C::kDkDv ? p.kv_rows : p.q_rows;
  const int64_t a_rows = C::kDkDv ? p.q_rows : p.kv_rows;
  CUtensorMap x_map{}, y_map{}, a_map{}, b_map{};
  const bool tma =
      p.wgmma_tma && MakeTileMap(&x_map, x, x_rows, p.heads, C::D, C::kStatRows) &&
      MakeTileMap(&y_map, y, x_rows, p.heads, C::D, C::kStatRows) &&
      MakeTileMap(&a_map, a, a_rows, p.heads, C::D, C::kStreamRows) &&
      MakeTileMap(&b_map, b, a_rows, p.heads, C::D, C::kStreamRows);
  CUtensorMap dq_map{};
  if (C::kFusedDq &&
      !(tma && MakeTileMap(&dq_map, p.dq_accum, p.q_rows, p.heads, C::D, C::kStreamRows,
                           /*f32=*/true))) {
    return cudaErrorNotSupported;
  }
  auto kernel = WgmmaBackwardKernel<C, A>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<TileScheduler::Grid(p, sms), C::kCtaThreads, C::kSmemBytes,
           static_cast<cudaStream_t>(stream)>>>(p, x_map, y_map, a_map, b_map, dq_map, tma);
  return cudaGetLastError();
}

template <bool kDkDv>
int DispatchBackward(const KernelParams& p, int sms, void* stream) {
  return DispatchKernel(p, [&](auto d, auto a) {
    constexpr int D = decltype(d)::value, A = decltype(a)::value;
    if constexpr (kDkDv) {
      if (p.dq_accum != nullptr) return LaunchBackward<BwdConfig<D, true, true>, A>(p, sms, stream);
    }
    return LaunchBackward<BwdConfig<D, kDkDv>, A>(p, sms, stream);
  });
}

}  // namespace

bool WgmmaBackwardSupports(const KernelParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128) && !p.rope;
}

bool WgmmaFusedDqSupports(const KernelParams& p) { return p.wgmma_tma; }

int LaunchJaggedBackwardDqWgmma(const KernelParams& p, int sms, void* stream) {
  return DispatchBackward<false>(p, sms, stream);
}

int LaunchJaggedBackwardDkDvWgmma(const KernelParams& p, int sms, void* stream) {
  return DispatchBackward<true>(p, sms, stream);
}

}  // namespace recfleet::attention::cuda_impl
