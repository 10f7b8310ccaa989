// Hopper FP8 (e4m3) backward of the jagged softmax attention at head dim
// 128: the quantize pre-pass (LaunchFp8BackwardQuantize) and two
// warp-specialized persistent passes shaped like the bf16 ones
// (cuda_wgmma_bwd.cu), every GEMM on e4m3 operands with fp32 accumulation.
//
// A CTA owns a 128-row stationary tile pair (X, Y) of one (sequence, head)
// and streams the 64-row (dK/dV pass) or 128-row (dQ pass; 64 with
// RECFLEET_ATTENTION_FP8_DQ_KEYS=64) tiles of the other side that see it:
//   dK/dV pass: X = K, Y = V, A = Q, B = dO (items: 128-key tiles);
//   dQ pass:    X = Q, Y = dO, A = K (items: the forward's query tiles).
// Per streamed tile a consumer warpgroup (64 stationary rows) computes
//   T1 = X A^T, T2 = Y B^T            (both operands K-major over d)
// which are S and dP (dQ pass) or their transposes (dK/dV pass) up to
// per-token scales; P and dS in registers from the saved log-sum-exp and
// rowsum(dO * O); then
//   dK += dS^T Q, dV += P^T dO   or   dQ += dS K
// with P and dS as e4m3 A fragments from the accumulator (PackP) and the
// streamed side read as X^T tiles (Q^T, dO^T, K^T: the pre-pass's
// transposed, token-permuted copies, cuda_fp8.cuh), since e4m3 wgmma reads
// both shared-memory operands K-major.
//
// Scales (all powers of two, so every dequantization is exact):
//   T1: Q per token with K's channel scales folded in, K per channel (the
//     forward's scheme): S = T1 * q_scale[token].
//   T2: dO per token with V's channel scales folded in, V per channel:
//     dP = T2 * do_scale[token].
//   P: P * 256 in [0, 256] (a fixed scale; e4m3's largest value is 448).
//   D = rowsum(dO * O) from the same e4m3 dO and O quantized with V's
//     channel scales (the pre-pass), so that dS = P (dP - D) sees the same
//     roundings in dP and D: a sequence of one key gets dS = 0 as it should
//     (with D from the bf16 tensors it got dP's rounding error instead), and
//     the part of dP's error that the row's keys share cancels.
//   dS: per stationary row, a lazy scale u (Fp8Scale of the row's largest
//     |dS| so far): it only grows, and when it does the row's accumulator
//     is multiplied by the exact ratio, so dS / u never passes 448 and no
//     pre-pass over dS is needed (the float64 emulation,
//     fp8_backward_emulation_test, measured this against scales known in
//     advance: no difference).
//   Q^T, dO^T, K^T per channel: applied to the output columns in the
//     epilogue with u (dK, dQ) or 1 / 256 (dV).
// Streamed tiles start at a multiple of 32 tokens of the whole tensor (X^T's
// permuted blocks and the TMA box's 16-byte alignment need it), up to 31
// rows before the item's first streamed row; those rows and rows past the
// sequence end belong to neighbours (or are zero-filled by TMA past the
// tensor) and are masked like invisible pairs.

#include <cmath>
#include <cstdint>

#include "kernels/attention/cuda_fp8.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

// ---- Pre-pass. ----
// Each of Q, dO and K is read once: a block loads 128 tokens x one head's
// 128 channels in QuantizeTransposedBlock's layout (cuda_fp8.cuh), stores
// the transposed codes (Q^T, dO^T, K^T) and, from the same registers, the
// row-major codes through shared memory as whole 128-byte rows. K's
// row-major codes are its transposed ones (the same channel scales); Q's
// and dO's take QuantizeTokensBlock's per-token scale, from the maximum over
// the head's 128 channels gathered across the eight warps. dO's row dot
// sums each 8-channel chunk in order, then the 16 chunks pairwise 8 apart,
// 4, 2 and 1 (the order of the half-warp shuffles it replaced). V (no
// transposed copy) takes QuantizeChannelsBlock.

// Eight e4m3 codes (two words, channel order) as floats, exactly.
__device__ __forceinline__ void E4m3x8(uint32_t lo, uint32_t hi, float (&f)[8]) {
  const uint32_t wd[2] = {lo, hi};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(wd[i] >> (16 * h)), __NV_E4M3);
      const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&r));
      f[4 * i + 2 * h] = x.x;
      f[4 * i + 2 * h + 1] = x.y;
    }
  }
}

enum class RowCodes { kChannels, kTokens, kTokensDot };

