// CPU reference of the attention API: plain loops in float64, exact
// activations, no tiling. It is the oracle the CUDA kernels are tested
// against, so it favours obviousness over speed.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_internal.h"

namespace recfleet::attention::internal {
namespace {

double Load(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kFloat64:
      return t.as<const double>()[i];
    case DType::kFloat32:
      return t.as<const float>()[i];
    default: {  // bf16: the high half of an fp32.
      const uint32_t bits = static_cast<uint32_t>(t.as<const uint16_t>()[i]) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      return f;
    }
  }
}

void Store(const TensorView& t, int64_t i, double x) {
  switch (t.dtype) {
    case DType::kFloat64:
      t.as<double>()[i] = x;
      break;
    case DType::kFloat32:
      t.as<float>()[i] = static_cast<float>(x);
      break;
    default: {  // bf16, round to nearest even.
      const float f = static_cast<float>(x);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof(bits));
      if (std::isnan(f)) {
        bits = 0x7fc00000u;
      } else {
        bits += 0x7fffu + ((bits >> 16) & 1u);
      }
      t.as<uint16_t>()[i] = static_cast<uint16_t>(bits >> 16);
    }
  }
}

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

double Act(Activation a, double x) {
  switch (a) {
    case Activation::kGelu:
      return 0.5 * x * (1.0 + std::erf(x * kInvSqrt2));
    case Activation::kSilu:
      return x / (1.0 + std::exp(-x));
    default:
      return x;
  }
}

double ActGrad(Activation a, double x) {
  switch (a) {
    case Activation::kGelu:
      return 0.5 * (1.0 + std::erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * std::exp(-0.5 * x * x);
    case Activation::kSilu: {
      const double sg = 1.0 / (1.0 + std::exp(-x));
      return sg * (1.0 + x * (1.0 - sg));
    }
    default:
      return 1.0;
  }
}

// One sequence's rows of one head, as a dense [rows, d] float64 matrix.
struct Rows {
  int64_t n = 0, d = 0;
  std::vector<double> x;
  double* row(int64_t i) { return &x[i * d]; }
};

Rows Gather(const TensorView& t, int64_t start, int64_t n, int64_t h) {
  const int64_t heads = t.dim(1), d = t.dim(2);
  Rows r{n, d, std::vector<double>(n * d)};
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < d; ++c) r.x[i * d + c] = Load(t, ((start + i) * heads + h) * d + c);
  }
  return r;
}

void Scatter(const Rows& r, const TensorView& t, int64_t start, int64_t h) {
  const int64_t heads = t.dim(1), d = t.dim(2);
  for (int64_t i = 0; i < r.n; ++i) {
    for (int64_t c = 0; c < d; ++c) Store(t, ((start + i) * heads + h) * d + c, r.x[i * d + c]);
  }
}

// The QK-norm and RoPE applied to raw rows (positions = first_pos + i),
// keeping what the backward needs.
struct Transformed {
  Rows y;                     // the vectors that enter the dot product
  std::vector<double> rnorm;  // 1 / sqrt(|x|^2 + eps) per row (QK-norm)
  std::vector<double> normed; // x * rnorm, before RoPE (QK-norm)
};

void Rotate(const AttentionOptions& o, double pos, double* x, int64_t d, bool inverse) {
  const int64_t half = d / 2;
  for (int64_t c = 0; c < half; ++c) {
    const double angle = pos * std::pow(o.rope_theta, -2.0 * c / d);
    const double cs = std::cos(angle), sn = inverse ? -std::sin(angle) : std::sin(angle);
    const double a = x[c], b = x[c + half];
    x[c] = a * cs - b * sn;
    x[c + half] = b * cs + a * sn;
  }
}

