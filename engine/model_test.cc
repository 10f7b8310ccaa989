#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/metrics.h"
#include "engine/testing/compare.h"
#include "engine/testing/movielens.h"
#include "engine/testing/synthetic.h"
#include "gtest/gtest.h"
#include "kernels/embedding/embedding.h"

namespace recfleet::engine {
namespace {

MovieLensCtr SmallData(int max_history) {
  SyntheticOptions s;
  s.num_users = 12;
  s.num_items = 30;
  s.min_events = 3;
  s.mean_extra_events = 8;
  CtrOptions o;
  o.max_history = max_history;
  return *MovieLensCtr::Create(SyntheticMovieLens(s), o);
}

GemLiteConfig TinyConfig() {
  GemLiteConfig c;
  c.dim = 4;
  c.heads = 2;
  c.seq_layers = 2;
  c.pma_queries = 2;
  c.dcn_layers = 2;
  c.num_experts = 2;
  c.expert_hidden = 6;
  c.expert_out = 5;
  c.tower_hidden = 3;
  // Smooth activations: finite differences across a ReLU kink are wrong.
  c.mlp_activation = Activation::kGelu;
  c.embedding_init_std = 0.5;
  return c;
}

// Central differences of the loss on `batch` against the analytic gradient
// of sampled elements of every dense parameter and of every touched table
// row (plus row 0).
void CheckGradients(GemLite<double>& m, const Batch& batch) {
  ASSERT_TRUE(m.ForwardBackward(batch).ok());
  const double h = 1e-6;
  auto check = [&](double* value, double analytic, const std::string& what) {
    const double saved = *value;
    *value = saved + h;
    const double up = *m.Loss(batch);
    *value = saved - h;
    const double down = *m.Loss(batch);
    *value = saved;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << what;
  };
  std::mt19937 rng(5);
  int checked = 0;
  for (const std::string& name : m.DenseParameterNames()) {
    TensorView p = m.DenseParameter(name);
    TensorView g = m.DenseGradient(name);
    std::uniform_int_distribution<int64_t> pick(0, p.numel() - 1);
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t i = pick(rng);
      check(p.as<double>() + i, g.as<double>()[i], absl::StrCat(name, "[", i, "]"));
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
  for (int t = 0; t < m.num_tables(); ++t) {
    absl::StatusOr<Tensor> grad = m.DenseTableGradient(t);
    ASSERT_TRUE(grad.ok()) << grad.status();
    TensorView table = m.Table(t);
    const int64_t d = table.dim(1);
    std::set<int64_t> rows = {0};
    bool touched = false;
    for (int64_t r = 0; r < table.dim(0); ++r) {
      for (int64_t c = 0; c < d; ++c) {
        if (grad->data<double>()[r * d + c] != 0) {
          rows.insert(r);
          touched = true;
        }
      }
    }
    EXPECT_TRUE(touched) << "table " << t << " got no gradient";
    for (int64_t r : rows) {
      for (int64_t c = 0; c < d; ++c) {
        check(table.as<double>() + r * d + c, grad->data<double>()[r * d + c],
              absl::StrCat("table ", t, " row ", r, " col ", c));
      }
    }
  }
}

struct Variant {
  std::string name;
  attention::Mask mask;
  attention::Activation act;
  bool rope, qk_norm;
  int64_t window;
};

// Central differences of the whole model's loss in float64 against the
// analytic gradient of every dense parameter (sampled elements) and every
// touched table row, for each attention variant.
TEST(GemLiteTest, WholeModelGradientMatchesFiniteDifferences) {
  // Batch: sample 0 has an empty history (the user's first event); with
  // max_history 5 the rest vary from 1 to 5 events.
  const MovieLensCtr data = SmallData(5);
  Batch batch = data.MakeBatch(false, {0, 1, 4, 7, 30});
  batch.cvr_labels = {1, 0, 0, 1, 1};  // Exercise both heads.
  ASSERT_EQ(batch.sequence[0].offsets[1], 0);
  const std::vector<Variant> variants = {
      {"full_softmax_rope", attention::Mask::kNone, attention::Activation::kSoftmax, true, false, 0},
      {"window_gelu_qknorm", attention::Mask::kSlidingWindow, attention::Activation::kGelu, false,
       true, 2},
      {"block_silu_rope", attention::Mask::kBlock, attention::Activation::kSilu, true, true, 0},
      {"causal_softmax", attention::Mask::kCausal, attention::Activation::kSoftmax, false, false, 0},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    GemLiteConfig config = TinyConfig();
    config.seq_mask = v.mask;
    config.seq_activation = v.act;
    config.rope = v.rope;
    config.qk_norm = v.qk_norm;
    config.seq_window = v.window;
    auto model = GemLite<double>::Create(config, data.schema());
    ASSERT_TRUE(model.ok()) << model.status();
    CheckGradients(**model, batch);
  }
}

// Histories of 1, 63, 64, 65 and 66 events: both sides of the 64-token
// block boundary of BlockAttention, and the longest sequence of the batch.
TEST(GemLiteTest, GradientsAcrossTheBlockBoundary) {
  SyntheticOptions s;
  s.num_users = 2;
  s.num_items = 40;
  s.min_events = 100;
  s.mean_extra_events = 1;
  CtrOptions o;
  o.max_history = 66;
  const MovieLensCtr data = *MovieLensCtr::Create(SyntheticMovieLens(s), o);
  const Batch batch = data.MakeBatch(false, {1, 63, 64, 65, 66});
  EXPECT_EQ(batch.sequence[0].offsets, (std::vector<int64_t>{0, 1, 64, 128, 193, 259}));
  GemLiteConfig config = TinyConfig();
  config.seq_layers = 1;
  config.seq_mask = attention::Mask::kBlock;
  config.rope = true;
  auto model = GemLite<double>::Create(config, data.schema());
  ASSERT_TRUE(model.ok());
  CheckGradients(**model, batch);
}

TEST(GemLiteTest, FlopsCountRealLengths) {
  const MovieLensCtr data = SmallData(5);
  GemLiteConfig c = TinyConfig();
  auto model = GemLite<float>::Create(c, data.schema());
  ASSERT_TRUE(model.ok());
  Batch empty = data.MakeBatch(false, {0, 0, 0});
  ASSERT_EQ(empty.sequence[0].offsets.back(), 0);
  const double d = c.dim, B = 3, F = data.schema().id_lists.size() + 1, P = c.pma_queries;
  const double D = (F + P) * d, E = c.num_experts, H = c.expert_hidden, O = c.expert_out;
  const double per_sample = data.schema().num_dense * d + 2 * F * d * d + P * d * d +
                            c.dcn_layers * D * D + D * E + E * (D * H + H * O) +
                            2 * (O * c.tower_hidden + c.tower_hidden);
  EXPECT_DOUBLE_EQ((*model)->ForwardBackward(empty)->flops, 3 * 2 * B * per_sample);
  Batch longer = data.MakeBatch(false, {3, 3, 3});
  const double tokens = static_cast<double>(longer.sequence[0].offsets.back());
  ASSERT_GT(tokens, 0);
  // Per token: seq layers (q, k, v, o) and the cross/PMA key and value
  // projections, all d x d; attention adds at least 4 d per visible pair.
  const double token_linear = 3 * 2 * tokens * d * d * (4 * c.seq_layers + 4);
  EXPECT_GT((*model)->ForwardBackward(longer)->flops,
            3 * 2 * B * per_sample + token_linear + 3.5 * 4 * d * tokens);
}

// What FSDP prefetch relies on: a module's parameters are not read before
// its before_forward hook (here they hold NaN until then), and its
// gradients are final at its after_backward hook. Each module's parameters
// are one contiguous run, modules in forward order.
TEST(GemLiteTest, ModuleHooksComeBeforeFirstUseAndAfterFinalGradients) {
  const MovieLensCtr data = SmallData(8);
  const GemLiteConfig config = TinyConfig();
  auto reference = GemLite<float>::Create(config, data.schema());
  auto hooked = GemLite<float>::Create(config, data.schema());
  ASSERT_TRUE(reference.ok() && hooked.ok());
  const std::vector<std::string> names = (*hooked)->DenseParameterNames();
  const std::vector<std::string> modules = (*hooked)->ModuleNames();
  const std::vector<int> module_of = (*hooked)->DenseParameterModules();
  ASSERT_EQ(module_of.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(names[i].rfind(modules[module_of[i]], 0), 0u) << names[i] << " in " << modules[module_of[i]];
    if (i > 0) {
      EXPECT_TRUE(module_of[i] == module_of[i - 1] || module_of[i] == module_of[i - 1] + 1) << names[i];
    }
  }
  const Batch batch = data.MakeBatch(false, {0, 3, 5, 9});
  std::vector<std::vector<float>> saved(names.size()), at_hook(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    TensorView v = (*hooked)->DenseParameter(names[i]);
    saved[i].assign(v.as<float>(), v.as<float>() + v.numel());
    std::fill(v.as<float>(), v.as<float>() + v.numel(), std::nanf(""));
  }
  std::vector<int> forward_order, backward_order;
  ModuleHooks hooks;
  hooks.before_forward = [&](int m) {
    forward_order.push_back(m);
    for (size_t i = 0; i < names.size(); ++i) {
      if (module_of[i] != m) continue;
      TensorView v = (*hooked)->DenseParameter(names[i]);
      std::copy(saved[i].begin(), saved[i].end(), v.as<float>());
    }
    return absl::OkStatus();
  };
  hooks.after_backward = [&](int m) {
    backward_order.push_back(m);
    for (size_t i = 0; i < names.size(); ++i) {
      if (module_of[i] != m) continue;
      TensorView g = (*hooked)->DenseGradient(names[i]);
      at_hook[i].assign(g.as<float>(), g.as<float>() + g.numel());
    }
    return absl::OkStatus();
  };
  (*hooked)->SetModuleHooks(hooks);
  auto want = (*reference)->ForwardBackward(batch);
  auto got = (*hooked)->ForwardBackward(batch);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(got->ctr_loss, want->ctr_loss);
  std::vector<int> every(modules.size());
  for (size_t m = 0; m < modules.size(); ++m) every[m] = static_cast<int>(m);
  EXPECT_EQ(forward_order, every);
  std::vector<int> backward_sorted = backward_order;
  std::sort(backward_sorted.begin(), backward_sorted.end());
  EXPECT_EQ(backward_sorted, every);
  for (size_t i = 0; i < names.size(); ++i) {
    TensorView g = (*hooked)->DenseGradient(names[i]);
    TensorView w = (*reference)->DenseGradient(names[i]);
    EXPECT_EQ(at_hook[i], std::vector<float>(g.as<float>(), g.as<float>() + g.numel())) << names[i];
    EXPECT_EQ(at_hook[i], std::vector<float>(w.as<float>(), w.as<float>() + w.numel())) << names[i];
  }
}

TEST(GemLiteTest, DeterministicGivenSeedAndBatches) {
  const MovieLensCtr data = SmallData(8);
  GemLiteConfig config = TinyConfig();
  std::vector<std::vector<double>> predictions;
  for (int run = 0; run < 2; ++run) {
    auto model = GemLite<float>::Create(config, data.schema());
    ASSERT_TRUE(model.ok());
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE((*model)->ForwardBackward(data.MakeBatch(false, {step, step + 5, step + 9})).ok());
      ASSERT_TRUE((*model)->ApplyUpdates().ok());
    }
    predictions.push_back(*(*model)->Predict(data.MakeBatch(true, {0, 1, 2}), Head::kCtr));
  }
  EXPECT_EQ(predictions[0], predictions[1]);
}

// Tables held by the caller (as worker/dist shards them): the bags from
// TableLookupsOf, their row sums in, PooledGradients applied with rowwise
// Adagrad out. Must train exactly like the model's own tables.
class CallerTables {
 public:
  CallerTables(const GemLiteConfig& config, const FeatureSchema& schema) : dim_(config.dim) {
    for (size_t t = 0; t < schema.tables.size(); ++t) {
      values_.emplace_back(schema.tables[t].rows * dim_);
      momenta_.emplace_back(schema.tables[t].rows, 0.0);
      for (int64_t r = 0; r < schema.tables[t].rows; ++r) {
        for (int64_t c = 0; c < dim_; ++c) {
          values_[t][r * dim_ + c] = InitialTableValue(config, static_cast<int>(t), r, c);
        }
      }
    }
    config_.learning_rate = static_cast<float>(config.adagrad_learning_rate);
  }

