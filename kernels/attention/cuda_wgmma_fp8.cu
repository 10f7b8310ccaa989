// Hopper FP8 (e4m3) forward of the jagged softmax attention at head dim 128:
// the quantize pre-pass (LaunchFp8Quantize) and a warp-specialized wgmma
// kernel built from the bf16 forward's pieces (cuda_wgmma.cuh, cuda_wgmma.cu
// for the design): a TMA producer warpgroup, two consumer warpgroups taking
// turns on the tensor cores, S_n issued with P_{n-1} V_{n-1}, persistent CTAs
// over the planner's longest-first grouped tiles.
//
// What FP8 changes:
//   - Operands and scales (cuda_kernels.h, Fp8Operands): power-of-two scales
//     only, so dequantization is exact and no scale costs more than an
//     exponent add. Q carries one scale per token and head over the whole
//     head dim (the reduction dimension of Q K^T), which folds into the
//     softmax's per-row exponent factor; K's per-channel scales are folded
//     into Q before Q is quantized, so the kernel sees no K scale; V's
//     per-channel scales are applied to the output columns in the epilogue.
//   - Q and K tiles are 128 rows (K: 128 or 192, Fp8Config) x 128 bytes:
//     one 128-byte-swizzled column block, loaded by one TMA copy. wgmma e4m3
//     needs both shared-memory operands K-major, so the P V GEMM reads V^T
//     ([d, keys] per head, made by the pre-pass) at column (sequence start
//     + key tile): one 128-key box, or three 64-key boxes (64-byte
//     swizzled) for a 192-key tile. Every tile loads by
//     TMA: rows past a sequence end belong to the next sequence (finite,
//     hidden by the mask like the bf16 kernel's zero-filled rows) and rows
//     past the tensor are zero-filled by TMA.
//   - Key tiles start at a multiple of 32 keys of the whole tensor
//     (ItemKeyTiles): in V^T the key is the innermost coordinate of the TMA
//     box, and a box whose innermost start is not 16-byte aligned faults
//     (cudaErrorIllegalInstruction); 32 also lines the tiles' k32 steps up
//     with V^T's permuted key blocks (next point). An item's first key tile
//     therefore starts up to 31 keys before its first key (the previous
//     sequence's, or zeros), masked like keys outside the row's range; that
//     can add a tile, so the rings are three deep (a grouped item's K/V
//     tiles stay resident while its query tiles pass).
//   - The fp32 accumulator holds a thread's scores at columns 8 q + 2 t,
//     + 1 (q = 0..3) of a k32 step; the e4m3 A fragment wants k indices
//     4 t .. 4 t + 3 and 16 + 4 t .. 16 + 4 t + 3. Rather than moving P
//     between the threads of a quad, the pre-pass stores V^T's keys permuted
//     inside each 32-key block (KeyOfSlot), so that slot 4 t + j holds the
//     key the thread's accumulator has there: P packs in place (PackP), and
//     the P V sum, over the same keys, is unchanged.
//   - P = exp2(s - m + 8) lies in [0, 256 * 2^kLazyMax]: m, the row's
//     running maximum, moves only when a tile's maximum exceeds it by more
//     than kLazyMax (as the row sum, P needs a fixed bound only, e4m3's
//     448), which spares the output's rescaling on most tiles; the row sum
//     carries the same factor, so the output needs no correction.

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "kernels/attention/cuda_fp8.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

// Q, K and V^T in one launch (the scales from ScalesBothKernel): V^T
// (transposed, V's channel scales), then K (K's channel scales), then Q (K's
// channel scales folded in, one scale per token).
struct QuantizeBlocks {
  int64_t vt, k, q;
  QuantizeBlocks(int64_t q_rows, int64_t kv_rows, int heads, int64_t vt_cols)
      : vt(TransposedBlocks(vt_cols, heads)),
        k(ChannelBlocks(kv_rows, heads)),
        q(TokenBlocks(q_rows, heads)) {}
};

__global__ void __launch_bounds__(256) QuantizeAllKernel(
    const bf16* q, const bf16* k, const bf16* v, int64_t q_rows, int64_t kv_rows, int heads,
    QuantizeBlocks blocks, const float* k_scale, const float* v_scale, uint8_t* q8, uint8_t* k8,
    uint8_t* vt8, float* q_scale, int64_t vt_cols) {
  int64_t b = blockIdx.x;
  if (b < blocks.vt) return QuantizeTransposedBlock(v, kv_rows, heads, v_scale, vt8, vt_cols, b);
  b -= blocks.vt;
  if (b < blocks.k) return QuantizeChannelsBlock(k, kv_rows, heads, k_scale, k8, b);
  b -= blocks.k;
  QuantizeTokensBlock(q, q_rows, heads, k_scale, q8, q_scale, b);
}

