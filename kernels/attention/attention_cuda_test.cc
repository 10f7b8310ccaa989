// CUDA attention against the float64 CPU reference on fresh random bf16 data:
// every activation and mask at head dim 64 and 128, jagged edge cases
// (lengths 0, 1, tile +- 1, Q longer and shorter than K/V, the longest
// sequence), bias, QK-norm and RoPE. Outputs and all gradients must match to
// bf16 accuracy per sequence, and every output element must be written.

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/cuda_kernels.h"

namespace recfleet::attention {
namespace {

uint16_t ToBf16(double x) {
  const float f = static_cast<float>(x);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
double FromBf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A bf16 tensor mirrored on the device, with its exact float64 values.
struct Buffer {
  std::vector<uint16_t> host;
  std::vector<double> exact;
  void* dev = nullptr;
  Shape shape;

  Buffer(Shape s, std::mt19937_64* rng, double stddev) : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    host.assign(n, 0xffff);  // NaN: poison for outputs
    exact.assign(n, 0.0);
    if (rng != nullptr) {
      std::normal_distribution<double> dist(0.0, stddev);
      for (int64_t i = 0; i < n; ++i) {
        host[i] = ToBf16(dist(*rng));
        exact[i] = FromBf16(host[i]);
      }
    }
    EXPECT_EQ(cudaMalloc(&dev, std::max<int64_t>(n, 1) * 2), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dev, host.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Buffer() { cudaFree(dev); }
  TensorView Device() const { return MakeView(dev, DType::kBFloat16, shape, Device::kCuda); }
  TensorView Exact() { return MakeView(exact.data(), DType::kFloat64, shape); }
  void Fetch() {
    ASSERT_EQ(cudaMemcpy(host.data(), dev, host.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

struct Case {
  std::string name;
  std::vector<int64_t> lq, lk;
  int64_t heads, d;
  AttentionOptions opts;
  bool bias = false;
  bool qk_writable = false;  // AttentionInputs::qk_writable for the backward
};

// Relative error of `got` against `want` within each of the given row
// ranges (rows of `row_elems` elements), so that one wrong sequence cannot
// hide behind a large correct one.
void ExpectClose(const std::vector<uint16_t>& got, const std::vector<double>& want,
                 const std::vector<int64_t>& offsets, int64_t row_elems, const std::string& what) {
  for (size_t b = 0; b + 1 < offsets.size(); ++b) {
    double err = 0, ref = 0;
    for (int64_t i = offsets[b] * row_elems; i < offsets[b + 1] * row_elems; ++i) {
      const double g = FromBf16(got[i]);
      ASSERT_FALSE(std::isnan(g)) << what << ": element " << i << " not written (sequence " << b
                                  << ")";
      err += (g - want[i]) * (g - want[i]);
      ref += want[i] * want[i];
    }
    const double n = static_cast<double>((offsets[b + 1] - offsets[b]) * row_elems);
    EXPECT_LE(std::sqrt(err), 2e-2 * std::sqrt(ref) + 1e-3 * std::sqrt(n))
        << what << " sequence " << b << ": |err| " << std::sqrt(err) << " |ref| "
        << std::sqrt(ref);
  }
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> off{0};
  for (int64_t l : lengths) off.push_back(off.back() + l);
  return off;
}

// One case's device buffers and inputs (made synchronously), the CUDA
// forward and backward enqueued on a stream, and the check against the
// float64 reference once the stream is done.
class CaseRun {
 public:
  CaseRun(const Case& c, uint64_t seed)
      : c_(c),
        rng_(seed),
        q_off_(Offsets(c.lq)),
        k_off_(Offsets(c.lk)),
        batch_(static_cast<int64_t>(c.lq.size())),
        tq_(q_off_.back()),
        tk_(k_off_.back()),
        nbias_(BiasElements(c)),
        q_({tq_, c.heads, c.d}, &rng_, 1.0),
        k_({tk_, c.heads, c.d}, &rng_, 1.0),
        v_({tk_, c.heads, c.d}, &rng_, 1.0),
        bias_({nbias_}, &rng_, 0.5),
        dout_({tq_, c.heads, c.d}, &rng_, 1.0),
        out_({tq_, c.heads, c.d}, nullptr, 0),
        dq_({tq_, c.heads, c.d}, nullptr, 0),
        dk_({tk_, c.heads, c.d}, nullptr, 0),
        dv_({tk_, c.heads, c.d}, nullptr, 0),
        dbias_({nbias_}, nullptr, 0),
        softmax_(c.opts.activation == Activation::kSoftmax) {
    EXPECT_EQ(cudaMalloc(&lse_dev_, std::max<int64_t>(tq_ * c.heads, 1) * 4), cudaSuccess);
  }
  ~CaseRun() { cudaFree(lse_dev_); }

  // Forward then backward on `stream`; returns without waiting.
  void Enqueue(cudaStream_t stream) {
    AttentionOptions opts = c_.opts;
    opts.cuda_stream = stream;
    AttentionInputs din = Inputs(true);
    absl::Status s = AttentionForward(din, opts, out_.Device(), LseView());
    ASSERT_TRUE(s.ok()) << s;
    AttentionGrads g{dq_.Device(), dk_.Device(), dv_.Device(),
                     c_.bias ? dbias_.Device() : TensorView()};
    // The reference reads the host's exact copies: q and k on the device
    // may be overwritten.
    din.qk_writable = c_.qk_writable;
    s = AttentionBackward(din, opts, out_.Device(), LseView(), dout_.Device(), g);
    ASSERT_TRUE(s.ok()) << s;
  }

  // Compares with the reference; the enqueued work must be complete.
  void Check() {
    SCOPED_TRACE(c_.name);
    const int64_t h = c_.heads, d = c_.d;
    out_.Fetch();
    dq_.Fetch();
    dk_.Fetch();
    dv_.Fetch();
    if (c_.bias) dbias_.Fetch();
    std::vector<float> lse_got(tq_ * h);
    if (softmax_) {
      ASSERT_EQ(cudaMemcpy(lse_got.data(), lse_dev_, tq_ * h * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    // Reference on the same (exactly representable) values.
    AttentionInputs rin = Inputs(false);
    std::vector<double> ref_out(tq_ * h * d), ref_lse(tq_ * h), rdq(tq_ * h * d),
        rdk(tk_ * h * d), rdv(tk_ * h * d), rdbias(nbias_);
    TensorView ref_lse_view;
    if (softmax_) ref_lse_view = MakeView(ref_lse.data(), DType::kFloat64, {tq_, h});
    TensorView ref_out_view = MakeView(ref_out.data(), DType::kFloat64, {tq_, h, d});
    ASSERT_TRUE(AttentionForward(rin, c_.opts, ref_out_view, ref_lse_view).ok());
    AttentionGrads rg{MakeView(rdq.data(), DType::kFloat64, {tq_, h, d}),
                      MakeView(rdk.data(), DType::kFloat64, {tk_, h, d}),
                      MakeView(rdv.data(), DType::kFloat64, {tk_, h, d}),
                      c_.bias ? MakeView(rdbias.data(), DType::kFloat64, {nbias_}) : TensorView()};
    ASSERT_TRUE(
        AttentionBackward(rin, c_.opts, ref_out_view, ref_lse_view, dout_.Exact(), rg).ok());

    ExpectClose(out_.host, ref_out, q_off_, h * d, "out");
    ExpectClose(dq_.host, rdq, q_off_, h * d, "dq");
    ExpectClose(dk_.host, rdk, k_off_, h * d, "dk");
    ExpectClose(dv_.host, rdv, k_off_, h * d, "dv");
    if (c_.bias) {
      std::vector<int64_t> bias_off{0};
      for (int64_t b = 0; b < batch_; ++b) {
        bias_off.push_back(bias_off.back() + c_.lq[b] * c_.lk[b]);
      }
      ExpectClose(dbias_.host, rdbias, bias_off, h, "dbias");
    }
    for (int64_t i = 0; i < tq_ * h && softmax_; ++i) {
      if (std::isinf(ref_lse[i])) {
        EXPECT_TRUE(std::isinf(lse_got[i]) && lse_got[i] < 0) << "lse " << i;
      } else {
        EXPECT_NEAR(lse_got[i], ref_lse[i], 2e-2 * (1 + std::abs(ref_lse[i]))) << "lse " << i;
      }
    }
  }

 private:
  static int64_t BiasElements(const Case& c) {
    int64_t n = 0;
    for (size_t b = 0; b < c.lq.size(); ++b) n += c.lq[b] * c.lk[b] * c.heads;
    return n;
  }
  AttentionInputs Inputs(bool device) {
    AttentionInputs in;
    in.q.values = device ? q_.Device() : q_.Exact();
    in.q.offsets = MakeView(q_off_.data(), DType::kInt64, {batch_ + 1});
    in.k.values = device ? k_.Device() : k_.Exact();
    in.k.offsets = MakeView(k_off_.data(), DType::kInt64, {batch_ + 1});
    in.v = device ? v_.Device() : v_.Exact();
    if (c_.bias) in.bias = device ? bias_.Device() : bias_.Exact();
    return in;
  }
  TensorView LseView() const {
    if (!softmax_) return TensorView();
    return MakeView(lse_dev_, DType::kFloat32, {tq_, c_.heads}, Device::kCuda);
  }

  Case c_;
  std::mt19937_64 rng_;
  std::vector<int64_t> q_off_, k_off_;
  int64_t batch_, tq_, tk_, nbias_;
  Buffer q_, k_, v_, bias_, dout_, out_, dq_, dk_, dv_, dbias_;
  bool softmax_;
  float* lse_dev_ = nullptr;
};

void RunCase(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.name);
  CaseRun run(c, seed);
  run.Enqueue(nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  run.Check();
}

const char* ActName(Activation a) {
  return a == Activation::kSoftmax ? "softmax" : a == Activation::kGelu ? "gelu" : "silu";
}
const char* MaskName(Mask m) {
  const char* n[] = {"none", "causal", "window", "block"};
  return n[static_cast<int>(m)];
}

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(AttentionCudaTest, SelfAttentionEveryActivationAndMask) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<int64_t> lens = {0, 1, 63, 64, 65, 127, 200, 1, 129};
  uint64_t seed = 1;
  for (int64_t d : {64, 128}) {
    for (Activation a : {Activation::kSoftmax, Activation::kGelu, Activation::kSilu}) {
      for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kSlidingWindow, Mask::kBlock}) {
        Case c{absl::StrCat("self d", d, " ", ActName(a), " ", MaskName(m)), lens, lens, 2, d};
        c.opts.activation = a;
        c.opts.mask = m;
        c.opts.window = 70;
        RunCase(c, seed++);
      }
    }
  }
}

TEST(AttentionCudaTest, CrossAttentionBothWaysAndPma) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 100;
  for (int64_t d : {64, 128}) {
    for (Activation a : {Activation::kSoftmax, Activation::kGelu, Activation::kSilu}) {
      for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kSlidingWindow, Mask::kBlock}) {
        // Long Q to short K/V, short Q to long K/V, K/V empty, Q empty, PMA
        // (4 learned queries per sequence).
        Case c{absl::StrCat("cross d", d, " ", ActName(a), " ", MaskName(m)),
               {256, 1, 0, 130, 64, 4, 4},
               {32, 65, 5, 0, 200, 300, 1},
               2,
               d};
        c.opts.activation = a;
        c.opts.mask = m;
        c.opts.window = 40;
        RunCase(c, seed++);
      }
    }
  }
}

TEST(AttentionCudaTest, BiasQkNormAndRope) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 200;
  const std::vector<int64_t> lens = {65, 0, 1, 130, 64};
  const std::vector<int64_t> cross = {33, 4, 2, 70, 64};
  for (int64_t d : {64, 128}) {
    for (Activation a : {Activation::kSoftmax, Activation::kGelu, Activation::kSilu}) {
      for (Mask m : {Mask::kCausal, Mask::kBlock}) {
        Case biased{absl::StrCat("bias d", d, " ", ActName(a), " ", MaskName(m)), lens, lens, 2,
                    d};
        biased.opts.activation = a;
        biased.opts.mask = m;
        biased.bias = true;
        RunCase(biased, seed++);
        for (bool self : {true, false}) {
          Case normed{absl::StrCat("qknorm+rope ", self ? "self" : "cross", " d", d, " ",
                                   ActName(a), " ", MaskName(m)),
                      lens, self ? lens : cross, 2, d};
          normed.opts.activation = a;
          normed.opts.mask = m;
          normed.opts.qk_norm = true;
          normed.opts.rope = true;
          normed.opts.scale = 4.0;
          RunCase(normed, seed++);
        }
        Case rope{absl::StrCat("rope d", d, " ", ActName(a), " ", MaskName(m)), lens, lens, 2, d};
        rope.opts.activation = a;
        rope.opts.mask = m;
        rope.opts.rope = true;
        RunCase(rope, seed++);
        // The backward allowed to overwrite q and k (RoPE in place).
        rope.name += " qk_writable";
        rope.qk_writable = true;
        RunCase(rope, seed++);
      }
    }
  }
}

// The BlockAttention kernels on every edge of a 64-token block (empty, one
// token, 63, 64, 65, 127, 128, 129 and 191 tokens), both head dims, three
// heads, softmax with and without RoPE and SiLU with RoPE. Small enough to
// run under compute-sanitizer.
TEST(AttentionCudaTest, BlockAttentionTileEdges) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<int64_t> lens = {0, 1, 63, 64, 65, 127, 128, 129, 191};
  uint64_t seed = 500;
  for (int64_t d : {64, 128}) {
    for (Activation a : {Activation::kSoftmax, Activation::kSilu}) {
      for (bool rope : {false, true}) {
        if (a == Activation::kSilu && !rope) continue;
        Case c{absl::StrCat("block edges d", d, " ", ActName(a), rope ? " rope" : ""), lens, lens,
               3, d};
        c.opts.activation = a;
        c.opts.mask = Mask::kBlock;
        c.opts.rope = rope;
        RunCase(c, seed++);
      }
    }
  }
}

// The BlockAttention kernels on more CTAs than one wave of an SM's resident
// ones: ragged lengths (partial last blocks, empty and one-token sequences),
// head counts 1, 3 and 8, both head dims, every activation, with and
// without RoPE.
TEST(AttentionCudaTest, BlockAttentionManyBlocks) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<int64_t> lens = {1100, 64, 63, 0, 1, 700, 129, 450};
  uint64_t seed = 400;
  const struct {
    int64_t heads, d;
    Activation act;
    bool rope;
  } cases[] = {{8, 128, Activation::kSoftmax, true}, {8, 128, Activation::kSilu, true},
               {3, 128, Activation::kGelu, false},   {3, 64, Activation::kSoftmax, true},
               {1, 64, Activation::kSoftmax, false}, {3, 64, Activation::kSilu, true}};
  for (const auto& k : cases) {
    Case c{absl::StrCat("block h", k.heads, " d", k.d, " ", ActName(k.act), k.rope ? " rope" : ""),
           lens, lens, k.heads, k.d};
    c.opts.activation = k.act;
    c.opts.mask = Mask::kBlock;
    c.opts.rope = k.rope;
    RunCase(c, seed++);
  }
}

// A training step's self-attention backward with RoPE where its caller
// gives up q and k (AttentionInputs::qk_writable): RoPE rotates them in
// place and the gradients of the rotated q/k are turned into q/k's in place
// in dq/dk, on sequences of several Hopper tiles (and a few short ones),
// every activation; QK-norm (never in place: its backward reads the raw
// input) beside it. RECFLEET_ATTENTION_WGMMA_DQ=fused runs the same with dQ
// fused into the dK/dV pass (by default these lengths take the dQ pass).
TEST(AttentionCudaTest, RopeInPlaceBackward) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 300;
  const std::vector<int64_t> lens = {700, 0, 1, 300, 129};
  for (Activation a : {Activation::kSoftmax, Activation::kGelu, Activation::kSilu}) {
    for (bool qk_norm : {false, true}) {
      Case c{absl::StrCat("rope", qk_norm ? "+qknorm" : "", " in place d128 ", ActName(a)), lens,
             lens, 2, 128};
      c.opts.activation = a;
      c.opts.rope = true;
      c.opts.qk_norm = qk_norm;
      c.qk_writable = true;
      RunCase(c, seed++);
    }
  }
}

// The Hopper forward (d = 64 and 128, the default there) works on 128-row query
// tiles and 128-key tiles in a persistent grid whose two consumer
// warpgroups take turns, loading tiles inside a sequence by TMA and the
// others by cp.async, and runs of query tiles with the same short K/V range
// as one item: lengths around both tile sizes, the longest sequence, empty
// and single rows, bias, short-K/V runs longer than a group, more items
// than SMs with mixed K/V tile counts (0, 1, 2, 3); the same without turns,
// TMA and grouping, and the mma.sync kernel on the same cases (the
// variants and the grouped and many-item cases at d = 128). One test per
// variant, so that gtest shards can run them in parallel.
struct ForwardVariant {
  const char* name;
  const char* fwd;
  const char* switches;  // RECFLEET_ATTENTION_WGMMA_TURNS, _TMA, _GROUP, _OVERLAP, _CHAIN
  uint64_t seed;
};

class HopperForwardTileEdges : public ::testing::TestWithParam<ForwardVariant> {};

TEST_P(HopperForwardTileEdges, MatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<int64_t> lens = {0, 1, 127, 128, 129, 255, 257, 400};
  const std::vector<int64_t> q_lens = {300, 1, 0, 129, 128, 5, 257, 1};
  const std::vector<int64_t> k_lens = {128, 129, 3, 0, 400, 256, 1, 300};
  const ForwardVariant& var = GetParam();
  uint64_t seed = var.seed;
  setenv("RECFLEET_ATTENTION_FWD", var.fwd, 1);
  setenv("RECFLEET_ATTENTION_WGMMA_TURNS", var.switches, 1);
  setenv("RECFLEET_ATTENTION_WGMMA_TMA", var.switches, 1);
  setenv("RECFLEET_ATTENTION_WGMMA_GROUP", var.switches, 1);
  setenv("RECFLEET_ATTENTION_WGMMA_CHAIN", var.switches, 1);
  setenv("RECFLEET_ATTENTION_WGMMA_OVERLAP", var.switches, 1);
  const bool plain = std::string(var.switches) == "0";
  for (int64_t d : {128, 64}) {
    for (Activation a : {Activation::kSoftmax, Activation::kGelu, Activation::kSilu}) {
      for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kSlidingWindow}) {
        if (plain && m == Mask::kSlidingWindow) continue;
        if (d == 64 && std::string(var.name) != "wgmma") continue;
        Case self{absl::StrCat("hopper self ", var.name, " d", d, " ", ActName(a), " ",
                               MaskName(m)),
                  lens, lens, 2, d};
        self.opts.activation = a;
        self.opts.mask = m;
        self.opts.window = 200;
        RunCase(self, seed++);
        Case cross{absl::StrCat("hopper cross ", var.name, " d", d, " ", ActName(a), " ",
                                MaskName(m)),
                   q_lens, k_lens, 2, d};
        cross.opts = self.opts;
        RunCase(cross, seed++);
        if (m == Mask::kCausal) {
          self.name += " bias";
          self.bias = true;
          RunCase(self, seed++);
          cross.name += " bias";
          cross.bias = true;
          RunCase(cross, seed++);
        }
      }
    }
  }
  // Short K/V behind long Q: 9 query tiles make groups of 4, 4 and 1.
  for (Activation a : {Activation::kSoftmax, Activation::kGelu, Activation::kSilu}) {
    Case grouped{absl::StrCat("hopper grouped ", var.name, " ", ActName(a)),
                 {1100, 640, 5, 0, 513},
                 {200, 256, 256, 100, 1},
                 2,
                 128};
    grouped.opts.activation = a;
    grouped.bias = a == Activation::kSilu;
    RunCase(grouped, seed++);
  }
  // Many items: CTAs loop over several, with 0..3 K/V tiles each, so the
  // ring buffers wrap and the warpgroups' turns cross item borders.
  std::mt19937_64 rng(seed);
  std::vector<int64_t> many_q(100), many_k(100);
  for (size_t i = 0; i < many_q.size(); ++i) {
    many_q[i] = static_cast<int64_t>(rng() % 300);
    many_k[i] = i % 7 == 0 ? 0 : static_cast<int64_t>(rng() % 300);
  }
  for (Activation a : {Activation::kSoftmax, Activation::kGelu, Activation::kSilu}) {
    Case many{absl::StrCat("hopper many items ", var.name, " ", ActName(a)), many_q, many_k, 2,
              128};
    many.opts.activation = a;
    RunCase(many, seed++);
  }
  // A negative scale: full softmax tiles cannot keep their scores raw
  // (the row maximum does not commute with it) and scale them first.
  for (int64_t d : {128, 64}) {
    Case negative{absl::StrCat("hopper negative scale ", var.name, " d", d), lens, lens, 2, d};
    negative.opts.scale = -0.3;
    RunCase(negative, seed++);
  }
  unsetenv("RECFLEET_ATTENTION_FWD");
  unsetenv("RECFLEET_ATTENTION_WGMMA_TURNS");
  unsetenv("RECFLEET_ATTENTION_WGMMA_TMA");
  unsetenv("RECFLEET_ATTENTION_WGMMA_GROUP");
  unsetenv("RECFLEET_ATTENTION_WGMMA_CHAIN");
  unsetenv("RECFLEET_ATTENTION_WGMMA_OVERLAP");
}