  std::vector<TensorView> Lookup(const std::vector<TableLookups>& lookups) {
    lookups_ = lookups;
    pooled_.assign(lookups.size(), {});
    std::vector<TensorView> out;
    for (size_t t = 0; t < lookups.size(); ++t) {
      const int64_t bags = static_cast<int64_t>(lookups[t].offsets.size()) - 1;
      pooled_[t].assign(bags * dim_ + 1, 0.0);
      out.push_back(MakeView(pooled_[t].data(), DType::kFloat64, {bags, dim_}));
      if (bags == 0) continue;
      EXPECT_TRUE(EmbeddingBagForward(Table(t), Ids(t), Pooling::kSum, out.back()).ok());
    }
    return out;
  }

  void Update(const std::vector<TensorView>& grads) {
    for (size_t t = 0; t < grads.size(); ++t) {
      if (grads[t].dim(0) == 0) continue;
      EXPECT_TRUE(EmbeddingBagBackwardAdagrad(
                      grads[t], Ids(t), Pooling::kSum, config_, Table(t),
                      MakeView(momenta_[t].data(), DType::kFloat64, {static_cast<int64_t>(momenta_[t].size())}))
                      .ok());
    }
  }

  const std::vector<double>& values(int t) const { return values_[t]; }

 private:
  TensorView Table(size_t t) {
    return MakeView(values_[t].data(), DType::kFloat64, {static_cast<int64_t>(values_[t].size()) / dim_, dim_});
  }
  JaggedView Ids(size_t t) {
    TableLookups& l = lookups_[t];
    return {MakeView(l.ids.data(), DType::kInt64, {static_cast<int64_t>(l.ids.size())}),
            MakeView(l.offsets.data(), DType::kInt64, {static_cast<int64_t>(l.offsets.size())})};
  }