struct PrepassShared {
  float part[8][128];     // [warp][token]: the warp's 16 channels' maximum
  float dot[16][128];     // [8-channel chunk][token]: the chunk's row dot
  float token_scale[128];
  uint4 codes[128][8];    // row-major codes, 16-byte chunks swizzled (CodeChunk)
};

// The shared-memory chunk of row-major chunk c (a warp's 16 channels) of
// block token r: the eight lanes of one store phase hold tokens
// 16 h + 2 t (+ 1, + 8, + 9), which this spreads over the eight chunks.
__device__ __forceinline__ int CodeChunk(int r, int c) {
  return c ^ (((r >> 1) & 3) | ((r >> 2) & 4));
}

template <RowCodes kRowCodes>
__device__ __forceinline__ void QuantizeBothWaysBlock(
    const bf16* x, int64_t rows, int heads, const float* xt_scale, uint8_t* xt8, int64_t xt_cols,
    const float* row_scale, uint8_t* x8, int64_t b, PrepassShared& sh,
    float* token_scale = nullptr, const bf16* y = nullptr, float* dot = nullptr) {
  const TransposedLayout l(heads, b);
  const int warp = threadIdx.x / 32;
  uint4 raw[4][2], raw_y[4][2];
  LoadTransposedTile(x, rows, heads, l, raw);
  if constexpr (kRowCodes == RowCodes::kTokensDot) LoadTransposedTile(y, rows, heads, l, raw_y);
  uint32_t w[4][4];
  ChannelCodes(raw, xt_scale, l.c0, w);
  StoreTransposedCodes(w, xt8, xt_cols, l);
  if constexpr (kRowCodes == RowCodes::kChannels) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      sh.codes[l.token[u]][CodeChunk(l.token[u], warp)] =
          make_uint4(w[0][u], w[1][u], w[2][u], w[3][u]);
    }
  } else {
    // O's codes under V's channel scales (the row dot's second operand),
    // one byte each, so that O's registers free early.
    uint32_t y8[4][4];
    if constexpr (kRowCodes == RowCodes::kTokensDot) ChannelCodes(raw_y, row_scale, l.c0, y8);
    float fold[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 s = reinterpret_cast<const float4*>(row_scale + l.c0)[j];
      fold[4 * j] = s.x, fold[4 * j + 1] = s.y, fold[4 * j + 2] = s.z, fold[4 * j + 3] = s.w;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float m = 0.f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float f[8];
        Bf16x8(raw[u][j], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(f[i] * fold[8 * j + i]));
      }
      sh.part[warp][l.token[u]] = m;
    }
    __syncthreads();
    if (threadIdx.x < 128) {
      float m = sh.part[0][threadIdx.x];
#pragma unroll
      for (int i = 1; i < 8; ++i) m = fmaxf(m, sh.part[i][threadIdx.x]);
      const float s = Fp8Scale(m);
      sh.token_scale[threadIdx.x] = s;
      const int64_t r = l.key0 + threadIdx.x;
      if (r < rows) token_scale[r * heads + l.head] = s;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float inv = InversePow2(sh.token_scale[l.token[u]]);
      uint32_t code[4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float f[8];
        Bf16x8(raw[u][j], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) f[i] *= fold[8 * j + i];
        code[2 * j] = E4m3x2(f[0] * inv, f[1] * inv) | (E4m3x2(f[2] * inv, f[3] * inv) << 16);
        code[2 * j + 1] = E4m3x2(f[4] * inv, f[5] * inv) | (E4m3x2(f[6] * inv, f[7] * inv) << 16);
        if constexpr (kRowCodes == RowCodes::kTokensDot) {
          float yf[8];
          E4m3x8(y8[2 * j][u], y8[2 * j + 1][u], yf);
          float d = 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) d += E4m3Round(f[i] * inv) * yf[i];
          sh.dot[2 * warp + j][l.token[u]] = d;
        }
      }
      sh.codes[l.token[u]][CodeChunk(l.token[u], warp)] =
          make_uint4(code[0], code[1], code[2], code[3]);
    }
    if constexpr (kRowCodes == RowCodes::kTokensDot) {
      __syncthreads();
      const int64_t r = l.key0 + threadIdx.x;
      if (threadIdx.x < 128 && r < rows) {
        // The chunks pairwise 8 apart, then 4, 2, 1 (see the section
        // comment).
        float d[16];
#pragma unroll
        for (int c = 0; c < 16; ++c) d[c] = sh.dot[c][threadIdx.x];
#pragma unroll
        for (int c = 0; c < 8; ++c) d[c] += d[c + 8];
#pragma unroll
        for (int c = 0; c < 4; ++c) d[c] += d[c + 4];
        d[0] += d[2], d[1] += d[3];
        dot[r * heads + l.head] = (d[0] + d[1]) * sh.token_scale[threadIdx.x];
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = threadIdx.x + 256 * i, r = idx / 8, c = idx % 8;
    if (l.key0 + r < rows) {
      reinterpret_cast<uint4*>(x8 + ((l.key0 + r) * heads + l.head) * 128)[c] =
          sh.codes[r][CodeChunk(r, c)];
    }
  }
}