// Test names from the variants' names ("wgmma plain" -> "wgmma_plain").
template <typename Variant>
std::string VariantName(const ::testing::TestParamInfo<Variant>& info) {
  std::string name = info.param.name;
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    AttentionCudaTest, HopperForwardTileEdges,
    ::testing::Values(ForwardVariant{"wgmma", "wgmma", "1", 400},
                      ForwardVariant{"wgmma plain", "wgmma", "0", 1400},
                      ForwardVariant{"mma", "mma", "1", 2400}),
    VariantName<ForwardVariant>);

// The Hopper backward (the default at d = 64 and 128): dK/dV over 128-key
// tiles streaming 64-query tiles through a three-stage ring in a persistent
// grid, with dQ added by TMA reduce-add (RECFLEET_ATTENTION_WGMMA_DQ=fused;
// at d = 64 the consumers take turns) or from a separate pass over 128-query
// tiles (=pass, and always without TMA), the next item's stationary tiles
// prefetched into a second buffer (where shared memory allows; switched off
// together with TMA). Lengths around both tile sizes,
// sequences long enough for the ring to wrap within an item, more items
// than SMs (the stationary tiles reload), every activation with each mask,
// bias (dbias); then the mma.sync backward (RECFLEET_ATTENTION_BWD=mma) on
// the same cases. One test per (backward, TMA) variant, so that gtest shards
// can run them in parallel.
struct BackwardVariant {
  const char* name;
  const char* bwd;  // "wgmma" (fused dQ), "wgmma-pass" or "mma"
  const char* tma;  // RECFLEET_ATTENTION_WGMMA_TMA and _STAT_PREFETCH
  uint64_t seed;
};

