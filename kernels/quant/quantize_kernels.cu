#include "kernels/quant/quantize_kernels.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/base/cuda_util.h"
#include "kernels/base/minifloat.h"

namespace recfleet::quant_cuda {
namespace {

using cuda_util::ElemType;
using cuda_util::LoadF;
using cuda_util::StoreF;

constexpr int kThreads = 256;  // Hadamard and elementwise kernels

// Quantization works on 128 x 128 tiles of x, one per block of 256 threads
// (8 warps). Thread (warp w, lane l) holds 4 groups of 4 consecutive rows,
// group i being rows 4 * (w + 8 i) .. + 3, and columns 4 l .. 4 l + 3: 64
// elements, all loaded before the first use (16 independent loads in
// flight per thread). A warp's load of one row is 128 consecutive elements.
constexpr int kTile = 128;
constexpr int kTileThreads = 256;
constexpr int kWarps = kTileThreads / 32;
// 128-point Hadamard over the tile's rows: 1 / sqrt(128).
constexpr float kHadamardNorm128 = 0.08838834764831845f;

using Tile = float[4][4][4];  // [group i][row rr in group][column j]

__device__ __forceinline__ uint8_t ToE8M0(float pow2) {
  int e;
  frexpf(pow2, &e);  // 2^p = 0.5 * 2^(p + 1)
  return static_cast<uint8_t>(e - 1 + 127);
}

__device__ __forceinline__ int64_t TileRow(int64_t r0, int warp, int i, int rr) {
  return r0 + 4 * (warp + kWarps * i) + rr;
}

// Raw vector of 4 consecutive elements of x (as staged in shared memory)
// and its widening to fp32.
template <typename T>
using Raw4 = typename std::conditional<sizeof(T) == 4, float4, uint2>::type;

template <typename T>
__device__ __forceinline__ void Widen4(const Raw4<T>& raw, float (&out)[4]) {
  if constexpr (sizeof(T) == 4) {
    out[0] = raw.x, out[1] = raw.y, out[2] = raw.z, out[3] = raw.w;
  } else {
    cuda_util::WidenBf16x2(raw.x, out[0], out[1]);
    cuda_util::WidenBf16x2(raw.y, out[2], out[3]);
  }
}

// Loads the thread's 64 elements straight from global memory with guarded
// scalar loads: the path of matrices whose rows are not 16-byte aligned.
template <typename T>
__device__ __forceinline__ void LoadTile(const QuantizeArgs& a, int64_t r0, int64_t c, int warp,
                                         Tile& v) {
  const T* x = static_cast<const T*>(a.x);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int64_t r = TileRow(r0, warp, i, rr);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[i][rr][j] =
            r < a.rows && c + j < a.cols ? cuda_util::ToFloat(x[r * a.cols + c + j]) : 0.0f;
      }
    }
  }
}

// 16-byte asynchronous copy global -> shared; with `valid` false it writes
// zeros and reads nothing (`src` must still be a mapped address).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
}

// Starts copying the tile at (r0, c0) into `stage` (row-major, 128 elements
// per row; rows and columns outside x read as zeros). Needs 16-byte aligned
// rows. Each thread copies kTile * sizeof(T) / 16 / 2 chunks of 16 bytes.
template <typename T>
__device__ __forceinline__ void IssueTileCopy(const QuantizeArgs& a, int64_t r0, int64_t c0,
                                              char* stage) {
  constexpr int kChunksPerRow = kTile * static_cast<int>(sizeof(T)) / 16;
  constexpr int kElemsPerChunk = 16 / static_cast<int>(sizeof(T));
  // Chunk k = threadIdx.x + i * kTileThreads lies in row k / kChunksPerRow,
  // so a thread's column stays the same and its row moves by kRowsPerPass:
  // one pointer and one bound check per copy.
  constexpr int kRowsPerPass = kTileThreads / kChunksPerRow;
  const T* x = static_cast<const T*>(a.x);
  const int64_t r = r0 + threadIdx.x / kChunksPerRow;
  const int64_t c = c0 + (threadIdx.x % kChunksPerRow) * kElemsPerChunk;
  const T* src = x + r * a.cols + c;
  const int64_t step = kRowsPerPass * a.cols;
  // Rows of this thread's column inside x (0 for a column past its end).
  const int64_t rows_left = a.rows - r;
  const int in_rows = c >= a.cols ? 0 : (rows_left < kTile ? static_cast<int>(rows_left) : kTile);
  char* dst = stage + threadIdx.x * 16;
#pragma unroll
  for (int i = 0; i < kTile / kRowsPerPass; ++i) {
    const bool valid = i * kRowsPerPass < in_rows;
    CpAsync16(dst + i * kTileThreads * 16, valid ? src : x, valid);
    src += step;
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits for this thread's tile copies; the caller then synchronizes the
// block before reading the stage.
__device__ __forceinline__ void WaitTileCopies() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// The copy of a block's next tile into its stage, issued by every thread
// once all of them have read the current tile out of it (after a block
// barrier).
struct NextCopy {
  const QuantizeArgs* a;
  int64_t r0, c0;
  char* stage;
  bool fp32, valid;
  __device__ __forceinline__ void Issue() const {
    if (!valid) return;
    if (fp32) {
      IssueTileCopy<float>(*a, r0, c0, stage);
    } else {
      IssueTileCopy<__nv_bfloat16>(*a, r0, c0, stage);
    }
  }
};

// x * 0 + acc for one word of x as loaded (two bf16, or one fp32), in that
// format: acc stays +-0 while every element is finite and turns NaN for a
// NaN or an infinity. bf16 pairs take one packed FMA per two elements.
template <typename T>
__device__ __forceinline__ uint32_t ProbeFinite(uint32_t w, uint32_t acc) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(fmaf(__uint_as_float(w), 0.0f, __uint_as_float(acc)));
  } else {
    const __nv_bfloat162 r = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&w),
                                     __float2bfloat162_rn(0.0f),
                                     *reinterpret_cast<const __nv_bfloat162*>(&acc));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

// The thread's 64 elements from a staged tile. A warp reads one 128-element
// row per access (256 or 512 contiguous bytes: no bank conflicts). Returns
// whether all 64 are finite, read off the raw words (see ProbeFinite): the
// encoders then skip their per-row NaN and infinity checks, which cost more
// (4 FMAs and a compare per 4 values, once per output).
template <typename T>
__device__ __forceinline__ bool LoadStagedTile(const char* stage, int warp, int lane, Tile& v) {
  const Raw4<T>* s = reinterpret_cast<const Raw4<T>*>(stage);
  uint32_t acc[2] = {0u, 0u};  // two chains, half as long
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const Raw4<T> raw = s[(4 * (warp + kWarps * i) + rr) * (kTile / 4) + lane];
      Widen4<T>(raw, v[i][rr]);
      if constexpr (sizeof(T) == 4) {
        acc[0] = ProbeFinite<T>(__float_as_uint(raw.x), acc[0]);
        acc[1] = ProbeFinite<T>(__float_as_uint(raw.y), acc[1]);
        acc[0] = ProbeFinite<T>(__float_as_uint(raw.z), acc[0]);
        acc[1] = ProbeFinite<T>(__float_as_uint(raw.w), acc[1]);
      } else {
        acc[0] = ProbeFinite<T>(raw.x, acc[0]);
        acc[1] = ProbeFinite<T>(raw.y, acc[1]);
      }
    }
  }
  // +-0 in every lane of both accumulators (two bf16 or one fp32 each).
  constexpr uint32_t kMagnitude = sizeof(T) == 4 ? 0x7FFFFFFFu : 0x7FFF7FFFu;
  return ((acc[0] | acc[1]) & kMagnitude) == 0u;
}

// One step of the transposing max-reduction in TileScales<1, 128>: the lane
// keeps rows [0, N) or [N, 2N) of m[0, 2N) (by its bit N * 2) and takes the
// max with the same rows of the lane 2N away, into m[0, N).
template <int N>
__device__ __forceinline__ void TradeHalves(float (&m)[16], int lane) {
  const bool upper = (lane & (2 * N)) != 0;
#pragma unroll
  for (int h = 0; h < N; ++h) {
    const float send = upper ? m[h] : m[h + N];
    const float keep = upper ? m[h + N] : m[h];
    m[h] = fmaxf(keep, __shfl_xor_sync(0xffffffffu, send, 2 * N));
  }
}