  int64_t dim_;
  RowwiseAdagradConfig config_;
  std::vector<std::vector<double>> values_, momenta_, pooled_;
  std::vector<TableLookups> lookups_;
};

TEST(GemLiteTest, ExternalTablesTrainLikeInternalOnes) {
  const MovieLensCtr data = SmallData(6);
  GemLiteConfig config = TinyConfig();
  config.cross_attention = true;
  auto internal = GemLite<double>::Create(config, data.schema());
  auto external = GemLite<double>::Create(config, data.schema(), TableStorage::kExternal);
  ASSERT_TRUE(internal.ok() && external.ok());
  EXPECT_EQ((*external)->num_tables(), 0);
  bool has_mean = false;
  for (const auto& f : data.schema().id_lists) has_mean |= f.pooling == Pooling::kMean;
  EXPECT_TRUE(has_mean) << "the test should cover mean pooling";
  CallerTables tables(config, data.schema());
  for (int step = 0; step < 4; ++step) {
    const Batch batch = data.MakeBatch(false, {step, step + 4, step + 7, 11});
    auto a = (*internal)->ForwardBackward(batch);
    auto lookups = (*external)->TableLookupsOf(batch);
    ASSERT_TRUE(a.ok() && lookups.ok());
    auto b = (*external)->ForwardBackward(batch, tables.Lookup(*lookups));
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_NEAR(a->ctr_loss, b->ctr_loss, 1e-12);
    EXPECT_EQ(a->flops, b->flops);
    ASSERT_TRUE((*internal)->ApplyUpdates().ok());
    ASSERT_TRUE((*external)->ApplyUpdates().ok());
    tables.Update((*external)->PooledGradients());
  }
  for (int t = 0; t < (*internal)->num_tables(); ++t) {
    const TensorView v = (*internal)->Table(t);
    for (int64_t i = 0; i < v.numel(); ++i) {
      ASSERT_NEAR(v.as<double>()[i], tables.values(t)[i], 1e-12) << "table " << t << " element " << i;
    }
  }
  for (const std::string& name : (*internal)->DenseParameterNames()) {
    const TensorView x = (*internal)->DenseParameter(name), y = (*external)->DenseParameter(name);
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_NEAR(x.as<double>()[i], y.as<double>()[i], 1e-12) << name;
  }
  const Batch eval = data.MakeBatch(true, {0, 1, 2});
  auto p = (*internal)->Predict(eval, Head::kCtr);
  auto q = (*external)->Predict(eval, Head::kCtr, tables.Lookup(*(*external)->TableLookupsOf(eval)));
  ASSERT_TRUE(p.ok() && q.ok());
  for (size_t i = 0; i < p->size(); ++i) EXPECT_NEAR((*p)[i], (*q)[i], 1e-12);
  // Pooled rows of the wrong shape, or given to a model with its own tables.
  EXPECT_EQ((*external)->ForwardBackward(eval).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*internal)->ForwardBackward(eval, tables.Lookup(*(*external)->TableLookupsOf(eval))).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(GemLiteTest, RejectsMismatchedBatchAndConfig) {
  const MovieLensCtr data = SmallData(4);
  GemLiteConfig bad = TinyConfig();
  bad.heads = 3;
  EXPECT_EQ(GemLite<float>::Create(bad, data.schema()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto model = GemLite<float>::Create(TinyConfig(), data.schema());
  ASSERT_TRUE(model.ok());
  Batch batch = data.MakeBatch(false, {0, 1});
  batch.id_lists.pop_back();
  EXPECT_FALSE((*model)->ForwardBackward(batch).ok());
  Batch unlabeled = data.MakeBatch(false, {0, 1});
  unlabeled.ctr_labels.clear();
  EXPECT_FALSE((*model)->ForwardBackward(unlabeled).ok());
  Batch bad_id = data.MakeBatch(false, {0, 1});
  bad_id.id_lists[0].ids[0] = 1 << 20;
  EXPECT_FALSE((*model)->ForwardBackward(bad_id).ok());
}

// The data and model of the FP8 weight-gradient tests: dcn, the experts and
// the towers in FP8, and a batch of 32 rows (FP8 GEMMs take multiples of 16
// rows).
struct Fp8WgradSetup {
  MovieLensCtr data;
  GemLiteConfig config;
  Batch batch;
};

Fp8WgradSetup MakeFp8WgradSetup() {
  SyntheticOptions s;
  s.num_users = 48;
  s.num_items = 60;
  CtrOptions o;
  o.max_history = 8;
  MovieLensCtr data = *MovieLensCtr::Create(SyntheticMovieLens(s), o);
  GemLiteConfig c;
  c.dim = 16;
  c.heads = 2;
  c.seq_layers = 1;
  c.pma_queries = 2;
  c.dcn_layers = 2;
  c.num_experts = 2;
  c.expert_hidden = 64;
  c.expert_out = 32;
  c.tower_hidden = 16;
  c.fp8.modules = {"dcn", "moe.experts", "towers"};
  std::vector<int64_t> rows(32);
  for (int64_t i = 0; i < 32; ++i) rows[i] = i % data.num_train();
  Batch batch = data.MakeBatch(false, rows);
  return {std::move(data), c, std::move(batch)};
}

// Whether the dense parameter `name` is an FP8 layer's weight under
// `config` (a side not a multiple of 16 keeps the base precision).
bool IsFp8Weight(const GemLiteConfig& config, const std::string& name, const TensorView& g) {
  return name.size() > 2 && name.substr(name.size() - 2) == ".w" &&
         config.fp8.Holds(name.substr(0, name.size() - 2)) && g.dim(0) % 16 == 0 && g.dim(1) % 16 == 0;
}

// Every dense gradient of `got` against `want` (models of `config`'s
// layers): the FP8 layers' weight gradients must follow (cosine, relative
// error) without being equal, every other gradient must be identical (the
// weight gradient feeds nothing else). Returns the number of FP8 weights
// compared (a head without labels has no gradient and is skipped).
int CompareFp8WeightGradients(GemLite<float>& got, GemLite<float>& want, const GemLiteConfig& config,
                              double min_cosine, double max_relative_error) {
  int fp8_weights = 0;
  for (const std::string& name : got.DenseParameterNames()) {
    const TensorView g = got.DenseGradient(name), w = want.DenseGradient(name);
    absl::StatusOr<VectorAgreement> a =
        CompareVectors(absl::MakeConstSpan(g.as<float>(), g.numel()),
                       absl::MakeConstSpan(w.as<float>(), w.numel()));
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) continue;
    if (!IsFp8Weight(config, name, g) || a->ref_norm == 0) {
      EXPECT_EQ(a->relative_error, 0) << name;
      continue;
    }
    ++fp8_weights;
    std::printf("%-16s cosine %.5f relative error %.4f\n", name.c_str(), a->cosine, a->relative_error);
    EXPECT_GT(a->cosine, min_cosine) << name;
    EXPECT_LT(a->relative_error, max_relative_error) << name;
    EXPECT_GT(a->relative_error, 1e-4) << name << ": the weight gradients are the same";
  }
  return fp8_weights;
}

// The CPU model emulates an FP8 recipe (the reference kernels quantize
// exactly as the CUDA path does), so a recipe's weight gradients can be
// checked in CI. From the same parameters and batch, FP8 weight gradients
// must follow the recipe's bf16 weight gradients layer by layer (an FP8
// GEMM with a transposed operand, a scale from the wrong block or a stale
// cached operand gives cosines far below these), and every other gradient
// must be unchanged: the weight gradient feeds nothing else.
TEST(GemLiteTest, Fp8WeightGradientsFollowTheBasePrecisionLayerByLayer) {
  const Fp8WgradSetup t = MakeFp8WgradSetup();
  GemLiteConfig with_fp8_wgrad = t.config;
  with_fp8_wgrad.fp8.fp8_weight_gradients = true;
  auto base = GemLite<float>::Create(t.config, t.data.schema());
  auto fp8 = GemLite<float>::Create(with_fp8_wgrad, t.data.schema());
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  // A step first, so the weights are no longer the initial ones.
  ASSERT_TRUE((*fp8)->ForwardBackward(t.batch).ok());
  ASSERT_TRUE((*fp8)->ApplyUpdates().ok());
  ASSERT_TRUE((*base)->CopyParametersFrom(**fp8).ok());
  ASSERT_TRUE((*fp8)->ForwardBackward(t.batch).ok());
  ASSERT_TRUE((*base)->ForwardBackward(t.batch).ok());
  // dcn0, dcn1, two experts x (l1, l2), ctr.l1.
  EXPECT_EQ(CompareFp8WeightGradients(**fp8, **base, t.config, 0.995, 0.1), 7);
}

// weight_gradient: FP8_HADAMARD_STOCHASTIC on the CPU model. The FP8
// layers' weight-gradient GEMMs reduce over the batch's 32 rows, so the
// transform's one 128-row group is mostly zero padding. From the same
// parameters and batch, their weight gradients follow both the plain FP8
// and the bf16 ones without equalling either, and every other gradient is
// unchanged. Each step draws new signs and rounding: a model one step
// behind, on the same parameters, gets other FP8 weight gradients (the
// rest identical), and at the same step exactly the same ones (the seeds
// are replayable). And the model trains: its loss falls over 20 steps.
TEST(GemLiteTest, HadamardStochasticWeightGradientsFollowTheOthersAndTrain) {
  const Fp8WgradSetup t = MakeFp8WgradSetup();
  GemLiteConfig fp8_config = t.config, hadamard_config = t.config;
  fp8_config.fp8.fp8_weight_gradients = true;
  hadamard_config.fp8.wgrad_hadamard_stochastic = true;
  auto base = GemLite<float>::Create(t.config, t.data.schema());
  auto fp8 = GemLite<float>::Create(fp8_config, t.data.schema());
  auto hadamard = GemLite<float>::Create(hadamard_config, t.data.schema());
  auto replay = GemLite<float>::Create(hadamard_config, t.data.schema());
  ASSERT_TRUE(base.ok() && fp8.ok() && hadamard.ok() && replay.ok());
  ASSERT_TRUE((*hadamard)->ForwardBackward(t.batch).ok());
  ASSERT_TRUE((*hadamard)->ApplyUpdates().ok());
  for (auto* m : {&base, &fp8, &replay}) ASSERT_TRUE((**m)->CopyParametersFrom(**hadamard).ok());
  ASSERT_TRUE((*hadamard)->ForwardBackward(t.batch).ok());
  ASSERT_TRUE((*fp8)->ForwardBackward(t.batch).ok());
  ASSERT_TRUE((*base)->ForwardBackward(t.batch).ok());
  // Relative errors ~1-2%, ~10% for expert0's layers (stochastic rounding
  // is unbiased but noisier than rounding to nearest).
  EXPECT_EQ(CompareFp8WeightGradients(**hadamard, **fp8, t.config, 0.99, 0.15), 7);
  EXPECT_EQ(CompareFp8WeightGradients(**hadamard, **base, t.config, 0.99, 0.15), 7);
  // `replay`'s first step draws the seeds of `hadamard`'s first, its second
  // those of `hadamard`'s second. Two draws differ by about sqrt(2) times
  // one draw's error.
  ASSERT_TRUE((*replay)->ForwardBackward(t.batch).ok());
  EXPECT_EQ(CompareFp8WeightGradients(**replay, **hadamard, t.config, 0.97, 0.25), 7);
  ASSERT_TRUE((*replay)->ForwardBackward(t.batch).ok());
  for (const std::string& name : (*hadamard)->DenseParameterNames()) {
    const TensorView g = (*hadamard)->DenseGradient(name), r = (*replay)->DenseGradient(name);
    for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.as<float>()[i], r.as<float>()[i]) << name << " " << i;
  }
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    absl::StatusOr<StepResult> r = (*hadamard)->ForwardBackward(t.batch);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*hadamard)->ApplyUpdates().ok());
    losses.push_back(r->ctr_loss);
  }
  std::printf("loss %.4f -> %.4f\n", losses.front(), losses.back());
  EXPECT_LT(losses.back(), 0.9 * losses.front());
}

