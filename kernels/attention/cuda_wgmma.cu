// Hopper forward of the jagged attention at head dim 64 or 128 (any activation,
// mask and bias): warpgroup MMA (wgmma) from shared memory, warp-specialized.
//
// The kernel is assembled from named pieces, chosen at compile time by a
// configuration struct (as FlashAttention-3, ThunderKittens and CuTe's
// collectives read):
//   FwdConfig      head dim, activation, tile shapes (128 x 128), ring depth,
//                  the consumer's schedule (kChain, kOverlapOwnPv) and the
//                  shared-memory layout; FwdSmem is that layout at run time.
//                  The mask and the bias are runtime parameters: each tile's
//                  class (tile_mask.h) picks the activation's path.
//   TileScheduler  persistent CTAs over the launcher's longest-first work
//                  items (cuda_wgmma.cuh, shared with the backward).
//   FwdProducer    warpgroup 2: Q, K and V tiles into their rings.
//   MainloopStep   one step of the consumers' main loop; FwdConsumer runs it
//                  in the configuration's schedule.
//   FwdEpilogue    the normalization, the log-sum-exp and the output store.
// The building blocks are in cuda_wgmma.cuh: CuTe's wgmma atoms and
// descriptor; TMA, cp.async, mbarriers and setmaxnreg as PTX (that header
// says why).
//
// A persistent CTA has three warpgroups. Warpgroup 2 is the producer: it
// streams the 128-row query tiles and 128-row K/V tiles of its work items
// into shared memory, by TMA (one thread, two bulk tensor copies a tile)
// where the tile lies inside its sequence and by cp.async with zero fill
// where it crosses the sequence end. Query tiles go through a two-stage
// ring of their own, K and V through two-stage rings with separate barriers
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
// ping-pong and intra-warpgroup overlap). An item may cover up to
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

// Rows of a query tile and of a K/V tile (FwdConfig's; the GEMM issue and
// the activation below are written for it).
constexpr int kFwdTileRows = 128;

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
  const TileClass cls = ClassOf(p, it.q_len, it.k_len, wg_row0, 64, col0, kFwdTileRows);
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
    // GELU and SiLU add the bias in a pass of its own, so that no visibility
    // flag lives from a bias load to its activation: in the chained loop
    // ptxas batched the 64 loads ahead and kept the flags as bits of two
    // registers, +170 instructions on every masked tile, bias or not.
    float s = p.scale;
    if (A != kActSoftmax && p.bias != nullptr) {
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, j = col0 + nt * 8 + 2 * t + (e & 1);
          float x = sc[nt][e] * p.scale;
          if (j >= lo[r] && j < hi[r]) x += BiasAt(p, it, row0 + 8 * r, j);
          sc[nt][e] = x;
        }
      }
      s = 1.f;
    }
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, j = col0 + nt * 8 + 2 * t + (e & 1);
        const bool vis = j >= lo[r] && j < hi[r];
        float x = sc[nt][e] * s;
        if (A == kActSoftmax && p.bias != nullptr && vis) x += BiasAt(p, it, row0 + 8 * r, j);
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
  GemmSS<D, kFwdTileRows, kFwdTileRows>(sc, q_rows, kb);
  WgCommit();
}