// After each warp wrote its partial maxima of block b to red[warp][b]:
// thread b < count finishes block b's maximum and writes its scale and
// reciprocal in place, to red[0][b] and red[1][b] (only it reads column b),
// so each is computed once rather than by every thread that needs it. Ends
// with a barrier; every thread of the block must call it.
__device__ __forceinline__ void FinishScales(float (*red)[kTile], int count, float fmax,
                                             bool pow2) {
  if (threadIdx.x < count) {
    const int b = threadIdx.x;
    float m = red[0][b];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w][b]);
    const float scale = minifloat::BlockScale(m, fmax, pow2);
    red[0][b] = scale;
    red[1][b] = __frcp_rn(scale);
  }
  __syncthreads();
}

// Dequantization scales of the thread's elements for x-oriented blocks of
// XR x XC (1x128: one per row; 128x1: one per column; 128x128: one; 32x32:
// one per row group i), and their correctly rounded reciprocals (as
// minifloat::Reciprocal on the host), which Encode multiplies by. For 1x128,
// s[0] is the scale of the thread's own row k = lane >> 1 of its 16 (see
// Compute); the others hold all of theirs. Every thread of the block must
// call Compute.
template <int XR, int XC>
struct TileScales {
  static constexpr int kCount = XR == 1 ? 16 : (XC == 1 ? 4 : (XR == 32 ? 4 : 1));
  float s[XR == 1 ? 1 : kCount];
  // Every inv is finite (minifloat::BlockScale never returns a scale below
  // 2^-127): with finite elements, every y = x * inv is then finite too
  // (|x| <= the block's amax, so |y| <= fmax).
  float inv[kCount];
  __device__ __forceinline__ static int Index(int i, int rr, int j) {
    if constexpr (XR == 1) return i * 4 + rr;
    if constexpr (XC == 1) return j;
    if constexpr (XR == 32) return i;
    return 0;
  }
  // `next` (or null): issued after the computation's first block barrier
  // (1x128 has none and adds one for it).
  __device__ __forceinline__ void Compute(const Tile& v, float (*red)[kTile], float fmax,
                                          bool pow2, int warp, int lane,
                                          const NextCopy* next = nullptr) {
    if constexpr (XR == 1) {
      // Transposing reduction of the 16 row maxima over the warp: at each
      // step a lane keeps half of its rows and trades the other half with
      // the lane `o` away, so 8 + 4 + 2 + 1 shuffles leave lane l with row
      // (l >> 1) over 16 lanes, and one more over all 32 (16 shuffles and
      // one division per lane, instead of 80 and 16).
      float m[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const float* e = v[k / 4][k % 4];
        m[k] = fmaxf(fmaxf(fabsf(e[0]), fabsf(e[1])), fmaxf(fabsf(e[2]), fabsf(e[3])));
      }
      TradeHalves<8>(m, lane);
      TradeHalves<4>(m, lane);
      TradeHalves<2>(m, lane);
      TradeHalves<1>(m, lane);
      m[0] = fmaxf(m[0], __shfl_xor_sync(0xffffffffu, m[0], 1));
      s[0] = minifloat::BlockScale(m[0], fmax, pow2);
      const float own_inv = __frcp_rn(s[0]);
#pragma unroll
      for (int k = 0; k < 16; ++k) inv[k] = __shfl_sync(0xffffffffu, own_inv, 2 * k);
      if (next != nullptr) {
        __syncthreads();
        next->Issue();
      }
    } else {
      ComputeShared(v, red, fmax, pow2, warp, lane, next);
      if constexpr (XC != 1 && XR != 32) {  // 128x1 and 32x32 get theirs from ComputeShared
#pragma unroll
        for (int k = 0; k < kCount; ++k) inv[k] = __frcp_rn(s[k]);
      }
    }
  }

  // Column (128x1) and square blocks: reductions across warps through `red`.
  __device__ __forceinline__ void ComputeShared(const Tile& v, float (*red)[kTile], float fmax,
                                                bool pow2, int warp, int lane,
                                                const NextCopy* next) {
    if constexpr (XC == 1) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int rr = 0; rr < 4; ++rr) m = fmaxf(m, fabsf(v[i][rr][j]));
        }
        red[warp][lane * 4 + j] = m;
      }
      __syncthreads();
      if (next != nullptr) next->Issue();
      FinishScales(red, kTile, fmax, pow2);
      const float4 s4 = *reinterpret_cast<const float4*>(&red[0][lane * 4]);
      const float4 i4 = *reinterpret_cast<const float4*>(&red[1][lane * 4]);
      s[0] = s4.x, s[1] = s4.y, s[2] = s4.z, s[3] = s4.w;
      inv[0] = i4.x, inv[1] = i4.y, inv[2] = i4.z, inv[3] = i4.w;
    } else {
      // Square blocks: XR = 128 (one per tile) or 32 (row block i, column
      // block lane / 8; lanes of one column block differ in bits 0-2).
      constexpr int kGroups = XR == 32 ? 4 : 1;
      float m[kGroups];
#pragma unroll
      for (int g = 0; g < kGroups; ++g) m[g] = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int rr = 0; rr < 4; ++rr) {
#pragma unroll
          for (int j = 0; j < 4; ++j) m[XR == 32 ? i : 0] = fmaxf(m[XR == 32 ? i : 0], fabsf(v[i][rr][j]));
        }
      }
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
#pragma unroll
        for (int o = 1; o < (XR == 32 ? 8 : 32); o <<= 1) {
          m[g] = fmaxf(m[g], __shfl_xor_sync(0xffffffffu, m[g], o));
        }
        red[warp][g * 4 + lane / 8] = m[g];
      }
      __syncthreads();
      if (next != nullptr) next->Issue();
      if constexpr (XR == 32) {
        FinishScales(red, 16, fmax, pow2);  // the tile's 16 blocks
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          s[g] = red[0][g * 4 + lane / 8];
          inv[g] = red[1][g * 4 + lane / 8];
        }
      } else {
        float t = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) t = fmaxf(t, red[w][0]);
        s[0] = minifloat::BlockScale(t, fmax, pow2);
      }
    }
  }
};

// Writes the scale of q-block (bi, bj) of one output.
__device__ __forceinline__ void WriteScale(const QuantizeTarget& t, int64_t bi, int64_t bj,
                                           float s) {
  const int64_t idx = bi * t.scale_stride_row + bj * t.scale_stride_col;
  if (t.e8m0 != nullptr) {
    t.e8m0[idx] = ToE8M0(s);
  } else {
    t.scales[idx] = s;
  }
}