// ---- Forward configuration and shared memory. ----
// kKeyCols: keys per K/V tile (128, or 192: fewer per-tile steps for the
// same work; V^T then loads as 64-key boxes, 64-byte swizzled).
template <int kKeyCols>
struct Fp8Config {
  static constexpr int D = 128;
  static constexpr int kRows = 128;  // query rows per tile (64 per consumer)
  static constexpr int kKeys = kKeyCols;
  static_assert(kKeys == 128 || kKeys == 192, "key tile");
  static constexpr bool kVt64 = kKeys != 128;  // V^T as 64-key, 64-byte-swizzled boxes
  static constexpr int kStages = 3;  // of each ring: Q, K and V^T
  static constexpr int kTileBytes = kRows * D;  // a Q tile, one byte an element
  static constexpr int kKvBytes = kKeys * D;    // a K or a V^T tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kStages * kTileBytes;
  static constexpr int kV = kK + kStages * kKvBytes;
  static constexpr int kBars = kV + kStages * kKvBytes;
  static constexpr int kSmemBytes = kBars + 256 + 1024;
  static constexpr int kCtaThreads = 3 * kWgThreads;
  static constexpr int kFullArrivals = 1;  // the TMA thread's expect_tx
  // The 32-key alignment of ItemKeyTiles adds at most 31 keys.
  static constexpr int kKeyAlign = 32;
  // How far (log2) a row's maximum may grow past m before m moves: P stays
  // below 256 * 2^kLazyMax = 362 < 448, e4m3's largest finite value.
  static constexpr float kLazyMax = 0.5f;
  static_assert(6 * kStages * 8 <= 256, "the barriers fit their 256 bytes");
  static_assert(kStages * kKeys >= kWgmmaResidentKeys + kKeyAlign - 1,
                "a grouped item's aligned K/V tiles fit the rings");
};

// An item's K/V tiles: `count` tiles of kRows keys from key `first` of the
// sequence (first <= inner_begin, possibly negative), chosen so that the
// tensor-wide key k_start + first is a multiple of kKeyAlign (the file
// comment says why); none when the item sees no key.
struct KeyTiles {
  int first, count;
};
template <class C>
__device__ __forceinline__ KeyTiles ItemKeyTiles(const WorkItem& it) {
  if (it.inner_end <= it.inner_begin) return {it.inner_begin, 0};
  const int first = it.inner_begin - static_cast<int>((it.k_start + it.inner_begin) %
                                                      C::kKeyAlign);
  return {first, (it.inner_end - first + C::kKeys - 1) / C::kKeys};
}
static_assert(kForwardTileRows == Fp8Config<128>::kRows, "the planner's forward tiles are 128 rows");

// The K and V^T tiles of a ring stage.
template <class C>
__device__ __forceinline__ uint32_t KvTile(uint32_t ring, int stage) {
  return ring + stage * C::kKvBytes;
}

