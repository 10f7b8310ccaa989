// Hopper forward of the jagged attention at head dim 64 or 128 (any activation,
// mask and bias): warpgroup MMA (wgmma) from shared memory, warp-specialized.
//
// A persistent CTA has three warpgroups. Warpgroup 2 is the producer: it
// streams the 128-row query tiles and 128-row K/V tiles of its work items
// into shared memory, by TMA (one thread, two bulk tensor copies a tile)
// where the tile lies inside its sequence and by cp.async with zero fill
// where it crosses the sequence end. Query tiles go through a two-stage
// ring of their own (the next item's Q loads while the current item
// computes, which matters for the short-K/V shapes with one or two K/V
// tiles per item), K and V through two-stage rings with separate barriers
// (K_n is released when S_n is done, V_n only after P_n V_n, one step
// later). It hands most of its registers to the consumers
// (setmaxnreg; wgmma kernels are allocated registers per warpgroup, so a
// lone producer warp would cost as much). Warpgroups 0 and 1 each own 64 of
// the tile's query rows: S = Q K^T is one m64n128 wgmma chain with both
// operands in shared memory, the activation (online softmax, or GELU/SiLU
// without running max/sum) runs on the accumulator registers, and O += P V
// takes P from registers and V from shared memory (transposed operand). The
// two consumers take turns issuing their GEMMs (named barriers), so one's
// activation runs while the other's GEMMs keep the tensor cores busy, and
// each issues S_n together with P_{n-1} V_{n-1} (FlashAttention-3's
// ping-pong and intra-warpgroup overlap). Items are the launcher's
// longest-first forward tiles; CTA c takes items c, c + grid, c + 2 grid,
// ... so the longest start first on every SM. An item may cover up to
// kWgmmaMaxGroup consecutive query tiles that see the same K/V rows (at
// most two K/V tiles: short-K/V cross-attention, PMA); its K/V tiles then
// load once and stay resident while its query tiles pass.
//
// Shared-memory tiles use the 128-byte swizzle of the wgmma descriptors
// (cuda_wgmma.cuh, which also holds the producer's loads and the GEMMs the
// backward shares).

#include <cmath>
#include <cstdint>

#include "kernels/attention/cuda_wgmma.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

// The driver's tensor-map encoder, looked up once through the runtime (no
// link-time dependency on the driver library); null if unavailable.
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

bool MakeTileMap(CUtensorMap* map, const void* base, int64_t rows, int heads, int d,
                 int box_rows, bool f32) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr || rows <= 0 || rows > INT32_MAX || d % 64 != 0 ||
      reinterpret_cast<uintptr_t>(base) % 16 != 0) {
    return false;
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t elem = f32 ? 4 : 2;
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d) * elem,
                                static_cast<cuuint64_t>(heads) * d * elem};
  // 128-byte rows: 64 bf16 or 32 fp32 columns.
  const cuuint32_t box[3] = {f32 ? 32u : 64u, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

namespace {

constexpr int kRowsQ = 128;     // query rows per work item (kForwardTileRows)
constexpr int kRowsKv = 128;    // keys per K/V tile
constexpr int kCtaThreads = 3 * kWgThreads;
// One 128-row tile at head dim D.
template <int D>
constexpr int kTileBytes = 128 * D * 2;
// Two stages each of Q, K and V, the barriers; plus slack to align to 1024.
template <int D>
constexpr int kSmemBytes = 6 * kTileBytes<D> + 128 + 1024;
static_assert(12 * 8 <= 128, "the barriers fit their 128 bytes");

static_assert(kForwardTileRows == kRowsQ, "the planner's forward tiles must be 128 rows");

// Named barriers 1 and 2 order the two consumer warpgroups' GEMM issue
// (barrier 0 is __syncthreads): warpgroup c waits on 1 + c for its turn and
// hands the turn over by arriving on 2 - c.
// KernelParams::wgmma_turns = false turns both into no-ops.
__device__ __forceinline__ void TurnWait(const KernelParams& p, int id) {
  if (p.wgmma_turns) asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(2 * kWgThreads) : "memory");
}
__device__ __forceinline__ void TurnPass(const KernelParams& p, int id) {
  if (p.wgmma_turns) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(2 * kWgThreads) : "memory");
  }
}