Transformed Transform(const AttentionOptions& o, Rows x, int64_t first_pos) {
  Transformed t;
  const int64_t d = x.d;
  if (o.qk_norm) {
    t.rnorm.resize(x.n);
    for (int64_t i = 0; i < x.n; ++i) {
      double ss = 0;
      for (int64_t c = 0; c < d; ++c) ss += x.row(i)[c] * x.row(i)[c];
      t.rnorm[i] = 1.0 / std::sqrt(ss + kQkNormEpsilon);
      for (int64_t c = 0; c < d; ++c) x.row(i)[c] *= t.rnorm[i];
    }
    t.normed = x.x;
  }
  if (o.rope) {
    for (int64_t i = 0; i < x.n; ++i) Rotate(o, first_pos + i, x.row(i), d, false);
  }
  t.y = std::move(x);
  return t;
}

// Chain rule back through Transform: g holds dLoss/dy on entry and
// dLoss/dx on exit.
void TransformBackward(const AttentionOptions& o, const Transformed& t, int64_t first_pos,
                       Rows& g) {
  const int64_t d = g.d;
  if (o.rope) {
    for (int64_t i = 0; i < g.n; ++i) Rotate(o, first_pos + i, g.row(i), d, true);
  }
  if (o.qk_norm) {
    for (int64_t i = 0; i < g.n; ++i) {
      const double* yn = &t.normed[i * d];
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += yn[c] * g.row(i)[c];
      for (int64_t c = 0; c < d; ++c) g.row(i)[c] = t.rnorm[i] * (g.row(i)[c] - yn[c] * dot);
    }
  }
}

// Everything one (sequence, head) needs, recomputed by forward and backward.
struct Problem {
  int64_t lq = 0, lk = 0, d = 0;
  Transformed q, k;
  Rows v;
  std::vector<KeyRange> keys;  // per query
  std::vector<double> s;       // scores [lq, lk] (only visible entries used)
  std::vector<double> p;       // act(s) or softmax probabilities
  std::vector<double> lse;     // per query (softmax)
};

Problem Compute(const AttentionInputs& in, const AttentionOptions& o, int64_t b, int64_t h) {
  Problem pr;
  const int64_t q0 = in.q.offset(b), k0 = in.k.offset(b);
  pr.lq = in.q.length(b);
  pr.lk = in.k.length(b);
  pr.d = in.q.values.dim(2);
  const int64_t heads = in.q.values.dim(1);
  pr.q = Transform(o, Gather(in.q.values, q0, pr.lq, h), pr.lk - pr.lq);
  pr.k = Transform(o, Gather(in.k.values, k0, pr.lk, h), 0);
  pr.v = Gather(in.v, k0, pr.lk, h);
  const double scale = ResolvedScale(o, pr.d);
  int64_t bias_base = 0;
  if (in.bias.data != nullptr) {
    for (int64_t bb = 0; bb < b; ++bb) bias_base += in.q.length(bb) * in.k.length(bb);
    bias_base = (bias_base * heads + h * pr.lq * pr.lk);
  }
  pr.s.assign(pr.lq * pr.lk, 0.0);
  pr.p.assign(pr.lq * pr.lk, 0.0);
  pr.lse.assign(pr.lq, -std::numeric_limits<double>::infinity());
  for (int64_t i = 0; i < pr.lq; ++i) {
    const KeyRange r = VisibleKeys(o, pr.lq, pr.lk, i);
    pr.keys.push_back(r);
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = r.begin; j < r.end; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < pr.d; ++c) dot += pr.q.y.row(i)[c] * pr.k.y.row(j)[c];
      double s = scale * dot;
      if (in.bias.data != nullptr) s += Load(in.bias, bias_base + i * pr.lk + j);
      pr.s[i * pr.lk + j] = s;
      mx = std::max(mx, s);
    }
    if (o.activation == Activation::kSoftmax) {
      if (r.size() == 0) continue;
      double sum = 0;
      for (int64_t j = r.begin; j < r.end; ++j) sum += std::exp(pr.s[i * pr.lk + j] - mx);
      pr.lse[i] = mx + std::log(sum);
      for (int64_t j = r.begin; j < r.end; ++j) {
        pr.p[i * pr.lk + j] = std::exp(pr.s[i * pr.lk + j] - pr.lse[i]);
      }
    } else {
      for (int64_t j = r.begin; j < r.end; ++j) {
        pr.p[i * pr.lk + j] = Act(o.activation, pr.s[i * pr.lk + j]);
      }
    }
  }
  return pr;
}

}  // namespace