// Three steps of training with `checkpointed` against the stored path on
// the same batches: losses, FLOPs and every dense and table gradient. Exact
// (bit for bit) when `tolerance` is 0; else the gradients' relative error
// (the norm of the difference over the norm, all gradients together) is
// returned for the caller to bound, and each step's loss is within
// `tolerance` relatively (the first exactly: the forward is unchanged).
double TrainAgainstStored(const GemLiteConfig& config, const ExecutionOptions& checkpointed,
                          double tolerance) {
  const MovieLensCtr data = SmallData(8);
  auto stored = GemLite<double>::Create(config, data.schema());
  auto recomputed =
      GemLite<double>::Create(config, data.schema(), TableStorage::kInternal, checkpointed);
  EXPECT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(recomputed.ok()) << recomputed.status();
  if (!stored.ok() || !recomputed.ok()) return -1;
  double diff2 = 0, norm2 = 0;
  auto compare = [&](double g, double h, const std::string& what) {
    diff2 += (g - h) * (g - h);
    norm2 += g * g;
    if (tolerance == 0) {
      EXPECT_EQ(g, h) << what;
    }
  };
  for (int step = 0; step < 3; ++step) {
    const Batch batch = data.MakeBatch(false, {step, step + 4, step + 7});
    absl::StatusOr<StepResult> a = (*stored)->ForwardBackward(batch);
    absl::StatusOr<StepResult> b = (*recomputed)->ForwardBackward(batch);
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(b.ok()) << b.status();
    if (!a.ok() || !b.ok()) return -1;
    if (tolerance == 0 || step == 0) {
      EXPECT_EQ(a->ctr_loss, b->ctr_loss) << "step " << step;
    } else {
      EXPECT_NEAR(a->ctr_loss, b->ctr_loss, tolerance * std::abs(a->ctr_loss)) << "step " << step;
    }
    EXPECT_EQ(a->flops, b->flops);
    EXPECT_EQ(a->recomputed_flops, 0);
    EXPECT_LT(b->recomputed_flops, b->flops / 3);  // The blocks' forward, a part of the model's.
    for (const std::string& name : (*stored)->DenseParameterNames()) {
      const TensorView g = (*stored)->DenseGradient(name), h = (*recomputed)->DenseGradient(name);
      EXPECT_EQ(g.numel(), h.numel()) << name;
      for (int64_t i = 0; i < g.numel() && i < h.numel(); ++i) {
        compare(g.as<double>()[i], h.as<double>()[i],
                absl::StrCat(name, "[", i, "] at step ", step));
      }
    }
    for (int t = 0; t < (*stored)->num_tables(); ++t) {
      absl::StatusOr<Tensor> g = (*stored)->DenseTableGradient(t);
      absl::StatusOr<Tensor> h = (*recomputed)->DenseTableGradient(t);
      EXPECT_TRUE(g.ok() && h.ok());
      if (!g.ok() || !h.ok()) return -1;
      EXPECT_EQ(g->numel(), h->numel());
      for (int64_t i = 0; i < g->numel() && i < h->numel(); ++i) {
        compare(g->data<double>()[i], h->data<double>()[i],
                absl::StrCat("table ", t, "[", i, "] at step ", step));
      }
    }
    EXPECT_TRUE((*stored)->ApplyUpdates().ok());
    EXPECT_TRUE((*recomputed)->ApplyUpdates().ok());
  }
  if (tolerance == 0) {
    EXPECT_EQ(*(*stored)->Predict(data.MakeBatch(true, {0, 1, 2}), Head::kCtr),
              *(*recomputed)->Predict(data.MakeBatch(true, {0, 1, 2}), Head::kCtr));
  }
  return std::sqrt(diff2 / norm2);
}