// The pre-pass's launches, one per section, so that each takes its own
// registers: Q and dO blocks hold their tile across the barriers (128
// registers, two blocks per SM; capped for three they spill, and dO's ran
// slower), K and V blocks do not (64, four). kKv: blocks [0, k_blocks) K's,
// then V's.
enum class PrepassSection { kQ, kDout, kKv };

template <PrepassSection kSection, int kMinBlocks>
__global__ void __launch_bounds__(256, kMinBlocks)
    Fp8BackwardQuantizeKernel(const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                              const bf16* out, int64_t q_rows, int64_t kv_rows, int heads,
                              int64_t k_blocks, Fp8BackwardOperands ops) {
  __shared__ PrepassShared sh;
  const int64_t b = blockIdx.x;
  if constexpr (kSection == PrepassSection::kQ) {
    QuantizeBothWaysBlock<RowCodes::kTokens>(
        q, q_rows, heads, ops.qt_scale, static_cast<uint8_t*>(ops.qt8), ops.q_cols, ops.k_scale,
        static_cast<uint8_t*>(ops.q8), b, sh, ops.q_scale);
  } else if constexpr (kSection == PrepassSection::kDout) {
    QuantizeBothWaysBlock<RowCodes::kTokensDot>(
        dout, q_rows, heads, ops.dot_scale, static_cast<uint8_t*>(ops.dot8), ops.q_cols,
        ops.v_scale, static_cast<uint8_t*>(ops.do8), b, sh, ops.do_scale, out, ops.dsum);
  } else if (b < k_blocks) {
    QuantizeBothWaysBlock<RowCodes::kChannels>(
        k, kv_rows, heads, ops.k_scale, static_cast<uint8_t*>(ops.kt8), ops.kv_cols, ops.k_scale,
        static_cast<uint8_t*>(ops.k8), b, sh);
  } else {
    QuantizeChannelsBlock(v, kv_rows, heads, ops.v_scale, static_cast<uint8_t*>(ops.v8),
                          b - k_blocks);
  }
}

// ---- Configuration and shared memory. ----
// kStreamRows: rows of a streamed tile, 64, or 128 for the dQ pass (whose
// consumers hold one accumulator fewer than the dK/dV pass's).
template <bool kKeysStationary, int kStreamRows = 64>
struct Fp8BwdConfig {
  static constexpr int D = 128;
  static constexpr bool kDkDv = kKeysStationary;
  static constexpr int kStatRows = 128;  // 64 per consumer warpgroup
  static constexpr int R = kStreamRows;
  static_assert(R == 64 || (R == 128 && !kDkDv), "streamed tile rows");
  static constexpr int kStages = 3;
  static constexpr int kStatBufs = 2;  // the next item's pair loads during this one
  static constexpr int kStatBytes = kStatRows * D;  // one byte an element
  static constexpr int kTileBytes = R * D;          // A, B, A^T, B^T alike
  static constexpr int kStreamTiles = kDkDv ? 4 : 3;  // A, B, A^T (, B^T)
  static constexpr int kStageBytes = kStreamTiles * kTileBytes;
  // dK/dV pass: the streamed queries' statistics per stage, [4][R] floats:
  // log2(e) * scale * q_scale, lse2 - 8, do_scale, rowsum(dO * O).
  static constexpr int kStatFloats = kDkDv ? 4 * R : 0;
  static constexpr int kX = 0;
  static constexpr int kY = kStatBytes;
  static constexpr int kStatPairBytes = 2 * kStatBytes;
  static constexpr int kStream = kStatBufs * kStatPairBytes;
  static constexpr int kStats = kStream + kStages * kStageBytes;
  static constexpr int kBars = kStats + kStages * kStatFloats * 4;
  static constexpr int kNumBars = 2 * kStatBufs + 2 * kStages;
  static constexpr int kSmemBytes = kBars + 8 * kNumBars + 1024;
  static constexpr int kCtaThreads = 3 * kWgThreads;
  static constexpr int kTokenAlign = 32;
  // Arrivals on a stage's full barrier: the TMA thread (with the bytes) and,
  // in the dK/dV pass, the other statistics writers.
  static constexpr int kFullArrivals = kDkDv ? R : 1;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kStream % 1024 == 0 && kTileBytes % 1024 == 0, "swizzled tiles are 1024-aligned");
};
static_assert(kForwardTileRows == 128 && kWideKeyTileRows == 128, "128-row stationary tiles");