// Random bits of a tile's rows r, r + 1 and columns c .. c + 3 element by
// element (x's row length, or row count for kT, is odd, so pairs of indices
// do not line up with the tile): the rare case, kept out of line so that
// the encoders stay small. Everything passes by value and the 16-bit draws
// come back packed (see UnpackBits): a reference to the arguments or to a
// bits array made the compiler keep both in local memory on every path,
// the common paired one too (~100 local loads and stores per tile).
__device__ __noinline__ uint4 UnpairedBits(int64_t rows, int64_t cols, uint32_t key,
                                           bool transposed, int64_t r, int64_t c) {
  uint32_t w[4];
  for (int e = 0; e < 2; ++e) {
    for (int h = 0; h < 2; ++h) {
      uint32_t half[2];
      for (int k = 0; k < 2; ++k) {
        const int64_t cc = c + 2 * h + k, rr = r + e;
        const uint64_t index = static_cast<uint64_t>(transposed ? cc * rows + rr : rr * cols + cc);
        half[k] = minifloat::RandomBits(key, index);
      }
      w[2 * e + h] = half[0] | half[1] >> 16;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// bits[e][j] (top 16 bits) of UnpairedBits' packed result.
__device__ __forceinline__ void UnpackBits(const uint4& p, uint32_t (&bits)[2][4]) {
  const uint32_t w[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    bits[k / 2][2 * (k % 2)] = w[k] & 0xFFFF0000u;
    bits[k / 2][2 * (k % 2) + 1] = w[k] << 16;
  }
}

// Encodes the thread's elements for one output: word[i][rr] holds the four
// bytes of row (i, rr), column j in byte j. Stochastic rounding draws from
// the element's index in that output (x's for direct, x^T's for transposed),
// as the CPU reference does; `key` is minifloat::RandomKey(t.seed), computed
// on the host (in a kernel parameter it costs no registers, where the
// compiler recomputed it for every row pair).
//
// kFinite: every y is finite (v and the scales' reciprocals are), so the
// per-row NaN/infinity checks are left out. A separate instantiation, not a
// run-time flag: with one, the compiler computed the checks anyway and
// selected on the flag afterwards.
template <int XR, int XC, bool kT, bool kSR, bool kE5M2, bool kFinite>
__device__ __forceinline__ void EncodeAs(const QuantizeArgs& a, const QuantizeTarget& t,
                                         uint32_t key, const Tile& v,
                                         const TileScales<XR, XC>& sc, int64_t r0, int64_t c,
                                         int warp, uint32_t (&word)[4][4]) {
  constexpr bool finite = kFinite;
  constexpr bool e5m2 = kE5M2;
  const minifloat::Spec spec = e5m2 ? minifloat::E5M2() : minifloat::E4M3();
  // Elements pair up for the random bits (minifloat::RandomBits: one hash
  // per even/odd index pair) along q's rows: for direct output columns j and
  // j + 1 of a tile row when x's rows have even length, for transposed output
  // rows rr and rr + 1 of a group when x has an even row count (x^T's rows
  // then have even length); otherwise, or when pair indices pass 32 bits,
  // each element hashes its own pair out of line.
  const bool paired = kSR && t.stochastic && (kT ? a.rows % 2 == 0 : a.cols % 2 == 0) &&
                      a.rows * a.cols <= (int64_t{1} << 33);
  // Paired: pair index (below 2^32, so PairHash's high word is 0) of the
  // first element of pair u in row pair (i, rp) = pair0[u] + (16 i + rp) *
  // step, 32-bit arithmetic: for kT the pairs run down x^T's row c + u from
  // row r0 + 4 warp, direct ones along x's row r0 + 4 warp + (u & 1) from
  // column c + (u & 2).
  uint32_t pair0[4] = {0, 0, 0, 0};
  uint32_t step = 0;
  if (kSR && t.stochastic) {
    const uint32_t rows32 = static_cast<uint32_t>(a.rows), cols32 = static_cast<uint32_t>(a.cols);
    const uint32_t row = static_cast<uint32_t>(r0) + 4 * warp, col = static_cast<uint32_t>(c);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      // Rows, cols, row and col + (u & 2) are even where paired; each term
      // halved first, so the sum is the pair index mod 2^32 (exact below it).
      pair0[u] = kT ? (col + u) * (rows32 >> 1) + (row >> 1)
                    : (row + (u & 1)) * (cols32 >> 1) + ((col + (u & 2)) >> 1);
    }
    step = kT ? 1 : cols32;
  }
  // Four codes by two packed conversions (as the row kernel), which cut the
  // tile kernels' time by 6-26% against the scalar encoder. Stochastic
  // rounding first snaps each value onto the FP8 grid (integer add and
  // truncate, exact), so the packed nearest-even conversion then encodes it
  // unchanged. A row whose y holds a NaN or an infinity (y * 0 is then NaN)
  // takes the scalar encoder, whose NaN code the packed one need not
  // reproduce.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rp = 0; rp < 2; ++rp) {
      uint32_t bits[2][4];  // rows 2 rp + e, columns j
      if (kSR && t.stochastic) {
        if (paired) {
          const uint32_t offset = (16 * i + rp) * step;
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            // kT: rows (2 rp, 2 rp + 1) of column u; direct: columns (u & 2,
            // (u & 2) + 1) of row 2 rp + (u & 1). The first index is even.
            const int e = kT ? 0 : (u & 1), j = kT ? u : (u & 2);
            const uint32_t hash = minifloat::PairHash(key, pair0[u] + offset);
            bits[e][j] = minifloat::PairHalf(hash, false);
            bits[kT ? 1 : e][kT ? j : j + 1] = minifloat::PairHalf(hash, true);
          }
        } else {
          UnpackBits(UnpairedBits(a.rows, a.cols, key, kT, TileRow(r0, warp, i, 2 * rp), c), bits);
        }
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int rr = 2 * rp + e;
        float y[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          y[j] = v[i][rr][j] * sc.inv[TileScales<XR, XC>::Index(i, rr, j)];
        }
        // No NaN or infinity in y (y * 0 is then +-0 everywhere).
        auto clean = [&y] {
          return fmaf(y[0], 0.0f, fmaf(y[1], 0.0f, fmaf(y[2], 0.0f, y[3] * 0.0f))) == 0.0f;
        };
        bool encodable = finite || clean();
        if (kSR && t.stochastic) {
          // Finite normal values (nearly all) take the unclamped integer-add
          // snap alone (|y| <= ~fmax after block scaling) and stay finite.
          const float amin =
              fminf(fminf(fabsf(y[0]), fabsf(y[1])), fminf(fabsf(y[2]), fabsf(y[3])));
          if (encodable && amin >= minifloat::Pow2(1 - spec.bias)) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              y[j] = minifloat::StochasticSnapNormalUnclamped(spec, y[j], bits[e][j]);
            }
            word[i][rr] = minifloat::EncodeNearest4(y, e5m2);
            continue;
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) y[j] = minifloat::StochasticSnap(spec, y[j], bits[e][j]);
          // The snap saturates infinities; a NaN stays.
          encodable = finite || clean();
        }
        if (encodable) {
          word[i][rr] = minifloat::EncodeNearest4(y, e5m2);
        } else {
          uint32_t w = 0;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            w |= static_cast<uint32_t>(minifloat::Encode(spec, y[j])) << (8 * j);
          }
          word[i][rr] = w;
        }
      }
    }
  }
}

// The FP8 format as a compile-time choice for the encoder: with a run-time
// one, every packed conversion was issued twice (once per format, under
// opposite predicates).
template <int XR, int XC, bool kT, bool kSR>
__device__ __forceinline__ void Encode(const QuantizeArgs& a, const QuantizeTarget& t,
                                       uint32_t key, const Tile& v, const TileScales<XR, XC>& sc,
                                       bool finite_x, int64_t r0, int64_t c, int warp,
                                       uint32_t (&word)[4][4]) {
  // `finite_x`: the caller saw that all of v is finite (every scale's
  // reciprocal is: TileScales).
  if (finite_x) {
    if (a.format == 2) {
      EncodeAs<XR, XC, kT, kSR, true, true>(a, t, key, v, sc, r0, c, warp, word);
    } else {
      EncodeAs<XR, XC, kT, kSR, false, true>(a, t, key, v, sc, r0, c, warp, word);
    }
  } else if (a.format == 2) {
    EncodeAs<XR, XC, kT, kSR, true, false>(a, t, key, v, sc, r0, c, warp, word);
  } else {
    EncodeAs<XR, XC, kT, kSR, false, false>(a, t, key, v, sc, r0, c, warp, word);
  }
}