// Activation checkpointing of the attention blocks (the CPU oracle): with
// the blocks recomputing what their mode drops (the norm, the projections
// or the whole block; the same mode for every block or one per block), a
// step's loss and every dense and table gradient equal the stored path's
// bit for bit, the model FLOPs are the same and the recomputed forward
// FLOPs are reported beside them; three steps of training stay identical.
// The recomputing blocks drop their stored activations, so a backward that
// read one instead of its recomputation would fail here.
TEST(GemLiteTest, RecomputedAttentionBlocksGiveTheStoredBackward) {
  const GemLiteConfig config = TinyConfig();
  using layers::BlockCheckpoint;
  ExecutionOptions recompute;
  recompute.recompute_attention_blocks = config.seq_layers;
  EXPECT_EQ(TrainAgainstStored(config, recompute, 0), 0);
  for (const std::vector<BlockCheckpoint>& modes :
       std::vector<std::vector<BlockCheckpoint>>{
           {BlockCheckpoint::kNorm, BlockCheckpoint::kNorm},
           {BlockCheckpoint::kProjections, BlockCheckpoint::kProjections},
           {BlockCheckpoint::kNorm, BlockCheckpoint::kBlock},
           {BlockCheckpoint::kProjections, BlockCheckpoint::kNone}}) {
    SCOPED_TRACE(absl::StrCat(layers::BlockCheckpointName(modes[0]), ",",
                              layers::BlockCheckpointName(modes[1])));
    ExecutionOptions e;
    e.attention_checkpoint = modes;
    EXPECT_EQ(TrainAgainstStored(config, e, 0), 0);
  }
  // More blocks than the model has: refused, naming the limit.
  const MovieLensCtr data = SmallData(8);
  recompute.recompute_attention_blocks = config.seq_layers + 1;
  const absl::Status too_many =
      GemLite<double>::Create(config, data.schema(), TableStorage::kInternal, recompute).status();
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("recompute_attention_blocks"), std::string::npos) << too_many;
  ExecutionOptions wrong_count;
  wrong_count.attention_checkpoint = {BlockCheckpoint::kNorm};
  const absl::Status count =
      GemLite<double>::Create(config, data.schema(), TableStorage::kInternal, wrong_count).status();
  EXPECT_EQ(count.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(count.message().find("attention_checkpoint"), std::string::npos) << count;
  EXPECT_EQ(*layers::ParseBlockCheckpoint("projections"), BlockCheckpoint::kProjections);
  EXPECT_FALSE(layers::ParseBlockCheckpoint("everything").ok());
}