// ---- Producer (warpgroup 2; one thread issues every copy). ----
template <class C>
__device__ __forceinline__ void Fp8Producer(const KernelParams& p, const FwdSmem<C>& sm,
                                            const CUtensorMap& q_map, const CUtensorMap& k_map,
                                            const CUtensorMap& vt_map, int tid,
                                            const TileScheduler& sched) {
  ProducerRegs();
  if (tid != 0) return;
  int kv_iter = 0, q_iter = 0;
  for (int w = sched.First(); sched.Valid(w); w = sched.Next(w)) {
    const WorkItem it = ItemAt(p, w);
    const KeyTiles kt = ItemKeyTiles<C>(it);
    for (int j = 0; j < it.q_tiles; ++j, ++q_iter) {
      const RingPos<C::kStages> qp(q_iter);
      BarWait(sm.q_empty + 8 * qp.stage, qp.phase ^ 1);
      ExpectTile<C::kTileBytes>(sm.q_full + 8 * qp.stage);
      TmaLoadBlock(sm.Tile(sm.q, qp.stage), &q_map, 0, it.head,
                   static_cast<int>(it.q_start + it.tile_row + j * C::kRows),
                   sm.q_full + 8 * qp.stage);
      if (j > 0) continue;
      for (int n = 0; n < kt.count; ++n, ++kv_iter) {
        const RingPos<C::kStages> kp(kv_iter);
        const int key = static_cast<int>(it.k_start + kt.first + n * C::kKeys);
        BarWait(sm.k_empty + 8 * kp.stage, kp.phase ^ 1);
        ExpectTile<C::kKvBytes>(sm.k_full + 8 * kp.stage);
        TmaLoadBlock(KvTile<C>(sm.k, kp.stage), &k_map, 0, it.head, key,
                     sm.k_full + 8 * kp.stage);
        BarWait(sm.v_empty + 8 * kp.stage, kp.phase ^ 1);
        ExpectTile<C::kKvBytes>(sm.v_full + 8 * kp.stage);
        if constexpr (C::kVt64) {
#pragma unroll
          for (int b = 0; b < C::kKeys / 64; ++b) {
            TmaLoad2d(KvTile<C>(sm.v, kp.stage) + b * 64 * C::D, &vt_map, key + 64 * b,
                      it.head * C::D, sm.v_full + 8 * kp.stage);
          }
        } else {
          TmaLoad2d(KvTile<C>(sm.v, kp.stage), &vt_map, key, it.head * C::D,
                    sm.v_full + 8 * kp.stage);
        }
      }
    }
  }
}

// ---- Consumers. ----
template <int N>
struct Fp8Regs {
  float o[16][4];      // 64 rows x 128 output columns
  float sc[N / 8][4];  // 64 rows x N keys: S, then P
  uint32_t pa[N / 32][4];  // P as e4m3 A fragments, N / 32 k32 steps
  float m[2], l[2], corr[2];
  // The q_scale of the thread's two rows (times log2(e) * scale where used):
  // loaded when a tile starts and first read after its first S GEMM, so
  // that the load's latency is not waited for before that GEMM.
  float q_scale[2];
};

struct Fp8Rows {
  uint32_t q_tile, q_rows;
  int wg_row0, row0, t;
  int my_turn, other_turn;
};

struct Fp8Step {
  int k_stage, k_phase, v_stage, v_phase, col0;
  bool release;
};

// acc[64 x 128] += P[64 x N keys] (registers) V^T[128 x N keys]^T: V^T one
// 128-byte-swizzled block, or (kVt64) N / 64 blocks of 64-byte rows.
template <class C>
__device__ __forceinline__ void GemmFp8RS(float (&acc)[16][4],
                                          const uint32_t (&pa)[C::kKeys / 32][4], uint32_t vt) {
#pragma unroll
  for (int kk = 0; kk < C::kKeys / 32; ++kk) {
    const uint64_t b = C::kVt64 ? Desc64(vt + (kk >> 1) * 64 * C::D + (kk & 1) * 32)
                                : Desc(vt + kk * 32, 16, 1024);
    detail::FmaRS<GMMA::MMA_64x128x32_F32E4M3E4M3_RS_TN<>, 128>(
        acc, pa[kk], b, std::make_index_sequence<64>{});
  }
}