__device__ __forceinline__ void StoreDirect(const QuantizeArgs& a, const QuantizeTarget& t,
                                            const uint32_t (&word)[4][4], int64_t r0, int64_t c,
                                            int warp) {
  const int64_t c0 = c - 4 * (threadIdx.x & 31);
  if (a.cols % 4 == 0 && r0 + kTile <= a.rows && c0 + kTile <= a.cols) {
    // Whole tile (uniform over the block): one pointer walked down the
    // thread's rows, where the general path below spends ~20 instructions
    // per store on 64-bit row arithmetic and bound checks.
    uint8_t* group = t.q + (r0 + 4 * warp) * a.cols + c;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint8_t* out = group;
#pragma unroll
      for (int rr = 0; rr < 4; ++rr) {
        *reinterpret_cast<uint32_t*>(out) = word[i][rr];
        out += a.cols;
      }
      group += 4 * kWarps * a.cols;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int64_t r = TileRow(r0, warp, i, rr);
      if (r >= a.rows) continue;
      uint8_t* out = t.q + r * a.cols + c;
      if (a.cols % 4 == 0 && c + 3 < a.cols) {
        *reinterpret_cast<uint32_t*>(out) = word[i][rr];
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (c + j < a.cols) out[j] = static_cast<uint8_t>(word[i][rr] >> (8 * j));
        }
      }
    }
  }
}

// Transposed store through shared memory: each thread turns its 4 x 4 byte
// blocks around in registers and writes 32-bit words of q^T rows (4 x rows
// each) into a 128 x 32-word tile, swizzled (word index XOR the writer's
// lane) so that both the writes and the row-wise reads hit 32 distinct
// banks; each warp then writes whole 128-byte rows of q.
__device__ __forceinline__ void StoreTransposed(const QuantizeArgs& a, const QuantizeTarget& t,
                                                const uint32_t (&word)[4][4], uint32_t* sm,
                                                int64_t r0, int64_t c0, int warp, int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t t0 = __byte_perm(word[i][0], word[i][1], 0x5140);
    const uint32_t t1 = __byte_perm(word[i][2], word[i][3], 0x5140);
    const uint32_t t2 = __byte_perm(word[i][0], word[i][1], 0x7362);
    const uint32_t t3 = __byte_perm(word[i][2], word[i][3], 0x7362);
    const uint32_t col[4] = {__byte_perm(t0, t1, 0x5410), __byte_perm(t0, t1, 0x7632),
                             __byte_perm(t2, t3, 0x5410), __byte_perm(t2, t3, 0x7632)};
    const int g = warp + kWarps * i;  // word index within a q row
#pragma unroll
    for (int j = 0; j < 4; ++j) sm[(lane * 4 + j) * 32 + (g ^ lane)] = col[j];
  }
  __syncthreads();
  if (a.rows % 4 == 0 && r0 + kTile <= a.rows && c0 + kTile <= a.cols) {
    // Whole tile: one pointer walked down the warp's q rows (as StoreDirect).
    uint8_t* out = t.q + (c0 + warp * (kTile / kWarps)) * a.rows + r0 + 4 * lane;
#pragma unroll
    for (int k = 0; k < kTile / kWarps; ++k) {
      const int cc = warp * (kTile / kWarps) + k;
      *reinterpret_cast<uint32_t*>(out) = sm[cc * 32 + (lane ^ (cc >> 2))];
      out += a.rows;
    }
    return;
  }
#pragma unroll 4
  for (int k = 0; k < kTile / kWarps; ++k) {
    const int cc = warp * (kTile / kWarps) + k;  // tile column = q row
    const int64_t qr = c0 + cc, qc = r0 + 4 * lane;
    if (qr >= a.cols || qc >= a.rows) continue;
    const uint32_t w = sm[cc * 32 + (lane ^ (cc >> 2))];
    uint8_t* out = t.q + qr * a.rows + qc;
    if (a.rows % 4 == 0) {
      *reinterpret_cast<uint32_t*>(out) = w;
    } else {
      for (int b = 0; b < 4 && qc + b < a.rows; ++b) out[b] = static_cast<uint8_t>(w >> (8 * b));
    }
  }
}

// In-place random Hadamard transform of the tile over its 128 rows (signs
// from the global row index): butterflies over the row bits a thread holds
// (rows within a group, groups) in registers, over the warp bits through
// shared memory (`hs`, 128 x 128 floats).
__device__ __forceinline__ void HadamardRows(Tile& v, float* hs, uint64_t seed, int64_t r0,
                                             int warp, int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const float sg = minifloat::RandomSign(seed, TileRow(r0, warp, i, rr));
#pragma unroll
      for (int j = 0; j < 4; ++j) v[i][rr][j] *= sg;
    }
  }
  auto butterfly = [](float& p, float& q) {
    const float u = p, w = q;
    p = u + w;
    q = u - w;
  };
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      butterfly(v[i][0][j], v[i][1][j]);
      butterfly(v[i][2][j], v[i][3][j]);
      butterfly(v[i][0][j], v[i][2][j]);
      butterfly(v[i][1][j], v[i][3][j]);
    }
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      butterfly(v[0][rr][j], v[1][rr][j]);
      butterfly(v[2][rr][j], v[3][rr][j]);
      butterfly(v[0][rr][j], v[2][rr][j]);
      butterfly(v[1][rr][j], v[3][rr][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int row = 4 * (warp + kWarps * i) + rr;
      *reinterpret_cast<float4*>(hs + row * kTile + lane * 4) =
          make_float4(v[i][rr][0], v[i][rr][1], v[i][rr][2], v[i][rr][3]);
    }
  }
  __syncthreads();
  // 8-point transforms across the warps: 2048 (group, row, column) lines.
  for (int line = threadIdx.x; line < 16 * kTile; line += kTileThreads) {
    const int col = line % kTile, i = line / kTile / 4, rr = line / kTile % 4;
    float u[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) u[w] = hs[(4 * (w + kWarps * i) + rr) * kTile + col];
#pragma unroll
    for (int h = 1; h < kWarps; h <<= 1) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        if ((w & h) == 0) butterfly(u[w], u[w + h]);
      }
    }
#pragma unroll
    for (int w = 0; w < kWarps; ++w) hs[(4 * (w + kWarps * i) + rr) * kTile + col] = u[w];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int row = 4 * (warp + kWarps * i) + rr;
      const float4 f = *reinterpret_cast<const float4*>(hs + row * kTile + lane * 4);
      v[i][rr][0] = f.x * kHadamardNorm128, v[i][rr][1] = f.y * kHadamardNorm128;
      v[i][rr][2] = f.z * kHadamardNorm128, v[i][rr][3] = f.w * kHadamardNorm128;
    }
  }
}