template <class C>
struct Fp8BwdSmem {
  uint32_t x, stream, stat_full, stat_empty, full, empty;
  float* stats;
  __device__ Fp8BwdSmem(unsigned char* smem_raw) {
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw + 1023) & ~1023u;
    stats = reinterpret_cast<float*>(smem_raw + (base - raw) + C::kStats);
    x = base + C::kX;
    stream = base + C::kStream;
    stat_full = base + C::kBars;
    stat_empty = stat_full + 8 * C::kStatBufs;
    full = stat_empty + 8 * C::kStatBufs;
    empty = full + 8 * C::kStages;
  }
  // Stationary buffer b: X, then Y.
  __device__ uint32_t X(int b) const { return x + b * C::kStatPairBytes; }
  __device__ uint32_t Y(int b) const { return X(b) + C::kY; }
  // Streamed tile i (0 A, 1 B, 2 A^T, 3 B^T) of stage s.
  __device__ uint32_t Tile(int s, int i) const {
    return stream + s * C::kStageBytes + i * C::kTileBytes;
  }
  __device__ float* Stats(int s) const { return stats + s * C::kStatFloats; }
  __device__ void Init() const {
    for (int b = 0; b < C::kStatBufs; ++b) {
      BarInit(stat_full + 8 * b, 1);
      BarInit(stat_empty + 8 * b, 2 * kWgThreads);
    }
    for (int s = 0; s < C::kStages; ++s) {
      BarInit(full + 8 * s, C::kFullArrivals);
      BarInit(empty + 8 * s, 2 * kWgThreads);
    }
    BarInitDone();
  }
};

// An item's streamed tiles: `count` tiles of R rows from row `first` of the
// sequence (first <= inner_begin, possibly negative) with a_start + first a
// multiple of kTokenAlign; none when the item sees nothing.
struct StreamTiles {
  int first, count;
};
template <class C>
__device__ __forceinline__ StreamTiles ItemStreamTiles(const WorkItem& it) {
  if (it.inner_end <= it.inner_begin) return {it.inner_begin, 0};
  const int64_t a_start = C::kDkDv ? it.q_start : it.k_start;
  const int first =
      it.inner_begin - static_cast<int>((a_start + it.inner_begin) % C::kTokenAlign);
  return {first, (it.inner_end - first + C::R - 1) / C::R};
}

// The class of a consumer's 64 stationary rows (from wg_row0) against the
// streamed tile at col0 (tile_mask.h): rows before the sequence start see
// nothing, so a tile reaching before it is at most partial.
template <class C>
__device__ __forceinline__ TileClass StreamClass(const KernelParams& p, const WorkItem& it,
                                                 int wg_row0, int col0) {
  const int j0 = col0 < 0 ? 0 : col0, n = col0 + C::R - j0;
  const TileClass c = C::kDkDv ? ClassOf(p, it.q_len, it.k_len, j0, n, wg_row0, 64)
                               : ClassOf(p, it.q_len, it.k_len, wg_row0, 64, j0, n);
  return col0 < 0 && c == kTileFull ? kTilePartial : c;
}

struct Fp8BwdMaps {
  CUtensorMap x, y, a, b, at, bt;
};