// FP8-saved activations (CPU oracle, fp64): the recomputing blocks keep
// their input and attention output in FP8 (E4M3, 1 x 128 blocks), so the
// backward is that of a rounded input: the first step's loss is exact (the
// forward is unchanged), the gradients differ from the stored path's by a
// few percent of their norm at most (E4M3 keeps 3 mantissa bits: at most
// 6.25% per element, less on average), not by nothing (the FP8 path ran),
// and three steps of training keep the losses within 1%.
TEST(GemLiteTest, Fp8SavedActivationsApproximateTheStoredBackward) {
  const GemLiteConfig config = TinyConfig();
  using layers::BlockCheckpoint;
  for (BlockCheckpoint mode :
       {BlockCheckpoint::kNorm, BlockCheckpoint::kProjections, BlockCheckpoint::kBlock}) {
    ExecutionOptions e;
    e.attention_checkpoint.assign(config.seq_layers, mode);
    e.fp8_saved_activations = true;
    const double error = TrainAgainstStored(config, e, 0.01);
    std::printf("fp8-saved, %s: gradients' relative error %.4g\n",
                std::string(layers::BlockCheckpointName(mode)).c_str(), error);
    EXPECT_GT(error, 1e-6) << layers::BlockCheckpointName(mode);
    EXPECT_LT(error, 0.05) << layers::BlockCheckpointName(mode);
  }
  // Without a recomputing mode there is no FP8 copy (the norm's backward
  // reads the input as it is): exact.
  ExecutionOptions none;
  none.fp8_saved_activations = true;
  EXPECT_EQ(TrainAgainstStored(config, none, 0), 0);
}