// Hides the scores of a warpgroup's partially visible tile: `hidden` where
// the key lies outside the row's range. lo_rel and hi_rel are the thread's
// two rows' key ranges relative to its first column (col0 + 2 t), so each
// score costs two compares against immediates and a select.
__device__ __forceinline__ void HideScores(float (&sc)[16][4], const int (&lo_rel)[2],
                                           const int (&hi_rel)[2], float hidden) {
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, cl = nt * 8 + (e & 1);
      sc[nt][e] = cl >= lo_rel[r] && cl < hi_rel[r] ? sc[nt][e] : hidden;
    }
  }
}

// Turns a warpgroup's 64 x 128 score tile (its query rows from wg_row0,
// keys col0..col0 + 127) into probabilities in place: the mask (and bias),
// the scale, then either the online softmax step (running max m and sum l
// per row; corr receives the factor the output accumulated so far must be
// multiplied by) or the activation with corr = 1. The warpgroup's class of
// the tile (tile_mask.h) picks the path: every pair visible (no mask
// instruction) or not (softmax: the raw scores hidden by HideScores; GELU
// and SiLU: per element). Tiles with no pair visible (a warpgroup past the
// window's edge or the sequence end) take the masked path too: a path of
// their own made the chained loops spill (ptxas).
template <int A>
__device__ __forceinline__ void ScoresToProbs(const KernelParams& p, const WorkItem& it,
                                              float (&sc)[16][4], int wg_row0, int row0, int col0,
                                              int t, float (&m)[2], float (&l)[2],
                                              float (&corr)[2]) {
  corr[0] = corr[1] = 1.f;
  const TileClass cls = ClassOf(p, it.q_len, it.k_len, wg_row0, 64, col0, kRowsKv);
  // Softmax: the factor the exponent's FMA still applies to the scores. With
  // no bias and a positive scale the scores stay raw (the row maximum
  // commutes with the scale), which saves a multiply per score; otherwise
  // they are scaled here and the factor is 1.
  float k_exp = 1.f;
  if (p.bias == nullptr && (A == kActSoftmax || cls == kTileFull)) {
    if constexpr (A == kActSoftmax) {
      const float c = p.scale * kLog2e;
      if (c > 0.f) {
        k_exp = c;
      } else {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[nt][e] *= c;
        }
      }
      if (cls != kTileFull) {
        int lo[2], hi[2], lo_rel[2], hi_rel[2];
        RowKeyRanges(p, it.q_len, it.k_len, row0, lo, hi);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          lo_rel[r] = lo[r] - col0 - 2 * t;
          hi_rel[r] = hi[r] - col0 - 2 * t;
        }
        HideScores(sc, lo_rel, hi_rel, -INFINITY);
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = ActOfHalf<A>(sc[nt][e] * (0.5f * p.scale));
      }
    }
  } else {
    // Bias, or GELU/SiLU on a tile not fully visible: per element (hiding the GELU's
    // and SiLU's scores after their activation costs registers that their
    // chained loop does not have).
    int lo[2], hi[2];
    RowKeyRanges(p, it.q_len, it.k_len, row0, lo, hi);
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, j = col0 + nt * 8 + 2 * t + (e & 1);
        const bool vis = j >= lo[r] && j < hi[r];
        float x = sc[nt][e] * p.scale;
        if (p.bias != nullptr && vis) x += BiasAt(p, it, row0 + 8 * r, j);
        if constexpr (A == kActSoftmax) {
          sc[nt][e] = vis ? x * kLog2e : -INFINITY;
        } else {
          sc[nt][e] = vis ? Act<A>(x) : 0.f;
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
      const float m_new = fmaxf(m[r], QuadMax(mx) * k_exp);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      corr[r] = Exp2(m[r] - m_use);
      m[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        sc[nt][2 * r] = Exp2(fmaf(sc[nt][2 * r], k_exp, -m_use));
        sc[nt][2 * r + 1] = Exp2(fmaf(sc[nt][2 * r + 1], k_exp, -m_use));
        sum += sc[nt][2 * r] + sc[nt][2 * r + 1];
      }
      l[r] = fmaf(l[r], corr[r], sum);
    }
  }
}