// ---- Producer (warpgroup 2): thread 0 issues every copy; in the dK/dV
// pass threads 0..63 also write the streamed queries' statistics. ----
template <class C>
__device__ __forceinline__ void Fp8BwdProducer(const KernelParams& p,
                                               const Fp8BackwardOperands& ops,
                                               const Fp8BwdSmem<C>& sm, const Fp8BwdMaps& maps,
                                               int tid, const TileScheduler& sched) {
  constexpr int R = C::R;
  ProducerRegs();
  if (tid >= C::kFullArrivals) return;
  const float c1_scale = p.scale * kLog2e;
  int iter = 0, item = 0;
  for (int w = sched.First(); sched.Valid(w); w = sched.Next(w), ++item) {
    const WorkItem it = ItemAt(p, w);
    const int64_t x_start = C::kDkDv ? it.k_start : it.q_start;
    const int64_t a_start = C::kDkDv ? it.q_start : it.k_start;
    const int sb = item & 1, sphase = (item >> 1) & 1;
    if (tid == 0) {
      BarWait(sm.stat_empty + 8 * sb, sphase ^ 1);
      ExpectTile<2 * C::kStatBytes>(sm.stat_full + 8 * sb);
      const int row = static_cast<int>(x_start + it.tile_row);
      TmaLoadBlock(sm.X(sb), &maps.x, 0, it.head, row, sm.stat_full + 8 * sb);
      TmaLoadBlock(sm.Y(sb), &maps.y, 0, it.head, row, sm.stat_full + 8 * sb);
    }
    const StreamTiles st = ItemStreamTiles<C>(it);
    for (int n = 0; n < st.count; ++n, ++iter) {
      const RingPos<C::kStages> rp(iter);
      const int s = rp.stage;
      const int col0 = st.first + n * R;
      BarWait(sm.empty + 8 * s, rp.phase ^ 1);
      if constexpr (C::kDkDv) {
        const int i = col0 + tid;
        float c1 = 0.f, l2 = 0.f, c2 = 0.f, dsum = 0.f;
        if (i >= 0 && i < it.q_len) {
          const int64_t rh = (it.q_start + i) * p.heads + it.head;
          c1 = c1_scale * ops.q_scale[rh];
          l2 = Lse2(p, rh) - 8.f;
          c2 = ops.do_scale[rh];
          dsum = ops.dsum[rh];
        }
        float* stats = sm.Stats(s);
        stats[tid] = c1;
        stats[R + tid] = l2;
        stats[2 * R + tid] = c2;
        stats[3 * R + tid] = dsum;
      }
      if (tid == 0) {
        const uint32_t bar = sm.full + 8 * s;
        ExpectTile<C::kStageBytes>(bar);
        const int row = static_cast<int>(a_start + col0);
        TmaLoadBlock(sm.Tile(s, 0), &maps.a, 0, it.head, row, bar);
        TmaLoadBlock(sm.Tile(s, 1), &maps.b, 0, it.head, row, bar);
        TmaLoad2d(sm.Tile(s, 2), &maps.at, row, it.head * C::D, bar);
        if constexpr (C::kDkDv) TmaLoad2d(sm.Tile(s, 3), &maps.bt, row, it.head * C::D, bar);
      } else {
        BarArrive(sm.full + 8 * s);
      }
    }
  }
}

// ---- Consumers. ----
// acc[64 x 128] += F[64 x R streamed] (e4m3 A fragments) T[128 x R]^T, T an
// X^T tile: 64-byte swizzled (R = 64) or 128-byte swizzled (R = 128); R / 32
// k32 steps.
template <int R>
__device__ __forceinline__ void GemmFp8RsT(float (&acc)[16][4], const uint32_t (&f)[R / 32][4],
                                           uint32_t t) {
#pragma unroll
  for (int kk = 0; kk < R / 32; ++kk) {
    const uint64_t b = R == 64 ? Desc64(t + kk * 32) : Desc(t + kk * 32, 16, 1024);
    detail::FmaRS<GMMA::MMA_64x128x32_F32E4M3E4M3_RS_TN<>, 128>(acc, f[kk], b,
                                                                 std::make_index_sequence<64>{});
  }
}

// A thread's per-row (dQ pass) or per-column (dK/dV pass, from shared
// memory) softmax-backward statistics: c1 = log2(e) * scale * q_scale,
// l2 = lse2 - 8, c2 = do_scale, ds = rowsum(dO * O).
struct Fp8RowStats {
  float c1[2], l2[2], c2[2], ds[2];
};

// P * 256 = exp2(T1 c1 - l2) into t1 (zero where invisible).
template <bool kDkDv, bool kFull, int NT>
__device__ __forceinline__ void Fp8BwdP(float (&t1)[NT][4], int col0, int t, const int (&lo)[2],
                                        const int (&hi)[2], const Fp8RowStats& rs,
                                        const float* stats) {
  constexpr int R = 8 * NT;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float2 c1c = {0.f, 0.f}, l2c = {0.f, 0.f};
    if constexpr (kDkDv) {
      c1c = *reinterpret_cast<const float2*>(stats + nt * 8 + 2 * t);
      l2c = *reinterpret_cast<const float2*>(stats + R + nt * 8 + 2 * t);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, col = col0 + nt * 8 + 2 * t + (e & 1);
      const float c1 = kDkDv ? ((e & 1) ? c1c.y : c1c.x) : rs.c1[r];
      const float l2 = kDkDv ? ((e & 1) ? l2c.y : l2c.x) : rs.l2[r];
      const float pr = Exp2(fmaf(t1[nt][e], c1, -l2));
      t1[nt][e] = kFull || (col >= lo[r] && col < hi[r]) ? pr : 0.f;
    }
  }
}