// (BR, BC): the block in q's orientation (1x128, 128x128 or 32x32). kDirect
// writes quantize(x) with x-blocks BR x BC, kT quantize(x^T) with x-blocks
// BC x BR, kHad transforms the data of the transposed output first. kSR
// compiles the stochastic-rounding encoder in: unrolled over 64 elements it
// is large, and round-to-nearest kernels that carried it ran at half speed
// (likely instruction-cache misses, judging by code size), so they are
// built without.
//
// Persistent blocks walk the tiles with a stride of the grid. With `staged`
// (16-byte aligned rows) the next tile is copied into shared memory
// (cp.async) while the current one is reduced, encoded and stored, so each
// block keeps a whole tile of reads in flight at all times; a block that
// loaded, computed and stored in sequence left the memory idle during the
// second half of its life.
template <int BR, int BC, bool kDirect, bool kT, bool kHad, bool kSR>
__global__ void __launch_bounds__(kTileThreads, 2)
    QuantizeTileKernel(QuantizeArgs a, bool staged, int64_t tiles, uint32_t key_direct,
                       uint32_t key_transposed) {
  extern __shared__ float4 dyn_smem[];
  __shared__ __align__(16) float red[kWarps][kTile];
  __shared__ uint32_t tsm[kT ? kTile * 32 : 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool fp32 = a.x_type == static_cast<int>(ElemType::kFloat32);
  char* stage = reinterpret_cast<char*>(dyn_smem) + (kHad ? kTile * kTile * sizeof(float) : 0);
  // Column tiles vary fastest across consecutive tiles, so blocks running
  // together read whole rows (DRAM-page friendly) rather than a column slab.
  const int64_t col_tiles = (a.cols + kTile - 1) / kTile;
  auto origin = [&](int64_t tile, int64_t& r0, int64_t& c0) {
    r0 = tile / col_tiles * kTile;
    c0 = tile % col_tiles * kTile;
  };
  auto issue = [&](int64_t tile) {
    int64_t r0, c0;
    origin(tile, r0, c0);
    if (fp32) {
      IssueTileCopy<float>(a, r0, c0, stage);
    } else {
      IssueTileCopy<__nv_bfloat16>(a, r0, c0, stage);
    }
  };
  if (staged && blockIdx.x < tiles) issue(blockIdx.x);
  const float fmax = a.format == 2 ? 57344.0f : 448.0f;
  constexpr bool kSquare = BR == BC;

  // The next tile's copy goes into the stage once every thread has read it:
  // at the first block barrier of the tile's scale computation (one barrier
  // per tile fewer), so 1x128 of x and x^T does x^T first, whose scales
  // have one; 1x128 of x alone and the Hadamard kernels (whose transform
  // comes first) give it a barrier of its own right after the load.
  constexpr bool kTFirst = kDirect && kT && BR == 1 && !kHad;
  constexpr bool kIssueAtScales = !kHad && (!kDirect || BR != 1 || kT);

  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int64_t r0, c0;
    origin(tile, r0, c0);
    const int64_t c = c0 + lane * 4;
    NextCopy next{&a, 0, 0, stage, fp32, staged && tile + gridDim.x < tiles};
    origin(tile + gridDim.x, next.r0, next.c0);
    Tile v;
    // All of v finite (staged tiles check it while loading; the unstaged
    // path leaves the checks to the encoders).
    bool finite = false;
    if (staged) {
      WaitTileCopies();
      // Also orders the previous tile's reads of red / tsm before this
      // tile's writes.
      __syncthreads();
      if (fp32) {
        finite = LoadStagedTile<float>(stage, warp, lane, v);
      } else {
        finite = LoadStagedTile<__nv_bfloat16>(stage, warp, lane, v);
      }
      if constexpr (!kIssueAtScales) {
        __syncthreads();
        next.Issue();
      }
    } else {
      __syncthreads();
      if (fp32) {
        LoadTile<float>(a, r0, c, warp, v);
      } else {
        LoadTile<__nv_bfloat16>(a, r0, c, warp, v);
      }
    }
    const NextCopy* at_scales = kIssueAtScales ? &next : nullptr;
    uint32_t word[4][4];

    // quantize(x); for square blocks also quantize(x^T) (then true).
    auto direct_part = [&](const NextCopy* at_barrier) -> bool {
      TileScales<BR, BC> sc;
      sc.Compute(v, red, fmax, a.pow2, warp, lane, at_barrier);
      const QuantizeTarget& t = a.direct;
      if constexpr (BR == 1) {
        // Lane 2k holds row k's scale.
        const int k = lane >> 1;
        const int64_t r = TileRow(r0, warp, k / 4, k % 4);
        if ((lane & 1) == 0 && r < a.rows) WriteScale(t, r, c0 / kTile, sc.s[0]);
      } else if constexpr (BR == 128) {
        if (threadIdx.x == 0) WriteScale(t, r0 / kTile, c0 / kTile, sc.s[0]);
      } else {
        if (warp == 0 && lane % 8 == 0 && c < a.cols) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (r0 + 32 * i < a.rows) WriteScale(t, r0 / 32 + i, c / 32, sc.s[i]);
          }
        }
      }
      Encode<BR, BC, false, kSR>(a, t, key_direct, v, sc, finite, r0, c, warp, word);
      StoreDirect(a, t, word, r0, c, warp);
      if constexpr (kT && kSquare && !kHad) {
        // Square blocks are transpose-invariant: same scales, and with
        // round-to-nearest the same bytes.
        const QuantizeTarget& tt = a.transposed;
        if (BR == 128 && threadIdx.x == 0) WriteScale(tt, c0 / kTile, r0 / kTile, sc.s[0]);
        if (BR == 32 && warp == 0 && lane % 8 == 0 && c < a.cols) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (r0 + 32 * i < a.rows) WriteScale(tt, c / 32, r0 / 32 + i, sc.s[i]);
          }
        }
        if (kSR && tt.stochastic) {
          Encode<BR, BC, true, kSR>(a, tt, key_transposed, v, sc, finite, r0, c, warp, word);
        }
        StoreTransposed(a, tt, word, tsm, r0, c0, warp, lane);
        return true;
      }
      return false;
    };
    // quantize(x^T).
    auto transposed_part = [&](const NextCopy* at_barrier) {
      const QuantizeTarget& t = a.transposed;
      if constexpr (kHad) {
        HadamardRows(v, reinterpret_cast<float*>(dyn_smem), a.hadamard_seed, r0, warp, lane);
      }
      TileScales<BC, BR> sc;
      sc.Compute(v, red, fmax, a.pow2, warp, lane, at_barrier);
      if constexpr (BR == 1) {
        if (warp == 0) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (c + j < a.cols) WriteScale(t, c + j, r0 / kTile, sc.s[j]);
          }
        }
      } else if constexpr (BR == 128) {
        if (threadIdx.x == 0) WriteScale(t, c0 / kTile, r0 / kTile, sc.s[0]);
      } else {
        if (warp == 0 && lane % 8 == 0 && c < a.cols) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (r0 + 32 * i < a.rows) WriteScale(t, c / 32, r0 / 32 + i, sc.s[i]);
          }
        }
      }
      // The Hadamard transform can overflow finite values: its tiles keep
      // the per-row checks.
      Encode<BC, BR, true, kSR>(a, t, key_transposed, v, sc, finite && !kHad, r0, c, warp,
                                word);
      StoreTransposed(a, t, word, tsm, r0, c0, warp, lane);
    };

    if constexpr (kTFirst) {
      transposed_part(at_scales);
      direct_part(nullptr);
    } else {
      if constexpr (kDirect) {
        if (direct_part(at_scales)) continue;
      }
      if constexpr (kT && !(kDirect && kSquare && !kHad)) {
        transposed_part(kDirect ? nullptr : at_scales);
      }
    }
  }
}

// Persistent grid of a kernel: as many blocks as fit on the device at once
// (the driver's occupancy calculation for this kernel and shared memory),
// capped by the work.
template <typename Kernel>
cudaError_t ResidentBlocks(Kernel kernel, int threads, size_t dyn, int64_t work, unsigned& grid) {
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) {
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, dyn);
  }
  if (e != cudaSuccess) return e;
  grid = static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>(work, static_cast<int64_t>(std::max(per_sm, 1)) * sms)));
  return cudaSuccess;
}

template <int BR, int BC, bool kDirect, bool kT, bool kHad, bool kSR>
cudaError_t LaunchTiles(const QuantizeArgs& a, cudaStream_t s) {
  const size_t esize = a.x_type == 0 ? 4 : 2;
  const uintptr_t xa = reinterpret_cast<uintptr_t>(a.x);
  const bool staged = (a.cols * esize) % 16 == 0 && xa % 16 == 0;
  const int64_t tiles = static_cast<int64_t>(cuda_util::GridFor(a.rows, kTile)) *
                        cuda_util::GridFor(a.cols, kTile);
  const size_t dyn = (kHad ? kTile * kTile * sizeof(float) : 0) +
                     (staged ? kTile * kTile * esize : 0);
  auto* kernel = QuantizeTileKernel<BR, BC, kDirect, kT, kHad, kSR>;
  if (dyn > 0) {
    // Static and dynamic shared memory together pass 48 KB (bf16 stage:
    // 32 KB + 20 KB), which needs the opt-in for every size, not only for
    // dynamic parts over 48 KB.
    const cudaError_t e = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dyn));
    if (e != cudaSuccess) return e;
  }
  unsigned grid = 0;
  const cudaError_t e = ResidentBlocks(kernel, kTileThreads, dyn, tiles, grid);
  if (e != cudaSuccess) return e;
  kernel<<<grid, kTileThreads, dyn, s>>>(a, staged, tiles, minifloat::RandomKey(a.direct.seed),
                                         minifloat::RandomKey(a.transposed.seed));
  return cudaGetLastError();
}