// The online softmax step of one 64 x 128 score tile, raw scores in, P * 256
// out (see the file comment): the mask where the tile is not fully
// visible (always where it starts before the sequence's key 0), the row max
// and sum, corr for the output so far.
template <class C>
__device__ __forceinline__ void Fp8Probs(const KernelParams& p, const WorkItem& it,
                                         Fp8Regs<C::kKeys>& r, const Fp8Rows& at, int col0) {
  constexpr int NT = C::kKeys / 8;
  const TileClass cls =
      col0 < 0 ? kTilePartial
               : ClassOf(p, it.q_len, it.k_len, at.wg_row0, 64, col0, C::kKeys);
  if (cls != kTileFull) {
    int lo[2], hi[2], lo_rel[2], hi_rel[2];
    RowKeyRanges(p, it.q_len, it.k_len, at.row0, lo, hi);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      lo_rel[i] = lo[i] - col0 - 2 * at.t;
      hi_rel[i] = hi[i] - col0 - 2 * at.t;
    }
    HideScores(r.sc, lo_rel, hi_rel, -INFINITY);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // The row maximum as a tree and the row sum in two parts: shorter
    // dependency chains than one running max and sum (measured: the kernel
    // 2.143 against 2.222 ms unmasked, bench/RESULTS.md).
    float a[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[j] = fmaxf(fmaxf(fmaxf(r.sc[j][2 * i], r.sc[j][2 * i + 1]),
                         fmaxf(r.sc[j + 4][2 * i], r.sc[j + 4][2 * i + 1])),
                   fmaxf(fmaxf(r.sc[j + 8][2 * i], r.sc[j + 8][2 * i + 1]),
                         fmaxf(r.sc[j + 12][2 * i], r.sc[j + 12][2 * i + 1])));
      if constexpr (NT == 24) {
        a[j] = fmaxf(a[j], fmaxf(fmaxf(r.sc[j + 16][2 * i], r.sc[j + 16][2 * i + 1]),
                                 fmaxf(r.sc[j + 20][2 * i], r.sc[j + 20][2 * i + 1])));
      }
    }
    const float mx = fmaxf(fmaxf(a[0], a[1]), fmaxf(a[2], a[3]));
    const float k_exp = r.q_scale[i] * (p.scale * kLog2e);
    const float m_tile = QuadMax(mx) * k_exp;
    const float m_new = m_tile > r.m[i] + C::kLazyMax ? m_tile : r.m[i];
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    r.corr[i] = Exp2(r.m[i] - m_use);
    r.m[i] = m_new;
    const float shift = 8.f - m_use;  // P * 256
    float part[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      r.sc[nt][2 * i] = Exp2(fmaf(r.sc[nt][2 * i], k_exp, shift));
      r.sc[nt][2 * i + 1] = Exp2(fmaf(r.sc[nt][2 * i + 1], k_exp, shift));
      part[nt & 1] += r.sc[nt][2 * i] + r.sc[nt][2 * i + 1];
    }
    r.l[i] = fmaf(r.l[i], r.corr[i], part[0] + part[1]);
  }
}

// One main-loop step: S_n (kS) and P_{n-1} V_{n-1} (kPv) issued in this
// warpgroup's turn, then S_n into P_n (while the P V runs), the output
// rescaled, P_n packed. As MainloopStep of cuda_wgmma.cu.
template <class C, bool kS, bool kPv>
__device__ __forceinline__ void Fp8MainloopStep(const KernelParams& p, const WorkItem& it,
                                                const FwdSmem<C>& sm, Fp8Regs<C::kKeys>& r,
                                                const Fp8Rows& at, const Fp8Step& st) {
  if (kS) BarWait(sm.k_full + 8 * st.k_stage, st.k_phase);
  if (kPv) BarWait(sm.v_full + 8 * st.v_stage, st.v_phase);
  TurnWait(p, at.my_turn);
  if constexpr (kPv) {
    FenceRegs(r.pa);
    FenceRegs(r.o);
  }
  WgFence();
  if constexpr (kS) {
    GemmFp8SS<C::kKeys>(r.sc, at.q_rows, KvTile<C>(sm.k, st.k_stage));
    WgCommit();
  }
  if constexpr (kPv) {
    GemmFp8RS<C>(r.o, r.pa, KvTile<C>(sm.v, st.v_stage));
    WgCommit();
  }
  TurnPass(p, at.other_turn);
  if constexpr (kS && kPv) {
    WgWait1();
    FenceRegs(r.sc);
    if (st.release) BarArrive(sm.k_empty + 8 * st.k_stage);
    Fp8Probs<C>(p, it, r, at, st.col0);
  }
  WgWait0();
  if constexpr (kPv) {
    FenceRegs(r.o);
    FenceRegs(r.pa);
    if (st.release) BarArrive(sm.v_empty + 8 * st.v_stage);
  }
  if constexpr (kS) {
    FenceRegs(r.sc);
    if constexpr (!kPv) {
      if (st.release) BarArrive(sm.k_empty + 8 * st.k_stage);
      Fp8Probs<C>(p, it, r, at, st.col0);
    } else if (__any_sync(0xffffffffu, r.corr[0] != 1.f || r.corr[1] != 1.f)) {
#pragma unroll
      for (int dt = 0; dt < 16; ++dt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) r.o[dt][e] *= r.corr[e >> 1];
      }
    }
    PackP<C::kKeys>(r.sc, r.pa);
  }
}

