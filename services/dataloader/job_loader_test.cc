#include "services/dataloader/job_loader.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/loader.h"
#include "data/synth.h"
#include "engine/job_model.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace recfleet::dataloader {
namespace {

// A synthetic:// dataset lands under a name fixed by its URI alone, so every
// process that opens it (the loader, each worker's eval reader) finds the
// one copy instead of generating its own.
TEST(JobLoaderTest, SyntheticDatasetsHaveOneStableHome) {
  DatasetOptions o;
  o.cache_dir = std::string(testing::TempDir()) + "/synthetic";
  const std::string uri = "synthetic://t?samples=300&users=20&items=50&seed=2";
  absl::StatusOr<DatasetFiles> files = ResolveDataset(uri, o);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->train, o.cache_dir + "/e9754e5ba906685d/train.rfd");
  EXPECT_EQ(files->eval, o.cache_dir + "/e9754e5ba906685d/eval.rfd");
  absl::StatusOr<DatasetFiles> again = ResolveDataset(uri, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->train, files->train);
}

TEST(JobLoaderTest, BadLocationsSayWhatIsWrong) {
  DatasetOptions o;
  o.cache_dir = std::string(testing::TempDir()) + "/synthetic";
  EXPECT_EQ(ResolveDataset("", o).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = ResolveDataset("synthetic://t?samples=-3", o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("samples"), std::string::npos) << s;
  s = ResolveDataset("synthetic://t?colour=red", o).status();
  EXPECT_NE(s.message().find("unknown key 'colour'"), std::string::npos) << s;
  s = ResolveDataset("s3://bucket/x", o).status();
  EXPECT_NE(s.message().find("unknown scheme"), std::string::npos) << s;
  s = ResolveDataset("/no/such/place", o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/no/such/place"), std::string::npos) << s;
  o.root = std::string(testing::TempDir());
  s = ResolveDataset("relative/dir", o).status();
  EXPECT_NE(s.message().find(o.root + "/relative/dir"), std::string::npos) << s;
}

// A loader or worker with a data root opens nothing outside it, decided on
// the path alone (the same answer whether the file exists or not).
TEST(JobLoaderTest, PathsOutsideTheRootAreRefused) {
  const std::string root = std::string(testing::TempDir()) + "/loader_root";
  for (const std::string& outside :
       {std::string("/etc"), std::string("/no/such/place"), std::string("../x"), std::string("a/../../x"),
        root + "/../x", root + "2/x", std::string("file:///etc")}) {
    absl::Status s = CheckDatasetUnderRoot(outside, root);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << outside;
    EXPECT_NE(s.message().find("lies outside the data root"), std::string::npos) << s;
    DatasetOptions o;
    o.root = root;
    EXPECT_EQ(ResolveDataset(outside, o).status(), s) << outside;
    EXPECT_EQ(ResolveEvalFile("synthetic://t?samples=10", outside, o).status(), s) << outside;
  }
  for (const std::string& inside : {std::string("x"), std::string("."), std::string("a/../b"), root,
                                    root + "/x/y", "file://" + root + "/x", std::string("synthetic://t?samples=10")}) {
    EXPECT_TRUE(CheckDatasetUnderRoot(inside, root).ok()) << inside;
  }
  // Without a root, a process reads whatever its user can.
  EXPECT_TRUE(CheckDatasetUnderRoot("/etc", "").ok());
  EXPECT_TRUE(CheckDatasetUnderRoot("../x", "").ok());
}

TEST(JobLoaderTest, EvalFileComesFromEvalDatasetOrBesideTheTrainingData) {
  DatasetOptions o;
  o.cache_dir = std::string(testing::TempDir()) + "/synthetic";
  const std::string uri = "synthetic://t?samples=300&users=20&items=50&seed=2";
  const std::string home = o.cache_dir + "/e9754e5ba906685d";
  EXPECT_EQ(ResolveEvalFile(uri, "", o).value_or("?"), home + "/eval.rfd");
  // An explicit eval location wins: its eval.rfd, or the file it names.
  EXPECT_EQ(ResolveEvalFile("unused", uri, o).value_or("?"), home + "/eval.rfd");
  EXPECT_EQ(ResolveEvalFile("unused", home + "/train.rfd", o).value_or("?"), home + "/train.rfd");
  EXPECT_EQ(ResolveEvalFile(uri, "/no/eval/here", o).status().code(), absl::StatusCode::kNotFound);
  // A training location without an eval.rfd: no evaluation.
  EXPECT_EQ(ResolveEvalFile(home + "/train.rfd", "", o).value_or("?"), "");
}

// The cost weights `recfleet data calibrate` fits go into the job spec
// (data.bbs.cost_weights); the loader built from that spec deals by them.
// Two specs that differ only in their weights get different deals of the
// same window, and each deal is the better one under its own weights.
TEST(JobLoaderTest, CostWeightsOfTheSpecDecideTheDeal) {
  DatasetOptions o;
  o.cache_dir = std::string(testing::TempDir()) + "/synthetic";
  const std::string uri =
      "synthetic://t?samples=3000&users=100&items=500&seed=3&"
      "lengths=lognormal:mean=300,sigma=1.2,min=1,max=4000";
  absl::StatusOr<DatasetFiles> files = ResolveDataset(uri, o);
  ASSERT_TRUE(files.ok()) << files.status();
  struct Run {
    const char* weights;
    data::CostModel cost;  // What the loader prices with.
    std::shared_ptr<const data::StepPlan> plan;
  };
  // Linear (token counting) against a fit dominated by attention's L^2.
  Run runs[2] = {{"linear: 1"}, {"per_sample: 0.0013 linear: 0.0001 quadratic: 7.1e-7"}};
  for (Run& r : runs) {
    v1::JobSpec spec;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
        absl::StrCat("data { dataset: '", uri, "' local_batch_size: 256 bbs { enabled: true ",
                     "cost_weights { ", r.weights, " } } }"),
        &spec));
    absl::StatusOr<v1::DataConfig> config = engine::BuildDataConfig(spec, "jobs/w", 4);
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<data::LoaderOptions> lo = LoaderOptionsFor(*config, files->train);
    ASSERT_TRUE(lo.ok()) << lo.status();
    r.cost = lo->cost;
    absl::StatusOr<std::unique_ptr<data::Loader>> loader = data::Loader::Open(*lo);
    ASSERT_TRUE(loader.ok()) << loader.status();
    absl::StatusOr<std::shared_ptr<const data::StepPlan>> plan = (*loader)->Plan(0, 0);
    ASSERT_TRUE(plan.ok()) << plan.status();
    r.plan = *plan;
  }
  EXPECT_DOUBLE_EQ(runs[1].cost.quadratic, 7.1e-7);
  EXPECT_DOUBLE_EQ(runs[1].cost.per_sample, 0.0013);
  const std::vector<int64_t> lengths = data::WindowLengths(*runs[0].plan);
  ASSERT_EQ(lengths, data::WindowLengths(*runs[1].plan));  // The same window.
  // Rank r's samples (window indices) in each deal.
  auto rank_sets = [](const data::Deal& deal) {
    std::vector<std::set<uint32_t>> sets;
    for (const auto& rank : deal.ranks) {
      sets.emplace_back();
      for (const auto& base : rank) sets.back().insert(base.begin(), base.end());
    }
    return sets;
  };
  EXPECT_NE(rank_sets(runs[0].plan->deal), rank_sets(runs[1].plan->deal));
  // Straggler gap of a deal priced by a cost model.
  auto gap = [&](const data::Deal& deal, const data::CostModel& cost) {
    double max = 0, sum = 0;
    for (const auto& rank : deal.ranks) {
      double c = 0;
      for (const auto& base : rank) {
        for (uint32_t i : base) c += cost.SampleCost(lengths[i]);
      }
      max = std::max(max, c);
      sum += c;
    }
    return max / (sum / deal.ranks.size()) - 1;
  };
  for (int own = 0; own < 2; ++own) {
    const data::CostModel& cost = runs[own].cost;
    const double own_gap = gap(runs[own].plan->deal, cost);
    const double other_gap = gap(runs[1 - own].plan->deal, cost);
    EXPECT_NEAR(own_gap, runs[own].plan->gap, 1e-9);
    EXPECT_LT(own_gap, other_gap) << "weights " << runs[own].weights;
  }
}

