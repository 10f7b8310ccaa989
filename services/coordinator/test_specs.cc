#include "services/coordinator/test_specs.h"

#include <cstdio>
#include <cstdlib>

#include "google/protobuf/text_format.h"

namespace recfleet::coordinator {

::recfleet::v1::JobSpec ValidSpec(int workers) {
  static constexpr char kSpec[] = R"pb(
    display_name: "gemlite-test"
    model {
      tables { name: "items" rows: 100000 dim: 32 }
      tables { name: "users" rows: 50000 dim: 16 }
      features { name: "dense" kind: NUMERIC width: 13 }
      features { name: "user_id" kind: ID_LIST table: "users" pooling: SUM }
      features { name: "history" kind: SEQUENCE table: "items" max_length: 512 }
      features { name: "ad_item" kind: CANDIDATE table: "items" }
      sequence {
        features: "history"
        num_layers: 2
        model_dim: 64
        num_heads: 4
        attention { kind: BLOCK rope: true activation: SILU qk_norm: true }
      }
      cross { num_cross_layers: 1 pma_queries: 4 num_heads: 4 }
      dense { dcn { num_layers: 2 low_rank: 16 } }
      dense { moe { num_experts: 4 top_k: 2 expert_hidden_dims: 128 } }
      heads { kind: CTR label: "click" hidden_dims: 64 }
      heads { kind: CVR label: "conversion" hidden_dims: 64 }
    }
    data {
      dataset: "file:///tmp/gemlite"
      local_batch_size: 256
      bbs {
        enabled: true
        base_batch_size: 128
        window: 4
        cost_weights { per_sample: 1 linear: 0.5 block: 0.01 }
      }
    }
    training {
      steps: 100
      eval_every: 50
      checkpoint_every: 50
      dense_learning_rate: 0.001
      sparse_learning_rate: 0.01
      seed: 7
    }
  )pb";
  ::recfleet::v1::JobSpec spec;
  if (!google::protobuf::TextFormat::ParseFromString(kSpec, &spec)) {
    std::fprintf(stderr, "test_specs: the built-in spec does not parse\n");
    std::abort();
  }
  spec.mutable_resources()->set_workers(workers);
  return spec;
}

::recfleet::v1::JobSpec BuildableSpec(int workers) {
  ::recfleet::v1::JobSpec spec = ValidSpec(workers);
  auto* m = spec.mutable_model();
  m->mutable_tables(1)->set_dim(32);
  m->mutable_sequence()->set_model_dim(32);
  m->mutable_dense(0)->mutable_dcn()->set_low_rank(0);
  auto* moe = m->mutable_dense(1)->mutable_moe();
  moe->set_top_k(4);
  moe->add_expert_hidden_dims(64);
  spec.mutable_data()->mutable_bbs()->set_window(2);
  return spec;
}

}  // namespace recfleet::coordinator