template <int BR, int BC, bool kDirect, bool kT, bool kHad>
cudaError_t Launch(const QuantizeArgs& a, cudaStream_t s) {
  const bool sr = (kDirect && a.direct.stochastic) || (kT && a.transposed.stochastic);
  return sr ? LaunchTiles<BR, BC, kDirect, kT, kHad, true>(a, s)
            : LaunchTiles<BR, BC, kDirect, kT, kHad, false>(a, s);
}

// 1x128 blocks of x itself, the activation path, as a plain streaming
// kernel: a half-warp covers one 128-element block, each lane 8 consecutive
// elements (one 16-byte load for bf16, two for fp32), amax by 4 shuffles,
// FP8 through the packed cvt.rn.satfinite (two elements per instruction)
// and one 8-byte store per lane. Every thread issues the loads of its
// kRowSlots blocks before converting any. Needs cols % 128 == 0 (blocks
// never straddle rows, so element i of x is element i of the flat array),
// 16-byte aligned x and 8-byte aligned q.
constexpr int kRowThreads = 256;
constexpr int kRowSlots = 4;

template <typename T, bool kSR, bool kE5M2>
__global__ void __launch_bounds__(kRowThreads) QuantizeRowsKernel(QuantizeArgs a) {
  const QuantizeTarget& t = a.direct;
  const T* x = static_cast<const T*>(a.x);
  const int64_t slots = a.rows * a.cols / 8;  // 8-element slots
  const uint32_t blocks_per_row = static_cast<uint32_t>(a.cols / 128);
  constexpr bool e5m2 = kE5M2;  // compile-time: one packed conversion per pair
  const float fmax = e5m2 ? 57344.0f : 448.0f;
  const minifloat::Spec spec = e5m2 ? minifloat::E5M2() : minifloat::E4M3();
  const uint32_t key = minifloat::RandomKey(t.seed);
  const float min_normal = minifloat::Pow2(1 - spec.bias);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowThreads * kRowSlots;
  // The loop condition is uniform over the block: every lane takes part in
  // the shuffles, also where its slots lie past the end of x.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kRowThreads * kRowSlots; first < slots;
       first += stride) {
    const int64_t base = first + threadIdx.x;
    cuda_util::Raw8<T> raw[kRowSlots];
#pragma unroll
    for (int u = 0; u < kRowSlots; ++u) {
      const int64_t slot = base + u * kRowThreads;
      raw[u] = cuda_util::LoadRaw8<T>(x + slot * 8, slot < slots);
    }
#pragma unroll
    for (int u = 0; u < kRowSlots; ++u) {
      // Slots of one half-warp are all inside or all outside x (slots is a
      // multiple of 16).
      const int64_t slot = base + u * kRowThreads;
      float v[8];
      cuda_util::Widen8<T>(raw[u], v);
      float m = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(v[j]));
#pragma unroll
      for (int o = 1; o < 16; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (slot >= slots) continue;
      if constexpr (sizeof(T) == 4) {
        if (a.bf16_copy != nullptr) {
          // One 16-byte store of the slot's 8 elements, rounded as a cast.
          uint4 h;
          uint32_t* hw = reinterpret_cast<uint32_t*>(&h);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
            hw[j] = *reinterpret_cast<const uint32_t*>(&pair);
          }
          reinterpret_cast<uint4*>(a.bf16_copy)[slot] = h;
        }
      }
      const float s = minifloat::BlockScale(m, fmax, a.pow2);
      if ((threadIdx.x & 15) == 0) {
        const uint32_t block = static_cast<uint32_t>(slot / 16);
        const uint32_t r = block / blocks_per_row;
        WriteScale(t, r, block - r * blocks_per_row, s);
      }
      const float inv = __frcp_rn(s);  // correctly rounded, as minifloat::Reciprocal
      float y[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = v[j] * inv;
      uint2 w;
      bool encoded = false;
      if (kSR && t.stochastic) {
        // Snapped onto the FP8 grid exactly (see minifloat::StochasticSnap),
        // then encoded by the packed conversion like nearest rounding. Slots
        // with only finite normal values (nearly all: subnormals lie 2^14
        // below the block's amax in E4M3) take the unclamped integer-add
        // snap alone (|y| <= ~fmax here) and need no NaN check afterwards;
        // the slot's four element pairs cost one hash each.
        // Finite y: finite raw elements (probed on the packed words, see
        // ProbeFinite); the multiplier always is (minifloat::BlockScale).
        uint32_t probe = 0u;
        const uint32_t* words = reinterpret_cast<const uint32_t*>(&raw[u]);
#pragma unroll
        for (int k = 0; k < 4 * static_cast<int>(sizeof(T)) / 2; ++k) {
          probe = ProbeFinite<T>(words[k], probe);
        }
        constexpr uint32_t kMagnitude = sizeof(T) == 4 ? 0x7FFFFFFFu : 0x7FFF7FFFu;
        float amin[2] = {INFINITY, INFINITY};
#pragma unroll
        for (int j = 0; j < 8; ++j) amin[j & 1] = fminf(amin[j & 1], fabsf(y[j]));
        const bool normal =
            (probe & kMagnitude) == 0u && fminf(amin[0], amin[1]) >= min_normal;
        // Element k0 + j; k0 = slot * 8 is even, so pairs are (2p, 2p + 1).
        const uint64_t k0 = static_cast<uint64_t>(slot) * 8;
        if (normal) {
#pragma unroll
          for (int p = 0; p < 4; ++p) {
            const uint32_t h = minifloat::PairHash(key, (k0 >> 1) | p);
            y[2 * p] = minifloat::StochasticSnapNormalUnclamped(spec, y[2 * p],
                                                                minifloat::PairHalf(h, false));
            y[2 * p + 1] = minifloat::StochasticSnapNormalUnclamped(
                spec, y[2 * p + 1], minifloat::PairHalf(h, true));
          }
          w = make_uint2(minifloat::EncodeNearest4(y, e5m2),
                         minifloat::EncodeNearest4(y + 4, e5m2));
          encoded = true;
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            y[j] = minifloat::StochasticSnap(spec, y[j], minifloat::RandomBits(key, k0 | j));
          }
        }
      }
      // NaN or infinite values (rare) take the scalar encoder there.
      if (!encoded) w = minifloat::EncodeNearest8(y, e5m2);
      *reinterpret_cast<uint2*>(t.q + slot * 8) = w;
    }
  }
}

// The row kernel when its layout conditions hold (see QuantizeRowsKernel);
// false: use the tile kernel.
bool RowKernelFits(const QuantizeArgs& a) {
  return a.cols % 128 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(a.direct.q) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(a.bf16_copy) % 16 == 0 &&
         a.rows * (a.cols / 128) <= static_cast<int64_t>(UINT32_MAX);
}

template <typename T, bool kSR>
cudaError_t LaunchRowsAs(const QuantizeArgs& a, cudaStream_t s) {
  const int64_t per_block = static_cast<int64_t>(kRowThreads) * kRowSlots * 8;
  const int64_t blocks = (a.rows * a.cols + per_block - 1) / per_block;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks, INT32_MAX));
  if (a.format == 2) {
    QuantizeRowsKernel<T, kSR, true><<<grid, kRowThreads, 0, s>>>(a);
  } else {
    QuantizeRowsKernel<T, kSR, false><<<grid, kRowThreads, 0, s>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t LaunchRows(const QuantizeArgs& a, cudaStream_t s) {
  const bool sr = a.direct.stochastic;
  if (a.x_type == static_cast<int>(ElemType::kFloat32)) {
    return sr ? LaunchRowsAs<float, true>(a, s) : LaunchRowsAs<float, false>(a, s);
  }
  return sr ? LaunchRowsAs<__nv_bfloat16, true>(a, s) : LaunchRowsAs<__nv_bfloat16, false>(a, s);
}

__global__ void DequantizeKernel(const uint8_t* __restrict__ q, int format,
                                 const float* __restrict__ scales, int64_t rows, int64_t cols,
                                 int br, int bc, void* x, int x_type) {
  const minifloat::Spec spec = format == 2 ? minifloat::E5M2() : minifloat::E4M3();
  const int64_t scale_cols = (cols + bc - 1) / bc;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float s = scales[(r / br) * scale_cols + c / bc];
    StoreF(x, ElemType(x_type), i, minifloat::Decode(spec, q[i]) * s);
  }
}