// S = Q K^T for one K/V stage: Q (this warpgroup's 64 rows) and K both
// from shared memory, eight k16 steps over the head dim.
template <int D>
__device__ __forceinline__ void IssueS(float (&sc)[16][4], uint32_t q_rows, uint32_t kb) {
  GemmSS<D, kRowsKv, kRowsQ>(sc, q_rows, kb);
  WgCommit();
}

// O += P V for one K/V stage: P (64 x 128 keys) from registers, V from
// shared memory.
template <int D>
__device__ __forceinline__ void IssuePv(float (&o)[D / 8][4], const uint32_t (&pa)[8][4],
                                        uint32_t vb) {
  GemmRS<D, kRowsKv>(o, pa, vb);
  WgCommit();
}

// Softmax: the thread's two rows' output scales (1 / sum) and their
// log-sum-exp, written by the quad's first thread. Other activations keep
// mul as it is.
template <int A>
__device__ __forceinline__ void FinishRows(const KernelParams& p, const WorkItem& it, int row0,
                                           int t, const float (&m)[2], const float (&l)[2],
                                           float (&mul)[2]) {
  if constexpr (A == kActSoftmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = QuadSum(l[r]);
      mul[r] = sum > 0.f ? 1.f / sum : 0.f;
      const int i = row0 + 8 * r;
      if (t == 0 && i < it.q_len) {
        p.lse[(it.q_start + i) * p.heads + it.head] =
            sum > 0.f ? (m[r] + log2f(sum)) * kLn2 : -INFINITY;
      }
    }
  }
}

// Writes a thread's two rows of O (the first `rows` of them: row, then
// 8 rows on), each scaled by its mul, as bf16.
template <int D>
__device__ __forceinline__ void StoreOut(const float (&o)[D / 8][4], bf16* row, int rows, int heads,
                                         const float (&mul)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (r >= rows) break;
    bf16* out = row + static_cast<int64_t>(r) * 8 * heads * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<__nv_bfloat162*>(out + dt * 8) =
          __floats2bfloat162_rn(o[dt][2 * r] * mul[r], o[dt][2 * r + 1] * mul[r]);
    }
  }
}