class HopperBackwardTileEdges : public ::testing::TestWithParam<BackwardVariant> {};

TEST_P(HopperBackwardTileEdges, MatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<int64_t> lens = {0, 1, 63, 64, 65, 127, 128, 129, 191, 700};
  const std::vector<int64_t> q_lens = {700, 1, 0, 129, 64, 5, 257, 1, 65};
  const std::vector<int64_t> k_lens = {65, 129, 3, 0, 700, 256, 1, 300, 64};
  std::mt19937_64 len_rng(7);
  std::vector<int64_t> many(150);
  for (int64_t& l : many) l = static_cast<int64_t>(len_rng() % 260);
  const BackwardVariant& var = GetParam();
  uint64_t seed = var.seed;
  const char* bwd = var.bwd;
  setenv("RECFLEET_ATTENTION_BWD", std::string(bwd) == "mma" ? "mma" : "wgmma", 1);
  setenv("RECFLEET_ATTENTION_WGMMA_DQ", std::string(bwd) == "wgmma-pass" ? "pass" : "fused", 1);
  const char* tma = var.tma;
  setenv("RECFLEET_ATTENTION_WGMMA_TMA", tma, 1);
  setenv("RECFLEET_ATTENTION_WGMMA_STAT_PREFETCH", tma, 1);
  for (int64_t d : {64, 128}) {
    for (Activation a : {Activation::kSoftmax, Activation::kGelu, Activation::kSilu}) {
      for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kSlidingWindow}) {
        const std::string tag =
            absl::StrCat(bwd, " tma=", tma, " d", d, " ", ActName(a), " ", MaskName(m));
        Case self{absl::StrCat("backward self ", tag), lens, lens, 2, d};
        self.opts.activation = a;
        self.opts.mask = m;
        self.opts.window = 150;
        self.bias = m == Mask::kCausal;
        RunCase(self, seed++);
        Case cross{absl::StrCat("backward cross ", tag), q_lens, k_lens, 2, d};
        cross.opts = self.opts;
        cross.bias = m == Mask::kNone;
        RunCase(cross, seed++);
      }
      Case lots{absl::StrCat("backward many items ", bwd, " tma=", tma, " d", d, " ",
                             ActName(a)),
                many, many, 2, d};
      lots.opts.activation = a;
      lots.opts.mask = Mask::kCausal;
      RunCase(lots, seed++);
    }
  }
  unsetenv("RECFLEET_ATTENTION_BWD");
  unsetenv("RECFLEET_ATTENTION_WGMMA_DQ");
  unsetenv("RECFLEET_ATTENTION_WGMMA_TMA");
  unsetenv("RECFLEET_ATTENTION_WGMMA_STAT_PREFETCH");
}