// DequantizeKernel on 16 consecutive elements of a row per thread (one
// 16-byte load, 32- or 64-byte stores, one scale): for rows whose length and
// scale block width are multiples of 16 and 16-byte aligned buffers (every
// 1 x 128 and 128 x 128 layout). The same decode and product, so the same
// values as DequantizeKernel.
template <typename T>
__global__ void __launch_bounds__(256)
    DequantizeVec16Kernel(const uint8_t* __restrict__ q, int format,
                          const float* __restrict__ scales, int64_t rows, int64_t cols, int br,
                          int bc, T* __restrict__ x) {
  const minifloat::Spec spec = format == 2 ? minifloat::E5M2() : minifloat::E4M3();
  const int64_t per_row = cols / 16, n = rows * per_row;
  const int64_t scale_cols = (cols + bc - 1) / bc;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < n;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = g / per_row, c = (g - r * per_row) * 16;
    const float s = scales[(r / br) * scale_cols + c / bc];
    const uint4 bits = reinterpret_cast<const uint4*>(q)[g];
    const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
    float v[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      v[e] = minifloat::Decode(spec, static_cast<uint8_t>(words[e / 4] >> (8 * (e % 4)))) * s;
    }
    if constexpr (std::is_same_v<T, float>) {
      float4* out = reinterpret_cast<float4*>(x + g * 16);
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    } else {
      __nv_bfloat162 h[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        h[k] = __halves2bfloat162(__float2bfloat16_rn(v[2 * k]), __float2bfloat16_rn(v[2 * k + 1]));
      }
      uint4* out = reinterpret_cast<uint4*>(x + g * 16);
      out[0] = *reinterpret_cast<const uint4*>(&h[0]);
      out[1] = *reinterpret_cast<const uint4*>(&h[4]);
    }
  }
}

// Random Hadamard transform of chunks of up to 4096 elements in shared
// memory; chunks are whole segments, and the butterflies of stage h < block
// never cross a segment, so one chunk transforms all its segments at once.
constexpr int kChunk = 4096;

__global__ void __launch_bounds__(kThreads)
    HadamardKernel(const void* x, void* y, int type, int64_t numel, int64_t cols, int64_t block,
                   uint64_t seed, bool inverse) {
  __shared__ float s[kChunk];
  const int64_t start = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int n = static_cast<int>(numel - start < kChunk ? numel - start : kChunk);
  const float norm = rsqrtf(static_cast<float>(block));
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float v = LoadF(x, ElemType(type), start + i);
    s[i] = inverse ? v : v * minifloat::RandomSign(seed, (start + i) % cols);
  }
  __syncthreads();
  for (int h = 1; h < block; h <<= 1) {
    for (int p = threadIdx.x; p < n / 2; p += kThreads) {
      const int i = (p / h) * 2 * h + p % h;
      const float u = s[i], w = s[i + h];
      s[i] = u + w;
      s[i + h] = u - w;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float v = s[i] * norm;
    StoreF(y, ElemType(type), start + i,
           inverse ? v * minifloat::RandomSign(seed, (start + i) % cols) : v);
  }
}

__global__ void ToE8M0Kernel(const float* __restrict__ in, uint8_t* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = ToE8M0(in[i]);
}

__global__ void FromE8M0Kernel(const uint8_t* __restrict__ in, float* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = ldexpf(1.0f, static_cast<int>(in[i]) - 127);
}

}  // namespace

cudaError_t Quantize(const QuantizeArgs& a, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  // The row kernel writes the copy (it runs wherever WritesBf16Copy holds).
  if (a.bf16_copy != nullptr && !WritesBf16Copy(a)) return cudaErrorInvalidValue;
  const bool d = a.direct.q != nullptr, t = a.transposed.q != nullptr;
  if (!d && !t) return cudaErrorInvalidValue;
  const int br = a.block_rows, bc = a.block_cols;
  if (br == 1 && bc == 128) {
    if (a.hadamard_transposed) {
      if (!t) return cudaErrorInvalidValue;
      return d ? Launch<1, 128, true, true, true>(a, s) : Launch<1, 128, false, true, true>(a, s);
    }
    if (d && t) return Launch<1, 128, true, true, false>(a, s);
    if (d) return RowKernelFits(a) ? LaunchRows(a, s) : Launch<1, 128, true, false, false>(a, s);
    return Launch<1, 128, false, true, false>(a, s);
  }
  if (a.hadamard_transposed) return cudaErrorInvalidValue;
  if (br == 128 && bc == 128) {
    if (d && t) return Launch<128, 128, true, true, false>(a, s);
    return d ? Launch<128, 128, true, false, false>(a, s) : Launch<128, 128, false, true, false>(a, s);
  }
  if (br == 32 && bc == 32) {
    if (d && t) return Launch<32, 32, true, true, false>(a, s);
    return d ? Launch<32, 32, true, false, false>(a, s) : Launch<32, 32, false, true, false>(a, s);
  }
  return cudaErrorInvalidValue;
}

bool WritesBf16Copy(const QuantizeArgs& a) {
  return a.x_type == static_cast<int>(ElemType::kFloat32) && a.direct.q != nullptr &&
         a.transposed.q == nullptr && a.block_rows == 1 && a.block_cols == 128 &&
         RowKernelFits(a);
}

cudaError_t Dequantize(const uint8_t* q, int format, const float* scales, int64_t rows,
                       int64_t cols, int block_rows, int block_cols, void* x, int x_type,
                       void* stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  if (cols % 16 == 0 && block_cols % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const unsigned grid =
        static_cast<unsigned>(std::min<int64_t>(cuda_util::GridFor(n / 16, 256), 65536));
    if (x_type == static_cast<int>(ElemType::kBFloat16)) {
      DequantizeVec16Kernel<<<grid, 256, 0, s>>>(q, format, scales, rows, cols, block_rows,
                                                 block_cols, static_cast<__nv_bfloat16*>(x));
    } else {
      DequantizeVec16Kernel<<<grid, 256, 0, s>>>(q, format, scales, rows, cols, block_rows,
                                                 block_cols, static_cast<float*>(x));
    }
    return cudaGetLastError();
  }
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(cuda_util::GridFor(n, 256), 65536));
  DequantizeKernel<<<grid, 256, 0, s>>>(
      q, format, scales, rows, cols, block_rows, block_cols, x, x_type);
  return cudaGetLastError();
}

cudaError_t Hadamard(const void* x, void* y, int type, int64_t numel, int64_t cols, int64_t block,
                     uint64_t seed, bool inverse, void* stream) {
  if (numel == 0) return cudaSuccess;
  HadamardKernel<<<cuda_util::GridFor(numel, kChunk), kThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(x, y, type, numel, cols, block, seed,
                                                        inverse);
  return cudaGetLastError();
}

cudaError_t ScalesToE8M0(const float* scales, uint8_t* out, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  ToE8M0Kernel<<<cuda_util::GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      scales, out, n);
  return cudaGetLastError();
}

cudaError_t E8M0ToScales(const uint8_t* in, float* scales, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  FromE8M0Kernel<<<cuda_util::GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      in, scales, n);
  return cudaGetLastError();
}