// O += P V for one K/V stage: P (64 x 128 keys) from registers, V from
// shared memory.
template <int D>
__device__ __forceinline__ void IssuePv(float (&o)[D / 8][4], const uint32_t (&pa)[8][4],
                                        uint32_t vb) {
  GemmRS<D, kFwdTileRows>(o, pa, vb);
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

// ---- Configuration. ----
// The forward's compile-time configuration: head dim, activation, tile
// shapes, ring depth, the consumer's schedule and the shared-memory layout.
// The mask and the bias stay runtime parameters: each tile's class
// (tile_mask.h) picks the masked or the unmasked activation path.
template <int kHeadDim, int kAct, bool kOverlap>
struct FwdConfig {
  static constexpr int D = kHeadDim;
  static constexpr int A = kAct;
  // S_n turns into P_n while this warpgroup's own P_{n-1} V_{n-1} still
  // runs (the one-tanh SiLU and GELU fit the registers beside the pinned O
  // and P_{n-1}; the earlier polynomial GELU spilled). Without it the
  // warpgroup waits for its P V first and overlaps only with the other
  // warpgroup's GEMMs.
  static constexpr bool kOverlapOwnPv = kOverlap;
  // The schedule (ConsumerMainloop). Chained (SiLU and GELU): the steps run
  // across query tiles and items, a query tile's last P V issued with the
  // next tile's S_0 and its O stored after that (KernelParams::wgmma_chain),
  // so short K/V ranges need no GEMM step of their own for the last P V:
  // +9.5% on the short-K/V cross shape for SiLU, none on causal SiLU.
  // Softmax keeps one query tile at a time (S_0 alone, S_n with
  // P_{n-1} V_{n-1}, the last P V alone), which measured 5% faster for it on
  // H200 (bench/RESULTS.md, attention).
  static constexpr bool kChain = A != kActSoftmax;
  static constexpr int kRowsQ = kFwdTileRows;   // query rows per tile, 64 per consumer
  static constexpr int kRowsKv = kFwdTileRows;  // keys per K/V tile
  static constexpr int kStages = 2;    // of each ring: Q, K and V
  static constexpr int kTileBytes = kRowsQ * D * 2;
  // Byte offsets from the 1024-aligned base: the Q, K and V rings, then the
  // barriers (full and empty of each ring, kStages each).
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kStages * kTileBytes;
  static constexpr int kV = kK + kStages * kTileBytes;
  static constexpr int kBars = kV + kStages * kTileBytes;
  static constexpr int kSmemBytes = kBars + 128 + 1024;
  static constexpr int kCtaThreads = 3 * kWgThreads;
  // Arrivals that complete a full barrier: the producer's 128 threads
  // (FillTile: one of them expects the TMA bytes, or all copy).
  static constexpr int kFullArrivals = kWgThreads;
  static_assert(kRowsQ == kRowsKv, "the query and K/V tiles share the tile size");
  static_assert(6 * kStages * 8 <= 128, "the barriers fit their 128 bytes");
};
static_assert(kForwardTileRows == 128, "the planner's forward tiles must be 128 rows");

// ---- Producer (warpgroup 2). ----
// Streams each work item's query tiles through the Q ring (the next item's
// Q loads while the current one computes, which matters for the short-K/V
// shapes with one or two K/V tiles per item) and its K/V tiles through the
// K and V rings, which have barriers of their own: K_n is free once S_n is
// done, V_n only after P_n V_n, which the consumers issue one step later.
// The query tiles of a grouped item share its K/V tiles, loaded once after
// its first query tile.
template <class C>
__device__ __forceinline__ void FwdProducer(const KernelParams& p, const FwdSmem<C>& sm,
                                            const CUtensorMap& q_map, const CUtensorMap& k_map,
                                            const CUtensorMap& v_map, bool tma, int tid,
                                            const TileScheduler& sched) {
  ProducerRegs();
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* k = static_cast<const bf16*>(p.k);
  const bf16* v = static_cast<const bf16*>(p.v);
  int kv_iter = 0, q_iter = 0;
  for (int w = sched.First(); sched.Valid(w); w = sched.Next(w)) {
    const WorkItem it = ItemAt(p, w);
    const int n_tiles = (it.inner_end - it.inner_begin + C::kRowsKv - 1) / C::kRowsKv;
    for (int j = 0; j < it.q_tiles; ++j, ++q_iter) {
      const RingPos<C::kStages> qp(q_iter);
      BarWait(sm.q_empty + 8 * qp.stage, qp.phase ^ 1);
      FillTile<C::D, C::kRowsQ>(sm.Tile(sm.q, qp.stage), &q_map, tma, q, it.q_start,
                                it.tile_row + j * C::kRowsQ, it.q_len, it.head, p.heads, tid,
                                sm.q_full + 8 * qp.stage);
      if (j > 0) continue;
      for (int n = 0; n < n_tiles; ++n, ++kv_iter) {
        const RingPos<C::kStages> kp(kv_iter);
        const int row0 = it.inner_begin + n * C::kRowsKv;
        BarWait(sm.k_empty + 8 * kp.stage, kp.phase ^ 1);
        FillTile<C::D, C::kRowsKv>(sm.Tile(sm.k, kp.stage), &k_map, tma, k, it.k_start, row0,
                                   it.k_len, it.head, p.heads, tid, sm.k_full + 8 * kp.stage);
        BarWait(sm.v_empty + 8 * kp.stage, kp.phase ^ 1);
        FillTile<C::D, C::kRowsKv>(sm.Tile(sm.v, kp.stage), &v_map, tma, v, it.k_start, row0,
                                   it.k_len, it.head, p.heads, tid, sm.v_full + 8 * kp.stage);
      }
    }
  }
}

// ---- Consumers (warpgroups 0 and 1). ----
// One consumer warpgroup's registers: its 64 query rows' output, the
// current scores (then probabilities), the previous step's probabilities as
// bf16 A fragments, and the softmax's running max and sum per row.
template <class C>
struct FwdRegs {
  float o[C::D / 8][4];
  float sc[16][4];
  uint32_t pa[8][4];
  float m[2], l[2], corr[2];
};

// What one main-loop step touches, as its schedule plans it: S_n's K stage
// (Real: S reads a K/V tile; else the query tile, and its result is
// unused), the pending P V's V stage (Pv: one is pending; else it reads the
// query tile into an O that is discarded), and which stages the step
// releases. TileStep is the one-query-tile schedule's plan: every S and P V
// is real. ChainStep is the chained schedule's, whose pending P V lives
// across tiles packed into one register (next to O, P and S); its flags are
// decoded where they are used, so that they occupy no registers across the
// activation.
struct TileStep {
  int k_stage, k_phase, v_stage, v_phase, q_stage, col0;
  bool release_k, release_v;
  __device__ bool Real() const { return true; }
  __device__ bool Pv() const { return true; }
  __device__ int VStage() const { return v_stage; }
  __device__ int VPhase() const { return v_phase; }
  __device__ bool ReleaseV() const { return release_v; }
  // The query tile is released after the tile's last step (in FwdConsumer).
  __device__ bool ReleaseQ() const { return false; }
};
struct ChainStep {
  static constexpr int kPending = 1, kRelease = 2, kStage = 4, kParity = 8;
  int n, n_tiles, steps, pv;
  int k_stage, k_phase, q_stage, col0;
  bool release_k;
  __device__ bool Real() const { return n < n_tiles; }
  __device__ bool Pv() const { return pv & kPending; }
  __device__ int VStage() const { return (pv & kStage) != 0; }
  __device__ int VPhase() const { return (pv & kParity) != 0; }
  __device__ bool ReleaseV() const { return pv & kRelease; }
  __device__ bool ReleaseQ() const { return n + 1 == steps; }
  // The P V this step leaves pending (none if S_n was not real).
  __device__ int NextPv() const {
    return Real() ? kPending | (release_k ? kRelease : 0) | (k_stage ? kStage : 0) |
                        (k_phase ? kParity : 0)
                  : 0;
  }
};

// The position of a consumer's rows: the query tile's rows in shared
// memory, this warpgroup's first row, this thread's first row (the second
// is 8 on), its quad lane, and the turn barriers.
struct FwdRows {
  uint32_t q_tile, q_rows;
  int wg_row0, row0, t;
  int my_turn, other_turn;
};

// One step of the consumer main loop (FlashAttention-3's intra-warpgroup
// overlap). In its turn the warpgroup issues S_n = Q K_n^T (kS) and
// O += P_{n-1} V_{n-1} (kPv) back to back and passes the turn, so that its
// activation runs while the other warpgroup's GEMMs keep the tensor cores
// busy; then S_n becomes P_n (beside its own P V with kOverlapOwnPv), the
// finished stages are released, and P_n is packed for the next step. One
// code path with no branch around any wgmma: two would merge versions of
// O's registers with moves, and ptxas would serialize the wgmma pipeline
// (C7520) and spill.
template <class C, bool kS, bool kPv, class Step>
__device__ __forceinline__ void MainloopStep(const KernelParams& p, const WorkItem& it,
                                             const FwdSmem<C>& sm, FwdRegs<C>& r,
                                             const FwdRows& at, const Step& st) {
  if (kS && st.Real()) BarWait(sm.k_full + 8 * st.k_stage, st.k_phase);
  if (kPv && st.Pv()) BarWait(sm.v_full + 8 * st.VStage(), st.VPhase());
  const uint32_t kb = st.Real() ? sm.Tile(sm.k, st.k_stage) : at.q_tile;
  const uint32_t vb = st.Pv() ? sm.Tile(sm.v, st.VStage()) : at.q_tile;
  TurnWait(p, at.my_turn);
  if constexpr (kPv) {
    FenceRegs(r.pa);
    FenceRegs(r.o);
  }
  WgFence();
  if constexpr (kS) IssueS<C::D>(r.sc, at.q_rows, kb);
  if constexpr (kPv) IssuePv<C::D>(r.o, r.pa, vb);
  TurnPass(p, at.other_turn);
  auto probs = [&] {
    if (st.Real()) {
      if (st.release_k) BarArrive(sm.k_empty + 8 * st.k_stage);
      ScoresToProbs<C::A>(p, it, r.sc, at.wg_row0, at.row0, st.col0, at.t, r.m, r.l, r.corr);
    }
  };
  constexpr bool kEarly = kS && kPv && C::kOverlapOwnPv;
  if constexpr (kEarly) {
    WgWait1();
    FenceRegs(r.sc);
    probs();
  }
  WgWait0();
  if constexpr (kPv) {
    FenceRegs(r.o);
    FenceRegs(r.pa);
  }
  if constexpr (kS) FenceRegs(r.sc);
  if (st.ReleaseQ()) BarArrive(sm.q_empty + 8 * st.q_stage);
  if (kPv && st.Pv() && st.ReleaseV()) BarArrive(sm.v_empty + 8 * st.VStage());
  if constexpr (kS) {
    if constexpr (!kEarly) probs();
    if constexpr (kPv && C::A == kActSoftmax) {
      if (st.Real()) {
#pragma unroll
        for (int dt = 0; dt < C::D / 8; ++dt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) r.o[dt][e] *= r.corr[e >> 1];
        }
      }
    }
    if (st.Real()) PackA<C::kRowsKv>(r.sc, r.pa);
  }
}