// An idle job is closed when another request comes, and its name goes to
// on_close (the loader's metrics drop its series then); a job a stream
// still reads, or the job being asked for, stays open.
TEST(JobLoadersTest, IdleJobsCloseAndAreReported) {
  const std::string dir = std::string(testing::TempDir()) + "/idle_data";
  data::SynthOptions so;
  so.samples = 300;
  so.num_items = 100;
  so.rows_per_block = 64;
  ASSERT_TRUE(data::GenerateSynthetic(so, dir).ok());
  auto config = [&dir](const std::string& job) {
    v1::DataConfig c;
    c.set_job(job);
    c.set_dataset(dir);
    c.set_num_ranks(1);
    c.set_local_batch_size(16);
    c.set_base_batch_size(16);
    c.set_micro_batches(1);
    c.set_policy("recfleet");
    c.set_cost_model("linear=1");
    return c;
  };
  std::vector<std::string> closed;
  JobLoaders jobs(DatasetOptions(), absl::ZeroDuration(), [&closed](const std::string& job) { closed.push_back(job); });
  ASSERT_TRUE(jobs.Get(config("jobs/a")).ok());      // Nobody holds it afterwards.
  auto held = jobs.Get(config("jobs/b"));             // Held, like an open stream.
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(closed, std::vector<std::string>{"jobs/a"});
  EXPECT_EQ(jobs.open_jobs(), 1);
  ASSERT_TRUE(jobs.Get(config("jobs/b")).ok());      // Asked for again: stays open.
  ASSERT_TRUE(jobs.Get(config("jobs/c")).ok());
  EXPECT_EQ(closed, std::vector<std::string>{"jobs/a"});  // b is still held.
  EXPECT_EQ(jobs.open_jobs(), 2);
}

}  // namespace
}  // namespace recfleet::dataloader
