#ifndef RECFLEET_KERNELS_ATTENTION_CUDA_KERNELS_H_
#define RECFLEET_KERNELS_ATTENTION_CUDA_KERNELS_H_

// The CUDA kernels' launch interface, free of CUDA types so that the host
// planner (attention_cuda.cu) and the kernels (cuda_*.cu) share it. Launchers
// trust their arguments: attention_cuda.cu validates and plans.

#include <cstdint>

namespace recfleet::attention::cuda_impl {

enum : int { kMaskNone = 0, kMaskCausal = 1, kMaskWindow = 2, kMaskBlock = 3 };
enum : int { kActSoftmax = 0, kActGelu = 1, kActSilu = 2 };

// Tile rows. Every kernel streams 64-row tiles of the other side; the
// forward's query tiles have 64 * kForwardRowBlocks rows (each warp owns
// kForwardRowBlocks blocks of 16), the dQ pass's 64, the dK/dV pass's key
// tiles 64, BlockAttention's tiles are its 64-token blocks.
inline constexpr int kForwardRowBlocks = 2;
inline constexpr int kForwardTileRows = 64 * kForwardRowBlocks;
inline constexpr int kTileRows = 64;
// Key tiles of the Hopper dK/dV pass (64 keys per consumer warpgroup).
inline constexpr int kWideKeyTileRows = 128;

// One CTA's work: a tile of one (sequence, head) and the range of rows
// of the other side its inner loop visits. For the forward and the dQ pass
// the tile is of queries and the inner range of keys; for the dK/dV pass the
// reverse. Planned on the host from the offsets and the mask, non-empty
// inner tiles only, ordered longest first.
struct WorkItem {
  int64_t q_start;    // global row of the sequence's query 0
  int64_t k_start;    // global row of the sequence's key 0
  int64_t bias_base;  // bias element of (sequence, head 0, 0, 0)
  int q_len;
  int k_len;
  int tile_row;     // first row (within the sequence) of the tile
  int head;         // set by the kernel: CTAs run items x heads
  int inner_begin;  // inner rows [inner_begin, inner_end), within the sequence
  int inner_end;
  // Hopper forward only: the item covers q_tiles consecutive query tiles
  // from tile_row on, all seeing the same inner rows (at most
  // kWgmmaResidentKeys of them), so their K/V tiles load once.
  int q_tiles;
};

// Keys a grouped Hopper forward item may see: its K/V tiles must all stay
// resident in the kernel's two K/V stages while its query tiles pass.
inline constexpr int kWgmmaResidentKeys = 2 * kForwardTileRows;
// Query tiles per grouped item: more saves K/V reloads, fewer keeps the
// longest-first schedule fine-grained.
inline constexpr int kWgmmaMaxGroup = 4;

struct KernelParams {
  const void* q = nullptr;  // bf16 [rows, heads, d]
  const void* k = nullptr;
  const void* v = nullptr;
  const void* bias = nullptr;  // bf16, may be null
  const void* out = nullptr;   // forward output (backward reads it)
  const void* dout = nullptr;
  void* o = nullptr;   // forward output (written)
  float* lse = nullptr;        // [rows, heads], natural log
  const float* dsum = nullptr; // [rows, heads], rowsum(dO * O) (softmax backward)
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* dbias = nullptr;
  // When set, the dK/dV pass also accumulates dQ here ([rows, heads, d],
  // zeroed by the caller) with atomics (mma.sync: per element; Hopper: TMA
  // reduce-add of fp32 blocks), and no dQ pass is needed.
  float* dq_accum = nullptr;
  const WorkItem* items = nullptr;
  int num_items = 0;  // the grid is num_items * heads CTAs
  int heads = 0;
  int head_dim = 0;
  int activation = kActSoftmax;
  int mask = kMaskNone;
  int window = 0;
  float scale = 1.f;
  bool rope = false;  // BlockAttention only: RoPE fused into the tile loads
  float log2_theta = 0.f;
  // Hopper forward: the two consumer warpgroups take turns issuing their
  // GEMMs (ping-pong); off, both issue as soon as their data is ready.
  bool wgmma_turns = true;
  // Hopper forward and backward: tiles that lie inside their sequence load
  // through the tensor memory accelerator (TMA); off, or where the tensor
  // maps cannot be made, every tile loads with cp.async (and the backward
  // forms dQ in its separate pass: the fused dQ adds by TMA).
  bool wgmma_tma = true;
  // Hopper forward, SiLU and GELU: the activation of S_n overlaps the
  // warpgroup's own P_{n-1} V_{n-1}; off, it waits for it.
  bool wgmma_overlap = true;
  // Hopper forward, SiLU and GELU: a query tile's last P V is issued with
  // the next query tile's first S (the GEMM chain runs across tiles and
  // items); off, every tile ends with a step of its own for it (and starts
  // with a discarded P V).
  bool wgmma_chain = true;
  // Hopper backward: the next item's stationary tiles load into a second
  // buffer while this item is computed (where shared memory allows); off,
  // one buffer, reloaded once both consumers finished the item.
  bool wgmma_stat_prefetch = true;
  // FP8 forward: 192-key K/V tiles instead of 128 (Fp8Config); FP8
  // backward's dQ pass: 128-row streamed K/V tiles instead of 64.
  bool fp8_wide_keys = false;
  int64_t q_rows = 0;   // rows of q and dout (the Hopper kernels' tensor maps)
  int64_t kv_rows = 0;  // rows of k and v
  // FP8 forward (LaunchJaggedForwardFp8) only: q and k are then e4m3
  // [rows, heads, d] and v is V^T, e4m3 [heads * d, vt_cols] (Fp8Operands).
  const float* q_scale = nullptr;  // [q_rows, heads]
  const float* v_scale = nullptr;  // [heads, d]
  int64_t vt_cols = 0;
};

// The FP8 (e4m3) forward's operands, made from bf16 q, k, v by
// LaunchFp8Quantize. Every scale is a power of two (dequantization exact):
//   k8[r, h, c]  = k[r, h, c] / k_scale[h, c]   (per head and channel, over
//                  all keys: K's outliers sit in channels)
//   q8[r, h, c]  = q[r, h, c] * k_scale[h, c] / q_scale[r, h]   (K's channel
//                  scales folded into Q, then one scale per token and head
//                  over the whole reduction dimension of Q K^T), so that
//                  <q, k> = q_scale[r, h] * <q8, k8> exactly up to rounding
//   vt8[h d + c, 32 b + s] = v[32 b + KeyOfSlot(s), h, c] / v_scale[h, c]
//                  (V^T, so that the P V GEMM reads V K-major, its keys
//                  permuted inside each 32-key block to match the P
//                  fragments (cuda_wgmma_fp8.cu); keys >= rows are zero)
// vt_cols is rows rounded up to 16 (TMA row pitch).
struct Fp8Operands {
  void* q8 = nullptr;
  void* k8 = nullptr;
  void* vt8 = nullptr;
  float* q_scale = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  uint32_t* amax = nullptr;  // scratch [2, heads, d], zeroed by the caller
  int64_t vt_cols = 0;
};
inline int64_t Fp8VtCols(int64_t kv_rows) { return (kv_rows + 15) / 16 * 16; }
// Fills `ops` from bf16 q [q_rows, heads, d], k and v [kv_rows, heads, d].
int LaunchFp8Quantize(const void* q, const void* k, const void* v, int64_t q_rows,
                      int64_t kv_rows, int heads, int head_dim, const Fp8Operands& ops,
                      void* stream);
// The Hopper FP8 forward (softmax, head dim 128, no bias, no fused RoPE;
// Fp8ForwardSupports) over the planner's grouped forward tiles.
bool Fp8ForwardSupports(const KernelParams& p);
int LaunchJaggedForwardFp8(const KernelParams& p, int sms, void* stream);

// The FP8 (e4m3) backward's operands, made from bf16 q, k, v and dout by
// LaunchFp8BackwardQuantize (cuda_wgmma_fp8_bwd.cu has the derivation).
// Every scale is a power of two:
//   k8 = k / k_scale[h, c], v8 = v / v_scale[h, c]      (per channel)
//   q8[r, h, :] = q * k_scale[h, :] / q_scale[r, h]      (as the forward's)
//   do8[r, h, :] = dout * v_scale[h, :] / do_scale[r, h]  (V's channel scales
//                  folded into dO, one scale per token over dO V^T's reduction)
//   qt8, dot8, kt8: q^T / qt_scale[h, c], dout^T / dot_scale[h, c], k^T /
//                  k_scale[h, c], [heads * d, cols] with tokens permuted in
//                  32-token blocks as Fp8Operands::vt8 (cols: rows rounded up
//                  to 16, Fp8VtCols)
struct Fp8BackwardOperands {
  void* q8 = nullptr;
  void* k8 = nullptr;
  void* v8 = nullptr;
  void* do8 = nullptr;
  void* qt8 = nullptr;
  void* dot8 = nullptr;
  void* kt8 = nullptr;
  float* q_scale = nullptr;   // [q_rows, heads]
  float* do_scale = nullptr;  // [q_rows, heads]
  float* k_scale = nullptr;   // [heads, d] each
  float* v_scale = nullptr;
  float* qt_scale = nullptr;
  float* dot_scale = nullptr;
  // rowsum(dO * O) [q_rows, heads] of the e4m3 dO and O quantized with
  // v_scale: do_scale[r, h] * <do8[r, h, :], e4m3(out[r, h, :] / v_scale[h, :])>.
  float* dsum = nullptr;
  uint32_t* amax = nullptr;  // scratch [4, heads, d], zeroed by the caller
  int64_t q_cols = 0;        // Fp8VtCols(q_rows)
  int64_t kv_cols = 0;       // Fp8VtCols(kv_rows)
};
// Fills `ops` from bf16 q, dout, out (the forward's output) [q_rows, heads,
// d] and k, v [kv_rows, heads, d].
int LaunchFp8BackwardQuantize(const void* q, const void* k, const void* v, const void* dout,
                              const void* out, int64_t q_rows, int64_t kv_rows, int heads, int head_dim,
                              const Fp8BackwardOperands& ops, void* stream);
// The Hopper FP8 backward (the shapes of Fp8ForwardSupports): the dQ pass
// over the forward's query tiles (dkdv false) or the dK/dV pass over key
// tiles of kWideKeyTileRows (true); p carries the items, the mask, the
// scale, lse, q_rows, kv_rows and the bf16 outputs dq or dk and dv.
int LaunchJaggedBackwardFp8(const KernelParams& p, const Fp8BackwardOperands& ops, bool dkdv,
                            int sms, void* stream);

// Each returns a cudaError_t as int (0 = success) of the launch.
int LaunchJaggedForward(const KernelParams& p, void* stream);
int LaunchJaggedBackwardDq(const KernelParams& p, void* stream);
int LaunchJaggedBackwardDkDv(const KernelParams& p, void* stream);
// The Hopper (wgmma, warp-specialized, persistent) forward for the shapes
// WgmmaForwardSupports accepts; `sms` is the device's SM count (the grid).
bool WgmmaForwardSupports(const KernelParams& p);
int LaunchJaggedForwardWgmma(const KernelParams& p, int sms, void* stream);
// The Hopper backward (two warp-specialized persistent passes, no atomics)
// for the shapes WgmmaBackwardSupports accepts: the dQ pass over the
// forward's query tiles (kForwardTileRows), the dK/dV pass over key tiles of
// kWideKeyTileRows.
// With dq_accum set (zeroed fp32, where WgmmaFusedDqSupports), the dK/dV
// pass also adds dQ into it by TMA reduce-add and no dQ pass runs.
bool WgmmaBackwardSupports(const KernelParams& p);
bool WgmmaFusedDqSupports(const KernelParams& p);
int LaunchJaggedBackwardDqWgmma(const KernelParams& p, int sms, void* stream);
int LaunchJaggedBackwardDkDvWgmma(const KernelParams& p, int sms, void* stream);
int LaunchBlockForward(const KernelParams& p, void* stream);
int LaunchBlockBackward(const KernelParams& p, void* stream);

// Row-wise pre/post passes on [rows, heads, d] bf16 tensors.
struct TransformParams {
  const void* x = nullptr;   // raw q or k
  const void* dy = nullptr;  // backward: dLoss/d(transformed)
  void* y = nullptr;         // forward: transformed; backward: dLoss/dx
  const int64_t* own_offsets = nullptr;   // device, [batch + 1]
  const int64_t* peer_offsets = nullptr;  // device, [batch + 1] (the other side)
  int64_t rows = 0;
  int batch = 0;
  int heads = 0;
  int head_dim = 0;
  bool is_query = false;  // positions pq_i = i + Lk - Lq, else j
  bool qk_norm = false;
  bool rope = false;
  float log2_theta = 0.f;
};
int LaunchQkTransform(const TransformParams& p, void* stream);
int LaunchQkTransformBackward(const TransformParams& p, void* stream);
// y[i] = bf16(x[i]) for n elements.
int LaunchFloatToBf16(const float* x, void* y, int64_t n, void* stream);
// dsum[r, h] = sum_c dout[r, h, c] * out[r, h, c].
int LaunchRowDot(const void* dout, const void* out, float* dsum, int64_t rows, int heads,
                 int head_dim, void* stream);
// GELU or SiLU (kActGelu, kActSilu) at n points (device arrays), as the
// kernels compute them: y_forward as the forward does, y_backward and dy
// (the derivative) as the backward does. cudaErrorInvalidValue for softmax.
int LaunchActivation(int activation, const float* x, float* y_forward, float* y_backward,
                     float* dy, int64_t n, void* stream);

}  // namespace recfleet::attention::cuda_impl

#endif  // RECFLEET_KERNELS_ATTENTION_CUDA_KERNELS_H_