// ---- Epilogue. ----
// A query tile's normalization (softmax: 1 / sum per row, and the
// log-sum-exp written by the quad's first thread) and its output rows
// (scaled, bf16). The one-tile schedule does both at once (StoreNow); the
// chained one keeps where this thread's two rows go (Prepare) and stores
// them one step later (Store).
template <class C>
struct FwdEpilogue {
  bf16* row = nullptr;
  int rows = 0;
  float mul[2] = {1.f, 1.f};
  __device__ void Prepare(const KernelParams& p, const WorkItem& it, int row0, int t,
                          const float (&m)[2], const float (&l)[2]) {
    row = static_cast<bf16*>(p.o) + ((it.q_start + row0) * p.heads + it.head) * C::D + 2 * t;
    rows = (row0 < it.q_len) + (row0 + 8 < it.q_len);
    FinishRows<C::A>(p, it, row0, t, m, l, mul);
  }
  __device__ void Store(const KernelParams& p, const float (&o)[C::D / 8][4]) const {
    StoreOut<C::D>(o, row, rows, p.heads, mul);
  }
  // The one-tile schedule's epilogue: normalization and store at once.
  __device__ void StoreNow(const KernelParams& p, const WorkItem& it, int row0, int t,
                           const float (&m)[2], const float (&l)[2],
                           const float (&o)[C::D / 8][4]) {
    FinishRows<C::A>(p, it, row0, t, m, l, mul);
    StoreRows<C::D>(p.o, o, it.q_start, row0, it.q_len, it.head, p.heads, mul);
  }
};