// What each mode keeps, by kind, and the step's memory timeline on the CPU.
TEST(GemLiteTest, CheckpointModesKeepWhatTheySayAndTheTimelineIsReported) {
  const MovieLensCtr data = SmallData(8);
  const GemLiteConfig config = TinyConfig();
  using layers::BlockCheckpoint;
  const Batch batch = data.MakeBatch(false, {0, 1, 2, 3, 4, 5, 6, 7});
  const int64_t rows = batch.sequence[0].offsets.back(), a = rows * config.dim * 8;
  struct Expect {
    BlockCheckpoint mode;
    bool fp8;
    int64_t normed, qkv, attn_out;
    bool statistics;
  };
  for (const Expect& x : {Expect{BlockCheckpoint::kNone, false, a, 3 * a, a, true},
                          Expect{BlockCheckpoint::kNorm, false, 0, 3 * a, a, true},
                          Expect{BlockCheckpoint::kProjections, false, 0, 0, a, true},
                          Expect{BlockCheckpoint::kBlock, false, 0, 0, 0, false},
                          Expect{BlockCheckpoint::kProjections, true, 0, 0, -1, true}}) {
    SCOPED_TRACE(absl::StrCat(layers::BlockCheckpointName(x.mode), x.fp8 ? " fp8" : ""));
    ExecutionOptions e;
    e.attention_checkpoint.assign(config.seq_layers, x.mode);
    e.fp8_saved_activations = x.fp8;
    auto m = GemLite<double>::Create(config, data.schema(), TableStorage::kInternal, e);
    ASSERT_TRUE(m.ok()) << m.status();
    (*m)->set_report_regions(true);
    absl::StatusOr<StepResult> r = (*m)->ForwardBackward(batch);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->regions.size(), 2u);
    for (const StepResult::Region& g : r->regions) {
      EXPECT_EQ(g.checkpoint, x.mode);
      EXPECT_EQ(g.fp8_saved, x.fp8);
      EXPECT_EQ(g.saved.normed, x.normed);
      EXPECT_EQ(g.saved.qkv, x.qkv);
      // FP8: one byte an element plus an fp32 scale per row (dim 4 < 128).
      const int64_t fp8_bytes = rows * config.dim + rows * 4;
      EXPECT_EQ(g.saved.attn_out, x.attn_out >= 0 ? x.attn_out : fp8_bytes);
      EXPECT_EQ(g.saved.statistics > 0, x.statistics);
      EXPECT_EQ(g.saved.input_owned, x.fp8);
      EXPECT_EQ(g.saved.input, x.fp8 ? fp8_bytes : a);
      EXPECT_EQ(g.kept_bytes, g.saved.Own());
      EXPECT_GT(g.peak_bytes, 0);
    }
    // The timeline: step_start, each region's forward in order, each
    // region's backward, the blocks' last first; a peak is never below the
    // bytes in use at its mark.
    std::vector<std::string> names;
    for (const StepResult::MemoryMark& k : r->memory) {
      names.push_back(k.name);
      EXPECT_GE(k.peak_bytes, k.in_use_bytes) << k.name;
    }
    EXPECT_EQ(names, (std::vector<std::string>{
                         "step_start", "forward.embeddings", "forward.seq0", "forward.seq1",
                         "forward.final_norm", "forward.cross", "forward.pma", "forward.dcn_moe",
                         "forward.heads", "backward.heads", "backward.dcn_moe", "backward.pma",
                         "backward.cross", "backward.final_norm", "backward.before_seq1",
                         "backward.seq1", "backward.before_seq0", "backward.seq0",
                         "backward.embeddings"}));
  }
}

// Per-region reporting on the CPU: every block reports its kept bytes,
// the memory peak during its backward and its recomputation time. A stored
// block keeps its activations and recomputes nothing; a recomputing block
// keeps none of its own and takes time to recompute; the first step's
// growth of the host allocator's peak over what was in use before it is
// smaller with recomputation. Reporting changes no result.
TEST(GemLiteTest, RegionsReportKeptBytesPeakAndRecomputeTime) {
  const MovieLensCtr data = SmallData(8);
  GemLiteConfig config = TinyConfig();
  config.seq_layers = 2;
  ExecutionOptions recompute;
  recompute.recompute_attention_blocks = 1;
  auto stored = GemLite<double>::Create(config, data.schema());
  auto mixed = GemLite<double>::Create(config, data.schema(), TableStorage::kInternal, recompute);
  ASSERT_TRUE(stored.ok() && mixed.ok());
  const Batch batch = data.MakeBatch(false, {0, 1, 2, 3, 4, 5, 6, 7});
  ResetCpuMemoryPeak();
  uint64_t before = CpuMemoryStats().in_use;
  absl::StatusOr<StepResult> plain = (*stored)->ForwardBackward(batch);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const uint64_t stored_peak = CpuMemoryStats().peak - before;
  EXPECT_TRUE(plain->regions.empty());
  ASSERT_TRUE((*stored)->ApplyUpdates().ok());
  ResetCpuMemoryPeak();
  before = CpuMemoryStats().in_use;
  absl::StatusOr<StepResult> checkpointed = (*mixed)->ForwardBackward(batch);
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  const uint64_t mixed_peak = CpuMemoryStats().peak - before;
  std::printf("first step's peak over the memory in use: stored %llu bytes, block 0 recomputed %llu\n",
              static_cast<unsigned long long>(stored_peak), static_cast<unsigned long long>(mixed_peak));
  ASSERT_TRUE((*mixed)->ApplyUpdates().ok());
  EXPECT_LT(mixed_peak, stored_peak);

  (*stored)->set_report_regions(true);
  (*mixed)->set_report_regions(true);
  absl::StatusOr<StepResult> a = (*stored)->ForwardBackward(batch);
  absl::StatusOr<StepResult> b = (*mixed)->ForwardBackward(batch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->ctr_loss, b->ctr_loss);
  ASSERT_EQ(a->regions.size(), 2u);
  ASSERT_EQ(b->regions.size(), 2u);
  for (int l = 0; l < 2; ++l) {
    const StepResult::Region& s = a->regions[l];
    EXPECT_EQ(s.name, absl::StrCat("seq", l));
    EXPECT_FALSE(s.recomputed);
    EXPECT_GT(s.kept_bytes, 0);
    EXPECT_GT(s.peak_bytes, 0);
    EXPECT_EQ(s.recompute_s, 0);
  }
  const StepResult::Region& r = b->regions[0];
  EXPECT_TRUE(r.recomputed);
  EXPECT_EQ(r.kept_bytes, 0);
  EXPECT_GT(r.recompute_s, 0);
  EXPECT_GT(r.peak_bytes, 0);
  EXPECT_FALSE(b->regions[1].recomputed);
  EXPECT_EQ(b->regions[1].kept_bytes, a->regions[1].kept_bytes);
  for (const StepResult* s : {&*a, &*b}) {
    for (const StepResult::Region& g : s->regions) {
      std::printf("%s %s: kept %lld bytes, peak %lld bytes, recompute %.1f us\n", s == &*a ? "stored" : "mixed",
                  g.name.c_str(), static_cast<long long>(g.kept_bytes), static_cast<long long>(g.peak_bytes),
                  g.recompute_s * 1e6);
    }
  }
}

}  // namespace
}  // namespace recfleet::engine

