#include "engine/step_cost.h"

#include <algorithm>

#include "kernels/attention/attention.h"

namespace recfleet::engine {
namespace {

// Visible (query, key) pairs of one self-attention layer over a sequence
// of `l` events (kernels/attention VisibleKeys with lq = lk = l).
double SelfAttentionPairs(const GemLiteConfig& c, int64_t l) {
  const double L = static_cast<double>(l);
  switch (c.seq_mask) {
    case attention::Mask::kNone:
      return L * L;
    case attention::Mask::kCausal:
      return L * (L + 1) / 2;
    case attention::Mask::kSlidingWindow: {
      const double w = static_cast<double>(c.seq_window), head = std::min(L, w);
      return head * (head + 1) / 2 + std::max(0.0, L - w) * w;
    }
    case attention::Mask::kBlock: {
      const int64_t b = attention::kAttentionBlockSize, rest = l % b;
      return static_cast<double>(l / b) * b * b + static_cast<double>(rest * rest);
    }
  }
  return L * L;
}

// in x out weight plus an optional bias.
int64_t LinearParams(int64_t in, int64_t out, bool bias) { return in * out + (bias ? out : 0); }

}  // namespace

double StepCounts::LinearFlops() const {
  double f = 0;
  for (const PartCost& p : parts) f += p.linear_flops;
  return f;
}

double StepCounts::AttentionFlops() const {
  double f = 0;
  for (const PartCost& p : parts) f += p.attention_flops;
  return f;
}

int64_t StepCounts::DenseParams() const {
  int64_t n = 0;
  for (const PartCost& p : parts) n += p.params;
  return n;
}

StepCounts CountStep(const JobModel& model, absl::Span<const int64_t> lengths) {
  const GemLiteConfig& c = model.config;
  const FeatureSchema& s = model.schema;
  const int64_t d = c.dim, B = static_cast<int64_t>(lengths.size());
  const int64_t F = static_cast<int64_t>(s.id_lists.size()) + (s.num_dense > 0 ? 1 : 0);
  const int64_t P = c.pma_queries, D = (F + P) * d;
  StepCounts n;
  n.samples = B;
  n.dim = d;
  n.interaction_dim = D;
  double pairs = 0;
  for (int64_t l : lengths) {
    n.tokens += l;
    pairs += SelfAttentionPairs(c, l);
  }
  const double L = static_cast<double>(n.tokens), b = static_cast<double>(B);
  const double dd = static_cast<double>(d) * d;
  for (const FeatureSchema::Table& t : s.tables) n.table_rows += t.rows;
  n.token_elements = L * d * (c.seq_layers + 1);

  if (s.num_dense > 0) {
    n.parts.push_back({"dense_proj", LinearParams(s.num_dense, d, true),
                       2.0 * b * s.num_dense * d, 0});
  }
  // Per block: the pre-norm's gain, q/k/v without bias, o with bias
  // (+ the final norm's gain once).
  n.parts.push_back({"sequence", c.seq_layers * (d + 4 * d * d + d) + d,
                     c.seq_layers * 4 * 2.0 * L * dd, c.seq_layers * 4.0 * d * pairs});
  if (c.cross_attention) {
    // F queries per sample over its history; K and V project the history.
    n.parts.push_back({"cross", 4 * d * d + d, 2.0 * (2 * b * F * dd + 2 * L * dd),
                       4.0 * d * F * L});
  }
  if (P > 0) {
    n.parts.push_back({"pma", P * d + 3 * d * d + d, 2.0 * (2 * L * dd + b * P * dd),
                       4.0 * d * P * L});
  }
  const double Dd = static_cast<double>(D);
  n.parts.push_back({"dcn", c.dcn_layers * LinearParams(D, D, true), 2.0 * c.dcn_layers * b * Dd * Dd,
                     0});
  const int64_t E = c.num_experts, h = c.expert_hidden, o = c.expert_out;
  n.parts.push_back({"moe", LinearParams(D, E, true) + E * (LinearParams(D, h, true) + LinearParams(h, o, true)),
                     2.0 * (b * Dd * E + E * b * (Dd * h + static_cast<double>(h) * o)), 0});
  const int64_t th = c.tower_hidden;
  n.dense_elements = b * (Dd * (c.dcn_layers + 2) + static_cast<double>(E) * (h + o) + 2.0 * th);
  n.parts.push_back({"towers", 2 * (LinearParams(o, th, true) + LinearParams(th, 1, true)),
                     2.0 * 2 * b * (static_cast<double>(o) * th + th), 0});
  return n;
}

}  // namespace recfleet::engine