template <int D>
__device__ __forceinline__ void ZeroOut(float (&o)[D / 8][4]) {
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.f;
  }
}

// A consumer warpgroup (c: query rows [64 c, 64 c + 64) of each tile): the
// scheduler's items, each query tile through the main loop (MainloopStep
// in the configuration's schedule), then the epilogue.
template <class C>
__device__ __forceinline__ void FwdConsumer(const KernelParams& p, const FwdSmem<C>& sm, int c,
                                            int tid, const TileScheduler& sched) {
  ConsumerRegs();
  FwdRows at{};
  at.my_turn = 1 + c;
  at.other_turn = 2 - c;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2;
  at.t = lane & 3;
  const int row_in_tile = c * 64 + warp * 16 + g;  // and + 8
  if (c == 1) TurnPass(p, 1);  // warpgroup 0 issues first
  FwdRegs<C> r;
  ZeroOut<C::D>(r.o);
  if constexpr (C::kChain) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) r.pa[i][e] = 0u;
    }
  }
  FwdEpilogue<C> epi;
  // Chained: the P V not yet issued (ChainStep::pv: P in pa, V's stage and
  // full-barrier parity, whether it releases V); epi holds where the query
  // tile it completes goes.
  int pv = 0;
  int kv_iter = 0, q_iter = 0;
  for (int w = sched.First(); sched.Valid(w); w = sched.Next(w)) {
    WorkItem it = ItemAt(p, w);
    const int n_tiles = (it.inner_end - it.inner_begin + C::kRowsKv - 1) / C::kRowsKv;
    // Chained: whether the query tile after this item's last one has K/V
    // tiles, so that the last P V can wait for its S_0.
    bool next_has_tiles = false;
    if constexpr (C::kChain) {
      if (p.wgmma_chain && sched.Valid(sched.Next(w))) {
        const WorkItem& nx = p.items[sched.Next(w) / p.heads];
        next_has_tiles = nx.inner_end > nx.inner_begin;
      }
    }
    // The query tiles of a grouped item share its resident K/V tiles (their
    // full barriers stay complete), which only the last one releases.
    const int kv_first = kv_iter;
    for (int j = 0; j < it.q_tiles; ++j, ++q_iter, it.tile_row += C::kRowsQ) {
      const bool release = j + 1 == it.q_tiles;
      kv_iter = kv_first;
      const int row0 = it.tile_row + row_in_tile;
      at.row0 = row0;
      at.wg_row0 = it.tile_row + 64 * c;
      r.m[0] = r.m[1] = -INFINITY;
      r.l[0] = r.l[1] = 0.f;
      const RingPos<C::kStages> qp(q_iter);
      BarWait(sm.q_full + 8 * qp.stage, qp.phase);
      at.q_tile = sm.Tile(sm.q, qp.stage);
      at.q_rows = at.q_tile + c * 64 * 128;  // this warpgroup's rows
      if constexpr (C::kChain) {
        // The tile's last P V waits for the next query tile's S_0 if that has
        // K/V tiles; otherwise a last step issues it (with S on the query
        // tile itself, discarded). Without one pending (n = 0 after a tile
        // that flushed), the step still issues a P V, on the query tile,
        // whose result n = 0 discards.
        const bool flush = n_tiles > 0 && !(j + 1 < it.q_tiles ? p.wgmma_chain : next_has_tiles);
        ChainStep st;
        st.n_tiles = n_tiles;
        st.steps = n_tiles + flush;
        st.q_stage = qp.stage;
        st.release_k = release;
        for (st.n = 0; st.n < st.steps; ++st.n) {
          const RingPos<C::kStages> kp(kv_iter);
          st.pv = pv;
          st.k_stage = kp.stage;
          st.k_phase = kp.phase;
          st.col0 = it.inner_begin + st.n * C::kRowsKv;
          MainloopStep<C, true, true>(p, it, sm, r, at, st);
          if (st.n == 0) {
            // The previous query tile's O is complete (if its last P V
            // waited). Pinned here, so that its conversion is not hoisted into
            // the activation above (where it would hold 32 more registers).
            FenceRegs(r.pa);
            FenceRegs(r.o);
            if (st.Pv()) epi.Store(p, r.o);
            ZeroOut<C::D>(r.o);
          }
          pv = st.NextPv();
          if (st.Real()) ++kv_iter;
        }
        if (n_tiles == 0) BarArrive(sm.q_empty + 8 * qp.stage);
        epi.Prepare(p, it, row0, at.t, r.m, r.l);
        // O is complete unless its last P V is pending (zero if no K/V).
        if (pv == 0) {
          epi.Store(p, r.o);
          ZeroOut<C::D>(r.o);
        }
      } else {
        ZeroOut<C::D>(r.o);
        if (n_tiles > 0) {
          TileStep st{};
          st.q_stage = qp.stage;
          st.release_k = st.release_v = release;
          RingPos<C::kStages> kp(kv_iter);
          st.k_stage = kp.stage;
          st.k_phase = kp.phase;
          st.col0 = it.inner_begin;
          MainloopStep<C, true, false>(p, it, sm, r, at, st);
          for (int n = 1; n < n_tiles; ++n) {
            st.v_stage = kp.stage;
            st.v_phase = kp.phase;
            kp = RingPos<C::kStages>(++kv_iter);
            st.k_stage = kp.stage;
            st.k_phase = kp.phase;
            st.col0 = it.inner_begin + n * C::kRowsKv;
            MainloopStep<C, true, true>(p, it, sm, r, at, st);
          }
          st.v_stage = kp.stage;
          st.v_phase = kp.phase;
          MainloopStep<C, false, true>(p, it, sm, r, at, st);
          ++kv_iter;
        }
        BarArrive(sm.q_empty + 8 * qp.stage);
        epi.StoreNow(p, it, row0, at.t, r.m, r.l, r.o);
      }
    }
  }
  // Warpgroup 1 passed the turn once more than warpgroup 0 took it.
  if (c == 0) TurnWait(p, at.my_turn);
}