template <int D, int A, bool kOverlapOwnPv>
__global__ void __launch_bounds__(kCtaThreads, 1)
    WgmmaForwardKernel(const KernelParams p, const __grid_constant__ CUtensorMap q_map,
                       const __grid_constant__ CUtensorMap k_map,
                       const __grid_constant__ CUtensorMap v_map, bool tma) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023) & ~1023u;
  const uint32_t q_s = base;                    // two stages
  const uint32_t k_s = base + 2 * kTileBytes<D>;   // two stages
  const uint32_t v_s = base + 4 * kTileBytes<D>;   // two stages
  // Barriers, two stages each: K, V and Q landed (full) and released (empty).
  const uint32_t bars = base + 6 * kTileBytes<D>;
  const uint32_t k_full = bars, v_full = bars + 16, q_full = bars + 32;
  const uint32_t k_empty = bars + 48, v_empty = bars + 64, q_empty = bars + 80;
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int total = p.num_items * p.heads;

  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      for (uint32_t f : {k_full, v_full, q_full}) BarInit(f + 8 * s, kWgThreads);
      for (uint32_t e : {k_empty, v_empty, q_empty}) BarInit(e + 8 * s, 2 * kWgThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 2) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    const bf16* q = static_cast<const bf16*>(p.q);
    const bf16* k = static_cast<const bf16*>(p.k);
    const bf16* v = static_cast<const bf16*>(p.v);
    int kv_iter = 0, q_iter = 0;
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
      const WorkItem it = ItemAt(p, w);
      const int n_tiles = (it.inner_end - it.inner_begin + kRowsKv - 1) / kRowsKv;
      // Query tile j of the run goes to stage q_iter & 1, so it loads while
      // the consumers still work on the tile before; the item's K/V tiles
      // follow its first query tile and stay for the others.
      for (int j = 0; j < it.q_tiles; ++j, ++q_iter) {
        const int qs = q_iter & 1;
        BarWait(q_empty + 8 * qs, ((q_iter >> 1) & 1) ^ 1);
        FillTile<D, kRowsQ>(q_s + qs * kTileBytes<D>, &q_map, tma, q, it.q_start,
                            it.tile_row + j * kRowsQ, it.q_len, it.head, p.heads, tid,
                            q_full + 8 * qs);
        if (j > 0) continue;
        // K and V have barriers of their own: K_n is free once S_n is done,
        // V_n only after P_n V_n, which the consumers issue one step later.
        for (int n = 0; n < n_tiles; ++n, ++kv_iter) {
          const int s = kv_iter & 1, parity = ((kv_iter >> 1) & 1) ^ 1;
          const int row0 = it.inner_begin + n * kRowsKv;
          BarWait(k_empty + 8 * s, parity);
          FillTile<D, kRowsKv>(k_s + s * kTileBytes<D>, &k_map, tma, k, it.k_start, row0,
                               it.k_len, it.head, p.heads, tid, k_full + 8 * s);
          BarWait(v_empty + 8 * s, parity);
          FillTile<D, kRowsKv>(v_s + s * kTileBytes<D>, &v_map, tma, v, it.k_start, row0,
                               it.k_len, it.head, p.heads, tid, v_full + 8 * s);
        }
      }
    }
    return;
  }

  // Consumers. Per K/V tile n, in its turn, a warpgroup issues S_n = Q K_n^T
  // and O += P_{n-1} V_{n-1} back to back, passes the turn, and computes P_n
  // from S_n while the other warpgroup's GEMMs run (FlashAttention-3's
  // ping-pong with the intra-warpgroup overlap).
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  // kOverlapOwnPv: S_n turns into P_n while this warpgroup's own
  // P_{n-1} V_{n-1} still runs (the one-tanh SiLU and GELU fit the registers
  // beside the pinned O and P_{n-1}; the earlier polynomial GELU spilled).
  // Without it the warpgroup waits for its P V first and overlaps only with
  // the other warpgroup's GEMMs.
  // kChain (SiLU and GELU): the steps run across query tiles and items, a
  // query tile's last P V issued with the next tile's S_0 and its O stored
  // after that (KernelParams::wgmma_chain), so short K/V ranges need no GEMM
  // step of their own for the last P V: +9.5% on the short-K/V cross shape
  // for SiLU, none on causal SiLU. Softmax keeps one query tile at a time,
  // which measured 5% faster for it on H200 (bench/RESULTS.md, attention).
  constexpr bool kChain = A != kActSoftmax;
  const int c = wg;  // rows [64 c, 64 c + 64) of the query tile
  const int my_turn = 1 + c, other_turn = 2 - c;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int row_in_tile = c * 64 + warp * 16 + g;  // and + 8
  if (c == 1) TurnPass(p, 1);  // warpgroup 0 issues first
  if constexpr (kChain) {
    float o[D / 8][4], sc[16][4], m[2], l[2], corr[2];
    uint32_t pa[8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[i][e] = 0u;
    }
    // The P V not yet issued, packed into one register (its state lives
    // across tiles, next to O, P and S): P in pa, V in stage pv_stage, its
    // full-barrier parity, and whether it releases V. Then where the query
    // tile it completes goes: this thread's first output row (the second is
    // 8 rows on), how many of the two lie in the sequence, and their scales.
    constexpr int kPvPending = 1, kPvRelease = 2, kPvStage = 4, kPvParity = 8;
    int pv = 0;
    bf16* out_row = nullptr;
    int out_rows = 0;
    float out_mul[2] = {1.f, 1.f};
    int kv_iter = 0, q_iter = 0;
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
      WorkItem it = ItemAt(p, w);
      const int n_tiles = (it.inner_end - it.inner_begin + kRowsKv - 1) / kRowsKv;
      // Whether the query tile after this item's last one has K/V tiles, so
      // that the last P V can wait for its S_0.
      bool next_has_tiles = false;
      if (p.wgmma_chain && w + static_cast<int>(gridDim.x) < total) {
        const WorkItem& nx = p.items[(w + gridDim.x) / p.heads];
        next_has_tiles = nx.inner_end > nx.inner_begin;
      }
      // The query tiles of a grouped item share its resident K/V tiles (their
      // full barriers stay complete), which only the last one releases.
      const int kv_first = kv_iter;
      for (int j = 0; j < it.q_tiles; ++j, ++q_iter, it.tile_row += kRowsQ) {
        const bool release = j + 1 == it.q_tiles;
        kv_iter = kv_first;
        const int row0 = it.tile_row + row_in_tile;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
        const int qs = q_iter & 1;
        const uint32_t q_tile = q_s + qs * kTileBytes<D>;
        const uint32_t q_rows = q_tile + c * 64 * 128;  // this warpgroup's rows
        BarWait(q_full + 8 * qs, (q_iter >> 1) & 1);
        // The tile's last P V waits for the next query tile's S_0 if that has
        // K/V tiles; otherwise a last step issues it (with S on the query
        // tile itself, discarded).
        const bool flush = n_tiles > 0 && !(j + 1 < it.q_tiles ? p.wgmma_chain : next_has_tiles);
        const int steps = n_tiles + flush;
        for (int n = 0; n < steps; ++n) {
          // Step n: S_n with the pending P V (the previous K/V tile's, or at
          // n = 0 the previous query tile's last one). Without one pending
          // (n = 0 after a tile that flushed), the step still issues a P V,
          // on the query tile, whose result n = 0 discards. One code path
          // with no branch around any wgmma: two would merge versions of
          // O's registers with moves, and ptxas would serialize the wgmma
          // pipeline (C7520) and spill.
          const bool real = n < n_tiles;
          const int s = kv_iter & 1, parity = (kv_iter >> 1) & 1;
          const int col0 = it.inner_begin + n * kRowsKv;
          const bool pv_pending = pv & kPvPending;
          const int pv_stage = (pv & kPvStage) != 0;
          if (real) BarWait(k_full + 8 * s, parity);
          if (pv_pending) BarWait(v_full + 8 * pv_stage, (pv & kPvParity) != 0);
          const uint32_t kb = real ? k_s + s * kTileBytes<D> : q_tile;
          const uint32_t vb = pv_pending ? v_s + pv_stage * kTileBytes<D> : q_tile;
          TurnWait(p, my_turn);
          FenceRegs(pa);
          FenceRegs(o);
          WgFence();
          IssueS<D>(sc, q_rows, kb);
          IssuePv<D>(o, pa, vb);
          TurnPass(p, other_turn);
          if constexpr (kOverlapOwnPv) {
            WgWait1();
            FenceRegs(sc);
            if (real) {
              if (release) BarArrive(k_empty + 8 * s);
              ScoresToProbs<A>(p, it, sc, it.tile_row + 64 * c, row0, col0, t, m, l, corr);
            }
          }
          WgWait0();
          FenceRegs(o);
          FenceRegs(pa);
          FenceRegs(sc);
          if (n + 1 == steps) BarArrive(q_empty + 8 * qs);
          if (pv_pending && (pv & kPvRelease)) BarArrive(v_empty + 8 * pv_stage);
          if constexpr (!kOverlapOwnPv) {
            if (real) {
              if (release) BarArrive(k_empty + 8 * s);
              ScoresToProbs<A>(p, it, sc, it.tile_row + 64 * c, row0, col0, t, m, l, corr);
            }
          }
          if (real) PackA<kRowsKv>(sc, pa);
          if (n == 0) {
            // The previous query tile's O is complete (if its last P V waited).
            // Pinned here, so that its conversion is not hoisted into the
            // activation above (where it would hold 32 more registers).
            FenceRegs(pa);
            FenceRegs(o);
            if (pv_pending) StoreOut<D>(o, out_row, out_rows, p.heads, out_mul);
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
              for (int e = 0; e < 4; ++e) o[dt][e] = 0.f;
            }
          } else if constexpr (A == kActSoftmax) {
            if (real) {
#pragma unroll
              for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) o[dt][e] *= corr[e >> 1];
              }
            }
          }
          pv = real ? kPvPending | (release ? kPvRelease : 0) | (s ? kPvStage : 0) |
                          (parity ? kPvParity : 0)
                    : 0;
          if (real) ++kv_iter;
        }
        if (n_tiles == 0) BarArrive(q_empty + 8 * qs);

        // The tile's normalization (and log-sum-exp) are known now.
        out_row = static_cast<bf16*>(p.o) + ((it.q_start + row0) * p.heads + it.head) * D + 2 * t;
        out_rows = (row0 < it.q_len) + (row0 + 8 < it.q_len);
        FinishRows<A>(p, it, row0, t, m, l, out_mul);
        // O is complete unless its last P V is pending (zero if no K/V).
        if (pv == 0) {
          StoreOut<D>(o, out_row, out_rows, p.heads, out_mul);
#pragma unroll
          for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) o[dt][e] = 0.f;
          }
        }
      }
    }
  } else {
    // The loop of one query tile at a time: S_0 alone, S_n with
    // P_{n-1} V_{n-1}, the last P V alone, then O.
    int kv_iter = 0, q_iter = 0;
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
      WorkItem it = ItemAt(p, w);
      const int n_tiles = (it.inner_end - it.inner_begin + kRowsKv - 1) / kRowsKv;
      // The query tiles of a grouped item share its resident K/V tiles (their
      // full barriers stay complete), which only the last one releases.
      const int kv_first = kv_iter;
      for (int j = 0; j < it.q_tiles; ++j, ++q_iter, it.tile_row += kRowsQ) {
        const bool release = j + 1 == it.q_tiles;
        kv_iter = kv_first;
        const int row0 = it.tile_row + row_in_tile;
        float o[D / 8][4], sc[16][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, corr[2];
        uint32_t pa[8][4];
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
        }
        const int qs = q_iter & 1;
        BarWait(q_full + 8 * qs, (q_iter >> 1) & 1);
        const uint32_t q_rows = q_s + qs * kTileBytes<D> + c * 64 * 128;  // this warpgroup's rows
        if (n_tiles > 0) {
          // Tile 0: S_0 alone.
          int s = kv_iter & 1;
          BarWait(k_full + 8 * s, (kv_iter >> 1) & 1);
          TurnWait(p, my_turn);
          WgFence();
          IssueS<D>(sc, q_rows, k_s + s * kTileBytes<D>);
          TurnPass(p, other_turn);
          WgWait0();
          FenceRegs(sc);
          if (release) BarArrive(k_empty + 8 * s);
          ScoresToProbs<A>(p, it, sc, it.tile_row + 64 * c, row0, it.inner_begin, t, m, l, corr);
          PackA<kRowsKv>(sc, pa);
          for (int n = 1; n < n_tiles; ++n) {
            const int prev = s, prev_parity = (kv_iter >> 1) & 1;
            ++kv_iter;
            s = kv_iter & 1;
            BarWait(k_full + 8 * s, (kv_iter >> 1) & 1);
            BarWait(v_full + 8 * prev, prev_parity);
            TurnWait(p, my_turn);
            FenceRegs(pa);
            FenceRegs(o);
            WgFence();
            IssueS<D>(sc, q_rows, k_s + s * kTileBytes<D>);
            IssuePv<D>(o, pa, v_s + prev * kTileBytes<D>);
            TurnPass(p, other_turn);
            const int col0 = it.inner_begin + n * kRowsKv;
            if constexpr (kOverlapOwnPv) {
              WgWait1();
              FenceRegs(sc);
              if (release) BarArrive(k_empty + 8 * s);
              ScoresToProbs<A>(p, it, sc, it.tile_row + 64 * c, row0, col0, t, m, l, corr);
            }
            WgWait0();
            FenceRegs(o);
            FenceRegs(pa);
            FenceRegs(sc);
            if (release) {
              if constexpr (!kOverlapOwnPv) BarArrive(k_empty + 8 * s);
              BarArrive(v_empty + 8 * prev);
            }
            if constexpr (!kOverlapOwnPv) {
              ScoresToProbs<A>(p, it, sc, it.tile_row + 64 * c, row0, col0, t, m, l, corr);
            }
            if constexpr (A == kActSoftmax) {
#pragma unroll
              for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) o[dt][e] *= corr[e >> 1];
              }
            }
            PackA<kRowsKv>(sc, pa);
          }
          // The last tile's P V.
          BarWait(v_full + 8 * s, (kv_iter >> 1) & 1);
          TurnWait(p, my_turn);
          FenceRegs(pa);
          FenceRegs(o);
          WgFence();
          IssuePv<D>(o, pa, v_s + s * kTileBytes<D>);
          TurnPass(p, other_turn);
          WgWait0();
          FenceRegs(o);
          if (release) BarArrive(v_empty + 8 * s);
          ++kv_iter;
        }
        BarArrive(q_empty + 8 * qs);

        float mul[2] = {1.f, 1.f};
        FinishRows<A>(p, it, row0, t, m, l, mul);
        StoreRows<D>(p.o, o, it.q_start, row0, it.q_len, it.head, p.heads, mul);
      }
    }
  }
  // Warpgroup 1 passed the turn once more than warpgroup 0 took it.
  if (c == 0) TurnWait(p, my_turn);
}