namespace {

// Tiled pieces: each thread codes kPieceRun consecutive elements, walking
// their (row, column) from one division (32-bit where the piece's row-major
// indices fit, `narrow`). A run that lies inside one row of one tile, whose
// operands are 16-byte (fp32) and 8-byte (codes) aligned (`vec`: the
// piece's base pointers are; runs start at multiples of kPieceRun), moves
// as two float4 and one uint2; the rest (tile borders, a piece's tail,
// unaligned pieces) element by element. Both give the same bits.
constexpr int kPieceRun = 8;

__device__ __forceinline__ void LocateInPiece(const TiledPieceArgs& p, bool narrow, int64_t i, int64_t& row,
                                              int64_t& col) {
  const int64_t f = p.start + i;
  if (narrow) {
    const uint32_t f32 = static_cast<uint32_t>(f), c32 = static_cast<uint32_t>(p.cols);
    const uint32_t r = f32 / c32;
    row = r;
    col = f32 - r * c32;
  } else {
    row = f / p.cols;
    col = f - row * p.cols;
  }
}

__device__ __forceinline__ int64_t TileAt(const TiledPieceArgs& p, int64_t tiles_per_row, int64_t row, int64_t col) {
  return p.first_tile + (row >> 7) * tiles_per_row + (col >> 7);
}

// Whether the run of kPieceRun elements from (row, col) lies in one tile
// row segment: the vector path may take it.
__device__ __forceinline__ bool RunInOneTile(const TiledPieceArgs& p, int64_t i0, int64_t col) {
  return i0 + kPieceRun <= p.numel && col + kPieceRun <= p.cols && (col >> 7) == ((col + kPieceRun - 1) >> 7);
}

__device__ __forceinline__ void Load8(const float* x, float* v) {
  const float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(x + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The loop is warp-uniform (one run of 32 x kPieceRun elements per warp
// and turn), so the lanes of a warp that end on the same tile merge their
// maxima before one atomic; a run crossing a tile border flushes the part
// before it on its own. Non-negative floats order like their bits.
__global__ void TiledPieceAmaxKernel(const float* __restrict__ x, TiledPieceArgs p, bool narrow, bool vec,
                                     float* amax) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int64_t tiles_per_row = (p.cols + 127) / 128;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w * 32 * kPieceRun < p.numel;
       w += warps) {
    const int64_t i0 = (w * 32 + lane) * kPieceRun;
    long long tile = -1;
    float m = 0.0f;
    if (i0 < p.numel) {
      int64_t row, col;
      LocateInPiece(p, narrow, i0, row, col);
      tile = TileAt(p, tiles_per_row, row, col);
      if (vec && RunInOneTile(p, i0, col)) {
        float v[kPieceRun];
        Load8(x + i0, v);
#pragma unroll
        for (int j = 0; j < kPieceRun; ++j) {
          const float a = fabsf(v[j]);
          if (a > m) m = a;  // NaN is never greater
        }
      } else {
        const int64_t end = i0 + kPieceRun < p.numel ? i0 + kPieceRun : p.numel;
        for (int64_t i = i0; i < end; ++i) {
          const long long t = TileAt(p, tiles_per_row, row, col);
          if (t != tile) {
            if (m > 0.0f) atomicMax(reinterpret_cast<unsigned*>(amax + tile), __float_as_uint(m));
            tile = t;
            m = 0.0f;
          }
          const float a = fabsf(x[i]);
          if (a > m) m = a;
          if (++col == p.cols) col = 0, ++row;
        }
      }
    }
    const unsigned group = __match_any_sync(0xffffffffu, tile);
    const unsigned mx = __reduce_max_sync(group, __float_as_uint(m));
    if (tile >= 0 && mx != 0 && lane == __ffs(group) - 1) atomicMax(reinterpret_cast<unsigned*>(amax + tile), mx);
  }
}

__global__ void TileScalesKernel(const float* amax, int64_t n, float fmax, float* scales) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) scales[i] = minifloat::BlockScale(amax[i], fmax, false);
}

template <bool kQuantize>
__global__ void TiledPieceCodeKernel(const float* __restrict__ x, const uint8_t* __restrict__ q_in, TiledPieceArgs p,
                                     bool narrow, bool vec, const float* __restrict__ scales, bool e5m2,
                                     float* x_out, uint8_t* q_out) {
  const minifloat::Spec spec = e5m2 ? minifloat::E5M2() : minifloat::E4M3();
  const int64_t tiles_per_row = (p.cols + 127) / 128;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c * kPieceRun < p.numel;
       c += threads) {
    const int64_t i0 = c * kPieceRun, end = i0 + kPieceRun < p.numel ? i0 + kPieceRun : p.numel;
    int64_t row, col;
    LocateInPiece(p, narrow, i0, row, col);
    if (vec && RunInOneTile(p, i0, col)) {
      const float s = scales[TileAt(p, tiles_per_row, row, col)];
      if (kQuantize) {
        const float factor = __frcp_rn(s);  // as minifloat::Reciprocal
        float v[kPieceRun];
        Load8(x + i0, v);
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          lo |= static_cast<uint32_t>(minifloat::Encode(spec, v[j] * factor)) << (8 * j);
          hi |= static_cast<uint32_t>(minifloat::Encode(spec, v[j + 4] * factor)) << (8 * j);
        }
        *reinterpret_cast<uint2*>(q_out + i0) = make_uint2(lo, hi);
      } else {
        const uint2 q = *reinterpret_cast<const uint2*>(q_in + i0);
        float v[kPieceRun];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          v[j] = minifloat::Decode(spec, static_cast<uint8_t>(q.x >> (8 * j))) * s;
          v[j + 4] = minifloat::Decode(spec, static_cast<uint8_t>(q.y >> (8 * j))) * s;
        }
        *reinterpret_cast<float4*>(x_out + i0) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4*>(x_out + i0 + 4) = make_float4(v[4], v[5], v[6], v[7]);
      }
      continue;
    }
    int64_t tile = -1;
    float factor = 0.0f;  // 1 / scale (quantize) or scale (dequantize)
    for (int64_t i = i0; i < end; ++i) {
      const int64_t t = TileAt(p, tiles_per_row, row, col);
      if (t != tile) {
        tile = t;
        factor = kQuantize ? __frcp_rn(scales[t]) : scales[t];  // __frcp_rn: as minifloat::Reciprocal
      }
      if (kQuantize) {
        q_out[i] = minifloat::Encode(spec, x[i] * factor);
      } else {
        x_out[i] = minifloat::Decode(spec, q_in[i]) * factor;
      }
      if (++col == p.cols) col = 0, ++row;
    }
  }
}

// Launch switches of a piece: 32-bit indices, vector path.
bool Narrow(const TiledPieceArgs& p) { return p.start + p.numel <= 0xffffffffll && p.cols <= 0xffffffffll; }
bool Aligned(const void* fp32, const void* codes) {
  return reinterpret_cast<uintptr_t>(fp32) % 16 == 0 && reinterpret_cast<uintptr_t>(codes) % 8 == 0;
}

unsigned PieceGrid(int64_t numel) {
  const unsigned g = cuda_util::GridFor((numel + kPieceRun - 1) / kPieceRun, 256);
  return g < 4096u ? (g > 0 ? g : 1u) : 4096u;
}

}  // namespace

cudaError_t TiledPieceAmax(const float* x, const TiledPieceArgs& p, float* amax, void* stream) {
  if (p.numel == 0) return cudaSuccess;
  TiledPieceAmaxKernel<<<PieceGrid(p.numel), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      x, p, Narrow(p), Aligned(x, nullptr), amax);
  return cudaGetLastError();
}

cudaError_t TileScales(const float* amax, int64_t n, int format, float* scales, void* stream) {
  if (n == 0) return cudaSuccess;
  TileScalesKernel<<<cuda_util::GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      amax, n, format == 2 ? 57344.0f : 448.0f, scales);
  return cudaGetLastError();
}

cudaError_t QuantizeTiledPiece(const float* x, const TiledPieceArgs& p, const float* scales, int format,
                               uint8_t* q, void* stream) {
  if (p.numel == 0) return cudaSuccess;
  TiledPieceCodeKernel<true><<<PieceGrid(p.numel), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      x, nullptr, p, Narrow(p), Aligned(x, q), scales, format == 2, nullptr, q);
  return cudaGetLastError();
}

cudaError_t DequantizeTiledPiece(const uint8_t* q, const TiledPieceArgs& p, const float* scales, int format,
                                 float* x, void* stream) {
  if (p.numel == 0) return cudaSuccess;
  TiledPieceCodeKernel<false><<<PieceGrid(p.numel), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      nullptr, q, p, Narrow(p), Aligned(x, q), scales, format == 2, x, nullptr);
  return cudaGetLastError();
}

}  // namespace recfleet::quant_cuda