// dS = P (dP - rowsum(dO * O)) * scale into t2, from P * 256 in t1.
template <bool kDkDv, bool kFull, int NT>
__device__ __forceinline__ void Fp8BwdDs(const float (&t1)[NT][4], float (&t2)[NT][4], int col0,
                                         int t, const int (&lo)[2], const int (&hi)[2],
                                         const Fp8RowStats& rs, const float* stats, float k) {
  constexpr int R = 8 * NT;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float2 c2c = {0.f, 0.f}, dsc = {0.f, 0.f};
    if constexpr (kDkDv) {
      c2c = *reinterpret_cast<const float2*>(stats + 2 * R + nt * 8 + 2 * t);
      dsc = *reinterpret_cast<const float2*>(stats + 3 * R + nt * 8 + 2 * t);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, col = col0 + nt * 8 + 2 * t + (e & 1);
      const float c2 = kDkDv ? ((e & 1) ? c2c.y : c2c.x) : rs.c2[r];
      const float dsum = kDkDv ? ((e & 1) ? dsc.y : dsc.x) : rs.ds[r];
      const float ds = t1[nt][e] * fmaf(t2[nt][e], c2, -dsum) * k;
      t2[nt][e] = kFull || (col >= lo[r] && col < hi[r]) ? ds : 0.f;
    }
  }
}

// The lazy per-row dS scales u (file comment): grows u where a row's
// largest |dS| needs it, rescales o1's rows by the exact ratio, and divides
// the tile by u.
template <int NT>
__device__ __forceinline__ void Fp8BwdScaleDs(float (&t2)[NT][4], float (&u)[2],
                                              float (&o1)[16][4]) {
  float ratio[2] = {1.f, 1.f}, inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      m = fmaxf(m, fmaxf(fabsf(t2[nt][2 * r]), fabsf(t2[nt][2 * r + 1])));
    }
    m = QuadMax(m);
    if (m > 0.f) {
      const float need = Fp8Scale(m);
      if (need > u[r]) {
        if (u[r] > 0.f) ratio[r] = u[r] * InversePow2(need);
        u[r] = need;
      }
    }
    inv[r] = u[r] > 0.f ? InversePow2(u[r]) : 1.f;
  }
  if (__any_sync(0xffffffffu, ratio[0] != 1.f || ratio[1] != 1.f)) {
#pragma unroll
    for (int dt = 0; dt < 16; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o1[dt][e] *= ratio[e >> 1];
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) t2[nt][e] *= inv[e >> 1];
  }
}