template <int D, int A, bool kOverlapOwnPv>
int LaunchWgmma(const KernelParams& p, int sms, void* stream) {
  const int total = p.num_items * p.heads;
  if (total == 0) return 0;
  CUtensorMap q_map{}, k_map{}, v_map{};
  const bool tma = p.wgmma_tma && MakeTileMap(&q_map, p.q, p.q_rows, p.heads, D, kRowsQ) &&
                   MakeTileMap(&k_map, p.k, p.kv_rows, p.heads, D, kRowsKv) &&
                   MakeTileMap(&v_map, p.v, p.kv_rows, p.heads, D, kRowsKv);
  auto kernel = WgmmaForwardKernel<D, A, kOverlapOwnPv>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes<D>);
  if (e != cudaSuccess) return e;
  kernel<<<min(total, sms), kCtaThreads, kSmemBytes<D>, static_cast<cudaStream_t>(stream)>>>(
      p, q_map, k_map, v_map, tma);
  return cudaGetLastError();
}

}  // namespace

bool WgmmaForwardSupports(const KernelParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128) && !p.rope;
}

int LaunchJaggedForwardWgmma(const KernelParams& p, int sms, void* stream) {
  return DispatchKernel(p, [&](auto d, auto a) {
    constexpr int D = decltype(d)::value, A = decltype(a)::value;
    // SiLU and GELU overlap their activation with their own P V unless
    // switched off; softmax always does.
    if constexpr (A != kActSoftmax) {
      return p.wgmma_overlap ? LaunchWgmma<D, A, true>(p, sms, stream)
                             : LaunchWgmma<D, A, false>(p, sms, stream);
    } else {
      return LaunchWgmma<D, A, true>(p, sms, stream);
    }
  });
}

}  // namespace recfleet::attention::cuda_impl