INSTANTIATE_TEST_SUITE_P(AttentionCudaTest, HopperBackwardTileEdges,
                         ::testing::Values(BackwardVariant{"wgmma_tma", "wgmma", "1", 500},
                                           BackwardVariant{"wgmma_no_tma", "wgmma", "0", 1500},
                                           BackwardVariant{"wgmma_pass", "wgmma-pass", "1", 2500},
                                           BackwardVariant{"mma", "mma", "1", 3500}),
                         VariantName<BackwardVariant>);

// The backward's dQ through fp32 atomics in the dK/dV pass instead of the
// separate pass.
TEST(AttentionCudaTest, AtomicDqMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  setenv("RECFLEET_ATTENTION_DQ", "atomic", 1);
  uint64_t seed = 300;
  for (int64_t d : {64, 128}) {
    for (Activation a : {Activation::kSoftmax, Activation::kSilu}) {
      for (Mask m : {Mask::kNone, Mask::kSlidingWindow}) {
        Case c{absl::StrCat("atomic dq d", d, " ", ActName(a), " ", MaskName(m)),
               {0, 1, 63, 200, 65, 4},
               {3, 1, 63, 200, 130, 70},
               2,
               d};
        c.opts.activation = a;
        c.opts.mask = m;
        c.opts.window = 70;
        c.bias = m == Mask::kNone;
        RunCase(c, seed++);
      }
    }
  }
  unsetenv("RECFLEET_ATTENTION_DQ");
}