// The epilogue: 1 / sum per row, the log-sum-exp (the quad's first thread),
// and the output rows scaled by V's channel scales, as bf16.
template <class C>
__device__ __forceinline__ void Fp8Epilogue(const KernelParams& p, const WorkItem& it,
                                            const Fp8Regs<C::kKeys>& r, const Fp8Rows& at,
                                            const float2 (&v_scale)[16]) {
  float mul[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float sum = QuadSum(r.l[i]);
    const bool seen = sum > 0.f;  // Else the row saw no key.
    mul[i] = seen ? 1.f / sum : 0.f;
    const int row = at.row0 + 8 * i;
    if (at.t == 0 && row < it.q_len) {
      p.lse[(it.q_start + row) * p.heads + it.head] =
          seen ? (r.m[i] + log2f(sum) - 8.f) * kLn2 : -INFINITY;
    }
  }
  StoreScaledRows(p.o, r.o, it.q_start, at.row0, it.q_len, it.head, p.heads, mul, v_scale, at.t);
}

template <class C>
__device__ __forceinline__ void Fp8Consumer(const KernelParams& p, const FwdSmem<C>& sm, int c,
                                            int tid, const TileScheduler& sched) {
  ConsumerRegs();
  Fp8Rows at{};
  at.my_turn = 1 + c;
  at.other_turn = 2 - c;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2;
  at.t = lane & 3;
  const int row_in_tile = c * 64 + warp * 16 + g;
  if (c == 1) TurnPass(p, 1);  // warpgroup 0 issues first
  Fp8Regs<C::kKeys> r;
  int kv_iter = 0, q_iter = 0;
  // The next item is read before this one's last epilogue, whose stores hide
  // the load's latency.
  WorkItem next{};
  if (sched.Valid(sched.First())) next = ItemAt(p, sched.First());
  for (int w = sched.First(); sched.Valid(w); w = sched.Next(w)) {
    WorkItem it = next;
    const KeyTiles kt = ItemKeyTiles<C>(it);
    const int kv_first = kv_iter;
    for (int j = 0; j < it.q_tiles; ++j, ++q_iter, it.tile_row += C::kRows) {
      kv_iter = kv_first;
      at.row0 = it.tile_row + row_in_tile;
      at.wg_row0 = it.tile_row + 64 * c;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = at.row0 + 8 * i;
        r.m[i] = -INFINITY;
        r.l[i] = 0.f;
        r.q_scale[i] = 1.f;
        if (row < it.q_len) r.q_scale[i] = p.q_scale[(it.q_start + row) * p.heads + it.head];
      }
#pragma unroll
      for (int dt = 0; dt < 16; ++dt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) r.o[dt][e] = 0.f;
      }
      const RingPos<C::kStages> qp(q_iter);
      BarWait(sm.q_full + 8 * qp.stage, qp.phase);
      at.q_tile = sm.Tile(sm.q, qp.stage);
      at.q_rows = at.q_tile + c * 64 * 128;
      // V's column scales for the epilogue, loaded before the last step (whose
      // S registers are free) so that their latency hides behind its P V.
      float2 v_scale[16];
      if (kt.count > 0) {
        Fp8Step st{};
        st.release = j + 1 == it.q_tiles;
        RingPos<C::kStages> kp(kv_iter);
        st.k_stage = kp.stage;
        st.k_phase = kp.phase;
        st.col0 = kt.first;
        Fp8MainloopStep<C, true, false>(p, it, sm, r, at, st);
        for (int n = 1; n < kt.count; ++n) {
          st.v_stage = kp.stage;
          st.v_phase = kp.phase;
          kp = RingPos<C::kStages>(++kv_iter);
          st.k_stage = kp.stage;
          st.k_phase = kp.phase;
          st.col0 = kt.first + n * C::kKeys;
          Fp8MainloopStep<C, true, true>(p, it, sm, r, at, st);
        }
        st.v_stage = kp.stage;
        st.v_phase = kp.phase;
        LoadColumnScales(p.v_scale + it.head * C::D, at.t, v_scale);
        Fp8MainloopStep<C, false, true>(p, it, sm, r, at, st);
        ++kv_iter;
      } else {
        LoadColumnScales(p.v_scale + it.head * C::D, at.t, v_scale);
      }
      BarArrive(sm.q_empty + 8 * qp.stage);
      if (j + 1 == it.q_tiles && sched.Valid(sched.Next(w))) next = ItemAt(p, sched.Next(w));
      Fp8Epilogue<C>(p, it, r, at, v_scale);
    }
  }
  if (c == 0) TurnWait(p, at.my_turn);
}