template <class C>
__device__ __forceinline__ void Fp8BwdConsumer(const KernelParams& p,
                                               const Fp8BackwardOperands& ops,
                                               const Fp8BwdSmem<C>& sm, int c, int tid,
                                               const TileScheduler& sched) {
  constexpr int R = C::R;
  constexpr bool kDkDv = C::kDkDv;
  ConsumerRegs();
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const float c1_scale = p.scale * kLog2e, ds_scale = p.scale / 256.f;
  int iter = 0, item = 0;
  for (int w = sched.First(); sched.Valid(w); w = sched.Next(w), ++item) {
    const WorkItem it = ItemAt(p, w);
    const StreamTiles st = ItemStreamTiles<C>(it);
    const int wg_row0 = it.tile_row + c * 64;
    const int row0 = wg_row0 + warp * 16 + g;  // and row0 + 8
    int lo[2], hi[2];
    Fp8RowStats rs{};
    if constexpr (kDkDv) {
#pragma unroll
      for (int r = 0; r < 2; ++r) QueryRangeOf(p, it.q_len, it.k_len, row0 + 8 * r, lo[r], hi[r]);
    } else {
      RowKeyRanges(p, it.q_len, it.k_len, row0, lo, hi);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = row0 + 8 * r;
        if (i < it.q_len) {
          const int64_t rh = (it.q_start + i) * p.heads + it.head;
          rs.c1[r] = c1_scale * ops.q_scale[rh];
          rs.l2[r] = Lse2(p, rh) - 8.f;
          rs.c2[r] = ops.do_scale[rh];
          rs.ds[r] = ops.dsum[rh];
        }
      }
    }
    float o1[16][4], o2[kDkDv ? 16 : 1][4];
    Zero(o1);
    Zero(o2);
    float u[2] = {0.f, 0.f};
    const int sb = item & 1;
    const uint32_t x_rows = sm.X(sb) + c * 64 * 128, y_rows = sm.Y(sb) + c * 64 * 128;
    BarWait(sm.stat_full + 8 * sb, (item >> 1) & 1);
    // Tiles none of whose pairs this warpgroup sees come first or last
    // (monotone ranges): released once landed, no GEMM.
    int n_begin = 0, n_end = st.count;
    while (n_begin < n_end &&
           StreamClass<C>(p, it, wg_row0, st.first + n_begin * R) == kTileOutside) {
      ++n_begin;
    }
    while (n_end > n_begin &&
           StreamClass<C>(p, it, wg_row0, st.first + (n_end - 1) * R) == kTileOutside) {
      --n_end;
    }
    auto skip = [&](int& iter) {
      const RingPos<C::kStages> rp(iter);
      BarWait(sm.full + 8 * rp.stage, rp.phase);
      BarArrive(sm.empty + 8 * rp.stage);
      ++iter;
    };
    for (int n = 0; n < n_begin; ++n) skip(iter);
    for (int n = n_begin; n < n_end; ++n, ++iter) {
      const RingPos<C::kStages> rp(iter);
      const int s = rp.stage;
      const int col0 = st.first + n * R;
      float t1[R / 8][4], t2[R / 8][4];
      BarWait(sm.full + 8 * s, rp.phase);
      WgFence();
      GemmFp8SS<R>(t1, x_rows, sm.Tile(s, 0));
      WgCommit();
      GemmFp8SS<R>(t2, y_rows, sm.Tile(s, 1));
      WgCommit();
      const bool full = StreamClass<C>(p, it, wg_row0, col0) == kTileFull;
      const float* stats = sm.Stats(s);
      WgWait1();
      FenceRegs(t1);
      if (full) {
        Fp8BwdP<kDkDv, true, R / 8>(t1, col0, t, lo, hi, rs, stats);
      } else {
        Fp8BwdP<kDkDv, false, R / 8>(t1, col0, t, lo, hi, rs, stats);
      }
      WgWait0();
      FenceRegs(t2);
      if (full) {
        Fp8BwdDs<kDkDv, true, R / 8>(t1, t2, col0, t, lo, hi, rs, stats, ds_scale);
      } else {
        Fp8BwdDs<kDkDv, false, R / 8>(t1, t2, col0, t, lo, hi, rs, stats, ds_scale);
      }
      Fp8BwdScaleDs(t2, u, o1);
      uint32_t fds[R / 32][4], fp[kDkDv ? R / 32 : 1][4];
      PackP<R>(t2, fds);
      if constexpr (kDkDv) PackP<R>(t1, fp);
      FenceRegs(fds);
      FenceRegs(o1);
      if constexpr (kDkDv) {
        FenceRegs(fp);
        FenceRegs(o2);
      }
      WgFence();
      GemmFp8RsT<R>(o1, fds, sm.Tile(s, 2));  // dK += dS^T Q, or dQ += dS K
      if constexpr (kDkDv) GemmFp8RsT<R>(o2, fp, sm.Tile(s, 3));  // dV += P^T dO
      WgCommit();
      WgWait0();
      FenceRegs(o1);
      if constexpr (kDkDv) FenceRegs(o2);
      BarArrive(sm.empty + 8 * s);
    }
    for (int n = n_end; n < st.count; ++n) skip(iter);
    BarArrive(sm.stat_empty + 8 * sb);
    if constexpr (kDkDv) {
      const float v_mul[2] = {1.f / 256.f, 1.f / 256.f};
      StoreScaledRows(p.dk, o1, it.k_start, row0, it.k_len, it.head, p.heads, u,
                      ops.qt_scale + it.head * 128, t);
      StoreScaledRows(p.dv, o2, it.k_start, row0, it.k_len, it.head, p.heads, v_mul,
                      ops.dot_scale + it.head * 128, t);
    } else {
      StoreScaledRows(p.dq, o1, it.q_start, row0, it.q_len, it.head, p.heads, u,
                      ops.k_scale + it.head * 128, t);
    }
  }
}

template <class C>
__global__ void __launch_bounds__(C::kCtaThreads, 1)
    Fp8BackwardKernel(const KernelParams p, const Fp8BackwardOperands ops,
                      const __grid_constant__ Fp8BwdMaps maps) {
  extern __shared__ unsigned char smem_raw[];
  const Fp8BwdSmem<C> sm(smem_raw);
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const TileScheduler sched(p);
  if (threadIdx.x == 0) sm.Init();
  __syncthreads();
  if (wg == 2) {
    Fp8BwdProducer<C>(p, ops, sm, maps, tid, sched);
  } else {
    Fp8BwdConsumer<C>(p, ops, sm, wg, tid, sched);
  }
}