// Lengths for the plan tests: `n` sequences of random length below 300,
// sequence 0 of length `first` (distinct `first` values make distinct
// offsets, hence distinct plans).
Case PlanCase(const std::string& name, int64_t first, std::mt19937_64& rng, Activation a) {
  std::vector<int64_t> lens{first};
  for (int i = 0; i < 5; ++i) lens.push_back(static_cast<int64_t>(rng() % 300));
  Case c{name, lens, lens, 2, 128};
  c.opts.activation = a;
  c.opts.mask = Mask::kCausal;
  return c;
}

// A training step brings new offsets: planning and uploading them must not
// wait for the device. The stream is held by a host function until every
// call has returned (or a watchdog gives up after 30 s); forward and
// backward with eight new plans must return while it is held, and be
// right once it runs. Each held case's kernels ran before (a twin with one
// more, empty, sequence: a different plan with the same tiles), since a
// kernel's first launch may load its module, which may wait for the device.
TEST(AttentionCudaTest, NewPlansDoNotWaitForTheDevice) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::mt19937_64 rng(900);
  std::vector<std::unique_ptr<CaseRun>> warm, held;
  for (int i = 0; i < 8; ++i) {
    const Case c = PlanCase(absl::StrCat("held stream, plan ", i), 400 + i, rng,
                            i % 2 ? Activation::kSilu : Activation::kSoftmax);
    Case twin = c;
    twin.name += " (twin, before)";
    twin.lq.push_back(0);
    twin.lk.push_back(0);
    warm.push_back(std::make_unique<CaseRun>(twin, 900 + i));
    held.push_back(std::make_unique<CaseRun>(c, 900 + i));
  }
  for (auto& run : warm) run->Enqueue(stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  std::atomic<bool> release{false};
  auto hold = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  ASSERT_EQ(cudaLaunchHostFunc(stream, hold, &release), cudaSuccess);
  std::thread watchdog([&release] {
    for (int i = 0; i < 3000 && !release.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    release.store(true);
  });
  for (auto& run : held) run->Enqueue(stream);
  const bool returned_while_held = !release.exchange(true);
  watchdog.join();
  EXPECT_TRUE(returned_while_held) << "a call waited for the held stream";
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (auto& run : warm) run->Check();
  for (auto& run : held) run->Check();
  cudaStreamDestroy(stream);
}

// More new plans than the cache holds (32), enqueued on two streams without
// waiting: evicted plans' memory is reused while kernels that read it may
// still be queued. Each plan is also used from the other stream by a second
// case with the same lengths (the upload on one stream, the use on the
// other). Every result must match the reference.
TEST(AttentionCudaTest, PlansEvictedAndReusedUnderLoad) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t streams[2];
  for (cudaStream_t& s : streams) ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::mt19937_64 rng(950);
  std::vector<std::unique_ptr<CaseRun>> runs;
  for (int i = 0; i < 40; ++i) {
    const Case c = PlanCase(absl::StrCat("under load, plan ", i), 300 + i, rng,
                            i % 3 == 0 ? Activation::kGelu : Activation::kSoftmax);
    runs.push_back(std::make_unique<CaseRun>(c, 950 + 2 * i));
    Case twin = c;
    twin.name += " (other stream)";
    runs.push_back(std::make_unique<CaseRun>(twin, 951 + 2 * i));
  }
  for (size_t i = 0; i < runs.size(); ++i) runs[i]->Enqueue(streams[(i + i / 2) % 2]);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (auto& run : runs) run->Check();
  for (cudaStream_t& s : streams) cudaStreamDestroy(s);
}