template <class C>
__global__ void __launch_bounds__(C::kCtaThreads, 1)
    Fp8ForwardKernel(const KernelParams p, const __grid_constant__ CUtensorMap q_map,
                     const __grid_constant__ CUtensorMap k_map,
                     const __grid_constant__ CUtensorMap vt_map) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const FwdSmem<C> sm((raw + 1023) & ~1023u);
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const TileScheduler sched(p);
  if (threadIdx.x == 0) sm.Init();
  __syncthreads();
  if (wg == 2) {
    Fp8Producer<C>(p, sm, q_map, k_map, vt_map, tid, sched);
  } else {
    Fp8Consumer<C>(p, sm, wg, tid, sched);
  }
}

}  // namespace

bool MakeRowsMap(CUtensorMap* map, const void* base, int64_t rows, int heads, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr || rows <= 0 || rows > INT32_MAX) return false;
  const cuuint64_t dims[3] = {128, static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {128, static_cast<cuuint64_t>(heads) * 128};
  const cuuint32_t box[3] = {128, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
// box_keys 128 (128-byte swizzle) or 64 (64-byte swizzle).
bool MakeVtMap(CUtensorMap* map, const void* base, int64_t vt_cols, int heads, int box_keys) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr || vt_cols <= 0 || vt_cols > INT32_MAX || vt_cols % 16 != 0) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(vt_cols),
                              static_cast<cuuint64_t>(heads) * 128};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(vt_cols)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_keys), 128};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                box_keys == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

namespace {

template <class C>
int LaunchFp8Kernel(const KernelParams& p, int sms, cudaStream_t stream) {
  CUtensorMap q_map{}, k_map{}, vt_map{};
  if (!MakeRowsMap(&q_map, p.q, p.q_rows, p.heads, C::kRows) ||
      !MakeRowsMap(&k_map, p.k, p.kv_rows, p.heads, C::kKeys) ||
      !MakeVtMap(&vt_map, p.v, p.vt_cols, p.heads, C::kVt64 ? 64 : 128)) {
    return cudaErrorNotSupported;
  }
  auto kernel = Fp8ForwardKernel<C>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       C::kSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<TileScheduler::Grid(p, sms), C::kCtaThreads, C::kSmemBytes, stream>>>(p, q_map, k_map,
                                                                                vt_map);
  return cudaGetLastError();
}

}  // namespace

int LaunchFp8Quantize(const void* q, const void* k, const void* v, int64_t q_rows,
                      int64_t kv_rows, int heads, int head_dim, const Fp8Operands& ops,
                      void* stream) {
  if (head_dim != 128) return cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  const int cols = heads * 128;
  uint32_t* k_amax = ops.amax;  // Then V's: amax[cols .. 2 cols).
  if (kv_rows > 0) {
    ChannelAmaxKernel<<<ChannelAmaxGrid(kv_rows, cols), 256, 0, s>>>(
        static_cast<const bf16*>(k), static_cast<const bf16*>(v), kv_rows, cols, k_amax);
  }
  // The scales, then Q, K and V^T in one launch.
  ScalesBothKernel<<<(2 * cols + 255) / 256, 256, 0, s>>>(ops.amax, cols, ops.k_scale, ops.v_scale);
  const QuantizeBlocks blocks(q_rows, kv_rows, heads, ops.vt_cols);
  const int64_t grid = blocks.vt + blocks.k + blocks.q;
  if (grid > 0) {
    QuantizeAllKernel<<<static_cast<unsigned>(grid), 256, 0, s>>>(
        static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
        q_rows, kv_rows, heads, blocks, ops.k_scale, ops.v_scale, static_cast<uint8_t*>(ops.q8),
        static_cast<uint8_t*>(ops.k8), static_cast<uint8_t*>(ops.vt8), ops.q_scale, ops.vt_cols);
  }
  return cudaGetLastError();
}

bool Fp8ForwardSupports(const KernelParams& p) {
  return p.head_dim == 128 && p.activation == kActSoftmax && p.bias == nullptr && !p.rope &&
         p.scale > 0.f;
}

int LaunchJaggedForwardFp8(const KernelParams& p, int sms, void* stream) {
  if (p.num_items * p.heads == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return p.fp8_wide_keys ? LaunchFp8Kernel<Fp8Config<192>>(p, sms, s)
                         : LaunchFp8Kernel<Fp8Config<128>>(p, sms, s);
}

}  // namespace recfleet::attention::cuda_impl