template <class C>
int LaunchFp8Backward(const KernelParams& p, const Fp8BackwardOperands& ops, int sms,
                      cudaStream_t stream) {
  Fp8BwdMaps maps{};
  const int64_t x_rows = C::kDkDv ? p.kv_rows : p.q_rows;
  const int64_t a_rows = C::kDkDv ? p.q_rows : p.kv_rows;
  const void* x = C::kDkDv ? ops.k8 : ops.q8;
  const void* y = C::kDkDv ? ops.v8 : ops.do8;
  const void* a = C::kDkDv ? ops.q8 : ops.k8;
  const void* b = C::kDkDv ? ops.do8 : ops.v8;
  const void* at = C::kDkDv ? ops.qt8 : ops.kt8;
  const int64_t a_cols = C::kDkDv ? ops.q_cols : ops.kv_cols;
  if (!MakeRowsMap(&maps.x, x, x_rows, p.heads, C::kStatRows) ||
      !MakeRowsMap(&maps.y, y, x_rows, p.heads, C::kStatRows) ||
      !MakeRowsMap(&maps.a, a, a_rows, p.heads, C::R) ||
      !MakeRowsMap(&maps.b, b, a_rows, p.heads, C::R) ||
      !MakeVtMap(&maps.at, at, a_cols, p.heads, C::R) ||
      (C::kDkDv && !MakeVtMap(&maps.bt, ops.dot8, ops.q_cols, p.heads, C::R))) {
    return cudaErrorNotSupported;
  }
  auto kernel = Fp8BackwardKernel<C>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<TileScheduler::Grid(p, sms), C::kCtaThreads, C::kSmemBytes, stream>>>(p, ops, maps);
  return cudaGetLastError();
}

}  // namespace

int LaunchFp8BackwardQuantize(const void* q, const void* k, const void* v, const void* dout,
                              const void* out, int64_t q_rows, int64_t kv_rows, int heads, int head_dim,
                              const Fp8BackwardOperands& ops, void* stream) {
  if (head_dim != 128) return cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  const int cols = heads * 128;
  // amax: K's, V's, Q's, dO's channels.
  if (kv_rows > 0) {
    ChannelAmaxKernel<<<ChannelAmaxGrid(kv_rows, cols), 256, 0, s>>>(
        static_cast<const bf16*>(k), static_cast<const bf16*>(v), kv_rows, cols, ops.amax);
  }
  if (q_rows > 0) {
    ChannelAmaxKernel<<<ChannelAmaxGrid(q_rows, cols), 256, 0, s>>>(
        static_cast<const bf16*>(q), static_cast<const bf16*>(dout), q_rows, cols,
        ops.amax + 2 * cols);
  }
  const int scale_blocks = (2 * cols + 255) / 256;
  ScalesBothKernel<<<scale_blocks, 256, 0, s>>>(ops.amax, cols, ops.k_scale, ops.v_scale);
  ScalesBothKernel<<<scale_blocks, 256, 0, s>>>(ops.amax + 2 * cols, cols, ops.qt_scale,
                                                ops.dot_scale);
  const int64_t q_blocks = TransposedBlocks(ops.q_cols, heads);
  const int64_t k_blocks = TransposedBlocks(ops.kv_cols, heads);
  const int64_t kv_blocks = k_blocks + ChannelBlocks(kv_rows, heads);
  const auto* qb = static_cast<const bf16*>(q);
  const auto* kb = static_cast<const bf16*>(k);
  const auto* vb = static_cast<const bf16*>(v);
  const auto* db = static_cast<const bf16*>(dout);
  const auto* ob = static_cast<const bf16*>(out);
  if (q_blocks > 0) {
    Fp8BackwardQuantizeKernel<PrepassSection::kQ, 2>
        <<<static_cast<unsigned>(q_blocks), 256, 0, s>>>(qb, kb, vb, db, ob, q_rows, kv_rows,
                                                          heads, k_blocks, ops);
    Fp8BackwardQuantizeKernel<PrepassSection::kDout, 2>
        <<<static_cast<unsigned>(q_blocks), 256, 0, s>>>(qb, kb, vb, db, ob, q_rows, kv_rows,
                                                          heads, k_blocks, ops);
  }
  if (kv_blocks > 0) {
    Fp8BackwardQuantizeKernel<PrepassSection::kKv, 4>
        <<<static_cast<unsigned>(kv_blocks), 256, 0, s>>>(qb, kb, vb, db, ob, q_rows, kv_rows,
                                                           heads, k_blocks, ops);
  }
  return cudaGetLastError();
}

int LaunchJaggedBackwardFp8(const KernelParams& p, const Fp8BackwardOperands& ops, bool dkdv,
                            int sms, void* stream) {
  if (p.num_items * p.heads == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  if (dkdv) return LaunchFp8Backward<Fp8BwdConfig<true>>(p, ops, sms, s);
  return p.fp8_wide_keys ? LaunchFp8Backward<Fp8BwdConfig<false, 128>>(p, ops, sms, s)
                         : LaunchFp8Backward<Fp8BwdConfig<false>>(p, ops, sms, s);
}

}  // namespace recfleet::attention::cuda_impl