absl::Status ForwardCpu(const AttentionInputs& in, const AttentionOptions& o, TensorView out,
                        TensorView lse) {
  const int64_t heads = in.q.values.dim(1);
  for (int64_t b = 0; b < in.q.batch_size(); ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      Problem pr = Compute(in, o, b, h);
      Rows o_rows{pr.lq, pr.d, std::vector<double>(pr.lq * pr.d, 0.0)};
      for (int64_t i = 0; i < pr.lq; ++i) {
        for (int64_t j = pr.keys[i].begin; j < pr.keys[i].end; ++j) {
          const double p = pr.p[i * pr.lk + j];
          for (int64_t c = 0; c < pr.d; ++c) o_rows.row(i)[c] += p * pr.v.row(j)[c];
        }
        if (lse.data != nullptr) Store(lse, (in.q.offset(b) + i) * heads + h, pr.lse[i]);
      }
      Scatter(o_rows, out, in.q.offset(b), h);
    }
  }
  return absl::OkStatus();
}

absl::Status BackwardCpu(const AttentionInputs& in, const AttentionOptions& o,
                         const TensorView& d_out, const AttentionGrads& grads) {
  const int64_t heads = in.q.values.dim(1);
  int64_t bias_base = 0;
  for (int64_t b = 0; b < in.q.batch_size(); ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      Problem pr = Compute(in, o, b, h);
      const int64_t lq = pr.lq, lk = pr.lk, d = pr.d;
      const double scale = ResolvedScale(o, d);
      Rows dout = Gather(d_out, in.q.offset(b), lq, h);
      Rows dq{lq, d, std::vector<double>(lq * d, 0.0)};
      Rows dk{lk, d, std::vector<double>(lk * d, 0.0)};
      Rows dv{lk, d, std::vector<double>(lk * d, 0.0)};
      std::vector<double> ds(lq * lk, 0.0);  // dLoss/ds
      for (int64_t i = 0; i < lq; ++i) {
        const KeyRange r = pr.keys[i];
        std::vector<double> dp(lk, 0.0);
        double dsum = 0;  // sum_j p_ij dp_ij (softmax)
        for (int64_t j = r.begin; j < r.end; ++j) {
          for (int64_t c = 0; c < d; ++c) dp[j] += dout.row(i)[c] * pr.v.row(j)[c];
          dsum += pr.p[i * lk + j] * dp[j];
          for (int64_t c = 0; c < d; ++c) dv.row(j)[c] += pr.p[i * lk + j] * dout.row(i)[c];
        }
        for (int64_t j = r.begin; j < r.end; ++j) {
          ds[i * lk + j] = o.activation == Activation::kSoftmax
                               ? pr.p[i * lk + j] * (dp[j] - dsum)
                               : dp[j] * ActGrad(o.activation, pr.s[i * lk + j]);
          for (int64_t c = 0; c < d; ++c) {
            dq.row(i)[c] += scale * ds[i * lk + j] * pr.k.y.row(j)[c];
            dk.row(j)[c] += scale * ds[i * lk + j] * pr.q.y.row(i)[c];
          }
        }
      }
      TransformBackward(o, pr.q, lk - lq, dq);
      TransformBackward(o, pr.k, 0, dk);
      Scatter(dq, grads.dq, in.q.offset(b), h);
      Scatter(dk, grads.dk, in.k.offset(b), h);
      Scatter(dv, grads.dv, in.k.offset(b), h);
      if (grads.dbias.data != nullptr) {
        for (int64_t e = 0; e < lq * lk; ++e) Store(grads.dbias, bias_base + e, ds[e]);
      }
      bias_base += lq * lk;
    }
  }
  return absl::OkStatus();
}

}  // namespace recfleet::attention::internal