// The kernels' GELU and SiLU (the forward's form and the backward's value and
// derivative) against the exact functions on a dense grid over [-12, 12]
// and far out: within the errors attention.h documents, every value finite.
TEST(AttentionCudaTest, ActivationsWithinTheirDocumentedError) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<float> x;
  for (int i = -24000; i <= 24000; ++i) x.push_back(static_cast<float>(i) * 5e-4f);
  for (float v : {30.f, 100.f, 1e3f, 1e6f, 1e18f}) {
    x.push_back(v);
    x.push_back(-v);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 4 * n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  for (int act : {cuda_impl::kActGelu, cuda_impl::kActSilu}) {
    const bool gelu = act == cuda_impl::kActGelu;
    ASSERT_EQ(cuda_impl::LaunchActivation(act, dev, dev + n, dev + 2 * n, dev + 3 * n, n, nullptr),
              0);
    std::vector<float> got(3 * n);
    ASSERT_EQ(cudaMemcpy(got.data(), dev + n, 3 * n * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    double worst_y = 0, worst_dy = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double xi = x[i], ax = std::fabs(xi);
      double y, dy, y_tol, dy_tol;
      if (gelu) {
        const double phi = 0.5 * (1.0 + std::erf(xi / std::sqrt(2.0)));
        y = xi * phi;
        dy = phi + xi * std::exp(-0.5 * xi * xi) / std::sqrt(2.0 * 3.14159265358979323846);
        y_tol = 5.5e-4 + 2.5e-4 * ax;
        dy_tol = 2.5e-3;
      } else {
        const double sig = 1.0 / (1.0 + std::exp(-xi));
        y = xi * sig;
        dy = sig * (1.0 + xi * (1.0 - sig));
        y_tol = 1e-6 + 2.5e-4 * ax;
        dy_tol = 1e-3;
      }
      for (int k = 0; k < 3; ++k) {
        const float g = got[k * n + i];
        ASSERT_TRUE(std::isfinite(g)) << "activation " << act << " at " << xi << ": " << g;
        const double err = std::fabs(g - (k < 2 ? y : dy));
        const double tol = k < 2 ? y_tol : dy_tol;
        EXPECT_LE(err, tol) << (gelu ? "GELU" : "SiLU") << (k == 0 ? " forward" : " backward")
                            << (k == 2 ? " derivative" : "") << " at " << xi << ": " << g
                            << " vs " << (k < 2 ? y : dy);
        if (k < 2) worst_y = std::max(worst_y, err / (5e-4 + 2.5e-4 * ax));
        if (k == 2) worst_dy = std::max(worst_dy, err);
      }
    }
    std::printf("%s: max error / (5e-4 + 2.5e-4 |x|) %.3f, derivative max error %.2e\n",
                gelu ? "GELU" : "SiLU", worst_y, worst_dy);
  }
  cudaFree(dev);
}

TEST(AttentionCudaTest, RejectsUnsupportedHeadDim) {
  std::vector<int64_t> off{0, 4};
  AttentionInputs in;
  in.q.values = MakeView(nullptr, DType::kBFloat16, {4, 1, 32}, Device::kCuda);
  in.q.offsets = MakeView(off.data(), DType::kInt64, {2});
  in.k = in.q;
  in.v = in.q.values;
  const absl::Status s = ValidateAttention(in, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("head_dim 64 or 128"), std::string::npos) << s;
}

}  // namespace
}  // namespace recfleet::attention