// The kernel: three warpgroups of a persistent CTA, warpgroup 2 the
// producer, 0 and 1 the consumers.
template <class C>
__global__ void __launch_bounds__(C::kCtaThreads, 1)
    WgmmaForwardKernel(const KernelParams p, const __grid_constant__ CUtensorMap q_map,
                       const __grid_constant__ CUtensorMap k_map,
                       const __grid_constant__ CUtensorMap v_map, bool tma) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const FwdSmem<C> sm((raw + 1023) & ~1023u);
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const TileScheduler sched(p);
  if (threadIdx.x == 0) sm.Init();
  __syncthreads();
  if (wg == 2) {
    FwdProducer<C>(p, sm, q_map, k_map, v_map, tma, tid, sched);
  } else {
    FwdConsumer<C>(p, sm, wg, tid, sched);
  }
}

template <class C>
int LaunchForward(const KernelParams& p, int sms, void* stream) {
  if (p.num_items * p.heads == 0) return 0;
  CUtensorMap q_map{}, k_map{}, v_map{};
  const bool tma = p.wgmma_tma && MakeTileMap(&q_map, p.q, p.q_rows, p.heads, C::D, C::kRowsQ) &&
                   MakeTileMap(&k_map, p.k, p.kv_rows, p.heads, C::D, C::kRowsKv) &&
                   MakeTileMap(&v_map, p.v, p.kv_rows, p.heads, C::D, C::kRowsKv);
  auto kernel = WgmmaForwardKernel<C>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<TileScheduler::Grid(p, sms), C::kCtaThreads, C::kSmemBytes,
           static_cast<cudaStream_t>(stream)>>>(p, q_map, k_map, v_map, tma);
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
      return p.wgmma_overlap ? LaunchForward<FwdConfig<D, A, true>>(p, sms, stream)
                             : LaunchForward<FwdConfig<D, A, false>>(p, sms, stream);
    } else {
      return LaunchForward<FwdConfig<D, A, true>>(p, sms, stream);
    }
  });
}

}  // namespace recfleet::attention::cuda_impl