namespace recfleet::engine {
namespace {

// The dense gradients' global L2 norm of the tiny model on `batch` (fresh
// model, unclipped: the gradient does not depend on the clip).
double DenseGradNorm(const MovieLensCtr& data, const Batch& batch) {
  auto m = GemLite<float>::Create(TinyConfig(), data.schema());
  EXPECT_TRUE(m.ok());
  EXPECT_TRUE((*m)->ForwardBackward(batch).ok());
  return DenseGradientNorm(**m);
}

// ApplyUpdates with dense_grad_clip_norm = `factor` x the gradients' norm,
// from random AdamW moments at step 5, against the clipped AdamW step in
// float64 from the same parameters, gradients and moments. Returns the
// largest relative difference between the clipped and the unclipped
// reference (how much the clip moved the step).
double ExpectClippedStepMatchesFloat64(double factor) {
  const MovieLensCtr data = SmallData(4);
  const Batch batch = data.MakeBatch(false, {0, 1, 2, 3, 4});
  const double norm = DenseGradNorm(data, batch);
  EXPECT_GT(norm, 0);
  GemLiteConfig config = TinyConfig();
  config.dense_grad_clip_norm = factor * norm;
  config.weight_decay = 0.05;
  auto m = GemLite<float>::Create(config, data.schema());
  EXPECT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->ForwardBackward(batch).ok());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  const int64_t step = 5;
  (*m)->set_adam_step(step - 1);
  struct Before {
    std::vector<double> p, g, m, v;
  };
  std::vector<Before> before;
  double sum = 0;
  for (const std::string& name : (*m)->DenseParameterNames()) {
    Before b;
    const TensorView p = (*m)->DenseParameter(name), g = (*m)->DenseGradient(name);
    const TensorView m1 = (*m)->DenseAdamMoment(name, 1), m2 = (*m)->DenseAdamMoment(name, 2);
    for (int64_t i = 0; i < p.numel(); ++i) {
      m1.as<float>()[i] = normal(rng);
      m2.as<float>()[i] = std::abs(normal(rng)) * 0.1f;
      b.p.push_back(p.as<float>()[i]);
      b.g.push_back(g.as<float>()[i]);
      b.m.push_back(m1.as<float>()[i]);
      b.v.push_back(m2.as<float>()[i]);
      sum += b.g.back() * b.g.back();
    }
    before.push_back(b);
  }
  EXPECT_TRUE((*m)->ApplyUpdates().ok());
  const double clip = config.dense_grad_clip_norm;
  const double scale = std::min(1.0, clip / (std::sqrt(sum) + 1e-6));
  EXPECT_EQ(scale < 1, factor < 1);
  const double lr = config.learning_rate, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
  auto reference = [&](const Before& b, int64_t i, double s) {
    const double g = b.g[i] * s;
    const double mi = b1 * b.m[i] + (1 - b1) * g, vi = b2 * b.v[i] + (1 - b2) * g * g;
    return b.p[i] * (1 - lr * config.weight_decay) - lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
  };
  double worst = 0, moved = 0;
  int k = 0;
  for (const std::string& name : (*m)->DenseParameterNames()) {
    const TensorView p = (*m)->DenseParameter(name);
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double want = reference(before[k], i, scale);
      const double denom = std::max(1e-3, std::abs(want));
      worst = std::max(worst, std::abs(p.as<float>()[i] - want) / denom);
      moved = std::max(moved, std::abs(reference(before[k], i, 1.0) - want) / denom);
    }
    ++k;
  }
  EXPECT_LT(worst, 1e-5) << "clip factor " << factor;
  std::printf("clip %.3g x norm %.4g: worst relative error vs float64 %.2e; the clip moved the step by %.2e\n",
              factor, norm, worst, moved);
  return moved;
}

TEST(GemLiteGradClipTest, ActiveClipMatchesFloat64ClippedAdamW) {
  // A norm 5x over the limit: the clipped step differs from the plain one
  // by far more than the tolerance.
  EXPECT_GT(ExpectClippedStepMatchesFloat64(0.2), 1e-3);
}

TEST(GemLiteGradClipTest, InactiveClipIsThePlainStep) {
  EXPECT_EQ(ExpectClippedStepMatchesFloat64(5.0), 0.0);
}

TEST(GemLiteGradClipTest, RejectsNegativeAndNonFiniteClipNorms) {
  const MovieLensCtr data = SmallData(4);
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    GemLiteConfig c = TinyConfig();
    c.dense_grad_clip_norm = bad;
    absl::Status s = GemLite<float>::Create(c, data.schema()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("dense_grad_clip_norm"), std::string::npos) << s;
  }
}

// The engine's own check of an FP8 attention recipe (ne_probe and tests
// build configs without a job spec): a block the model lacks or a head dim
// the kernel does not take is an error, not a no-op.
TEST(GemLiteConfigTest, Fp8AttentionNamesBlocksTheModelHasAtHeadDim128) {
  GemLiteConfig c;
  c.dim = 128;
  c.heads = 1;
  c.seq_layers = 1;
  c.cross_attention = false;
  c.pma_queries = 2;
  c.fp8.attention = {"sequence", "pma"};
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  c.fp8.attention = {"cross"};
  EXPECT_NE(c.Validate().message().find("names 'cross', which the model lacks"), std::string::npos) << c.Validate();
  c.fp8.attention = {"sequence"};
  c.heads = 2;
  EXPECT_NE(c.Validate().message().find("takes head dim 128, the model's is 64"), std::string::npos)
      << c.Validate();
}

}  // namespace
}  // namespace recfleet::engine
