#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "data/loader.h"
#include "data/synth.h"
#include "gtest/gtest.h"
#include "services/common/exposition.h"
#include "services/common/http_get.h"
#include "services/dataloader/client.h"
#include "services/dataloader/job_loader.h"
#include "services/dataloader/server.h"

namespace recfleet::dataloader {
namespace {

// A job's data configuration, as the coordinator derives it.
v1::DataConfig DataConfigFor(const std::string& job, const std::string& dataset, int ranks, int batch, int base,
                             int seed) {
  v1::DataConfig c;
  c.set_job(job);
  c.set_dataset(dataset);
  c.set_num_ranks(ranks);
  c.set_local_batch_size(batch);
  c.set_base_batch_size(base);
  c.set_micro_batches(1);
  c.set_policy("recfleet");
  c.set_cost_model("linear=1");
  c.set_seed(seed);
  return c;
}

int64_t TrainRowsOf(const std::string& dir) {
  auto f = data::DatasetFile::Open(dir + "/train.rfd");
  return f.ok() ? static_cast<int64_t>((*f)->num_rows()) : -1;
}

class ServiceTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::string(testing::TempDir()) + "/svc_data");
    data::SynthOptions o;
    o.samples = 2500;
    o.lengths = *data::LengthDistribution::Parse("lognormal:mean=30,sigma=1.2,min=0,max=800");
    o.num_items = 3000;
    o.rows_per_block = 64;
    o.eval_fraction = 0.1;
    ASSERT_TRUE(data::GenerateSynthetic(o, *dir_).ok());
  }

  static v1::DataConfig Config(const std::string& job = "jobs/a", int ranks = 2, int batch = 32, int base = 16) {
    return DataConfigFor(job, *dir_, ranks, batch, base, 3);
  }

  // The library loader the service must match for `c`.
  static std::unique_ptr<data::Loader> Library(const v1::DataConfig& c) {
    auto o = LoaderOptionsFor(c, *dir_ + "/train.rfd");
    EXPECT_TRUE(o.ok()) << o.status();
    auto l = data::Loader::Open(*o);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? *std::move(l) : nullptr;
  }

  std::unique_ptr<LoaderServer> Start() {
    ServerOptions so;
    so.service.prefetch = 2;
    auto s = LoaderServer::Start(so);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Streams `rank`'s steps [from, to) and counts sample ids into `seen`.
  static absl::Status Pull(const std::string& address, int rank, int64_t from, int64_t to,
                           std::map<int64_t, int>* seen, std::mutex* mu,
                           std::vector<data::RankBatch>* keep = nullptr, const v1::DataConfig& config = Config()) {
    auto client = DataLoaderClient::Connect(address, config);
    if (!client.ok()) return client.status();
    auto stream = (*client)->StreamBatches(rank, 0, from, to);
    if (!stream.ok()) return stream.status();
    data::RankBatch b;
    int64_t expect = from;
    while (true) {
      auto more = (*stream)->Next(&b);
      if (!more.ok()) return more.status();
      if (!*more) break;
      if (b.step != expect++ || b.rank != rank) return absl::InternalError("out of order");
      std::lock_guard<std::mutex> l(*mu);
      int sid = b.samples.schema().Find("sample_id");
      for (size_t r = 0; r < b.samples.num_rows(); ++r) ++(*seen)[b.samples.Int64(sid, r)];
      if (keep != nullptr) keep->push_back(b);
    }
    return absl::OkStatus();
  }

  static int64_t TrainRows() { return TrainRowsOf(*dir_); }

  static void ExpectExactlyOnce(const std::map<int64_t, int>& seen) {
    EXPECT_EQ(static_cast<int64_t>(seen.size()), TrainRows());
    for (const auto& [id, n] : seen) ASSERT_EQ(n, 1) << "sample " << id;
  }

  static std::string* dir_;
};

std::string* ServiceTest::dir_ = nullptr;

TEST_F(ServiceTest, TwoRanksStreamAnEpochExactlyOnceAndMatchTheLoader) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  std::map<int64_t, int> seen;
  std::mutex mu;
  std::vector<data::RankBatch> got[2];
  absl::Status st[2];
  std::thread t0([&] { st[0] = Pull(server->address(), 0, 0, 0, &seen, &mu, &got[0]); });
  std::thread t1([&] { st[1] = Pull(server->address(), 1, 0, 0, &seen, &mu, &got[1]); });
  t0.join();
  t1.join();
  ASSERT_TRUE(st[0].ok()) << st[0];
  ASSERT_TRUE(st[1].ok()) << st[1];
  ExpectExactlyOnce(seen);
  // The wire changes nothing: same batches as the library computes.
  auto loader = Library(Config());
  ASSERT_NE(loader, nullptr);
  ASSERT_EQ(static_cast<int64_t>(got[0].size()), loader->steps_per_epoch());
  for (int64_t s : {int64_t{0}, loader->steps_per_epoch() - 1}) {
    auto step = loader->Step(0, s);
    ASSERT_TRUE(step.ok());
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(step->ranks[r].samples == got[r][s].samples) << "step " << s << " rank " << r;
      EXPECT_EQ(step->ranks[r].base_batch_offsets, got[r][s].base_batch_offsets);
    }
  }
}

TEST_F(ServiceTest, LoaderRestartMidEpochDeliversEachSampleOnce) {
  std::map<int64_t, int> seen;
  std::mutex mu;
  int64_t steps;
  {
    auto first = Start();
    ASSERT_NE(first, nullptr);
    steps = Library(Config())->steps_per_epoch();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(Pull(first->address(), r, 0, steps / 2, &seen, &mu).ok());
    }
  }  // The loader process goes away; a new one resumes at steps / 2.
  auto second = Start();
  ASSERT_NE(second, nullptr);
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(Pull(second->address(), r, steps / 2, 0, &seen, &mu).ok());
  ExpectExactlyOnce(seen);
}

// One loader serves two jobs of different shapes at once; every rank of
// each job gets exactly the samples its job's own dealing gives it, and each
// job sees every sample once per epoch.
TEST_F(ServiceTest, OneLoaderServesTwoJobsEachExactlyOnce) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  const v1::DataConfig a = Config("jobs/a", 4, 64, 16);
  const v1::DataConfig b = Config("jobs/b", 2, 128, 16);
  std::map<int64_t, int> seen_a, seen_b;
  std::mutex mu;
  std::vector<std::vector<data::RankBatch>> got_a(4), got_b(2);
  std::vector<absl::Status> st(6);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] { st[r] = Pull(server->address(), r, 0, 0, &seen_a, &mu, &got_a[r], a); });
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] { st[4 + r] = Pull(server->address(), r, 0, 0, &seen_b, &mu, &got_b[r], b); });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s;
  ExpectExactlyOnce(seen_a);
  ExpectExactlyOnce(seen_b);
  for (const auto& [config, got] : {std::make_pair(a, &got_a), std::make_pair(b, &got_b)}) {
    auto loader = Library(config);
    ASSERT_NE(loader, nullptr);
    for (int r = 0; r < config.num_ranks(); ++r) {
      ASSERT_EQ(static_cast<int64_t>((*got)[r].size()), loader->steps_per_epoch()) << config.job();
      for (int64_t s = 0; s < loader->steps_per_epoch(); ++s) {
        auto step = loader->Step(0, s);
        ASSERT_TRUE(step.ok());
        ASSERT_TRUE(step->ranks[r].samples == (*got)[r][s].samples) << config.job() << " rank " << r << " step " << s;
        if (s + 1 < loader->steps_per_epoch()) {
          EXPECT_EQ(static_cast<int>((*got)[r][s].samples.num_rows()), config.local_batch_size());
        }
      }
    }
  }
  // The same job asked for with another shape is refused, not re-dealt.
  std::map<int64_t, int> ignored;
  const absl::Status clash = Pull(server->address(), 0, 0, 1, &ignored, &mu, nullptr, Config("jobs/a", 2, 64, 16));
  EXPECT_EQ(clash.code(), absl::StatusCode::kFailedPrecondition) << clash;
}

TEST_F(ServiceTest, BadRequestsGetClearErrors) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  std::map<int64_t, int> seen;
  std::mutex mu;
  absl::Status wrong_rank = Pull(server->address(), 7, 0, 0, &seen, &mu);
  EXPECT_EQ(wrong_rank.code(), absl::StatusCode::kInvalidArgument) << wrong_rank;
  EXPECT_NE(wrong_rank.message().find("not a rank of jobs/a (2 ranks)"), std::string::npos) << wrong_rank;
  EXPECT_EQ(Pull(server->address(), 0, 100000, 0, &seen, &mu).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(DataLoaderClient::Connect("127.0.0.1:1", Config(), absl::Milliseconds(300)).status().code(),
            absl::StatusCode::kUnavailable);
  // A job naming a dataset that does not exist gets the path back.
  v1::DataConfig missing = Config("jobs/missing");
  missing.set_dataset(*dir_ + "/no-such-dataset");
  absl::Status not_found = DataLoaderClient::Connect(server->address(), missing).status();
  EXPECT_EQ(not_found.code(), absl::StatusCode::kNotFound) << not_found;
  EXPECT_NE(not_found.message().find("no-such-dataset"), std::string::npos) << not_found;
}

TEST_F(ServiceTest, AbandonedStreamDoesNotBlockTheServer) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  {
    auto client = DataLoaderClient::Connect(server->address(), Config());
    ASSERT_TRUE(client.ok());
    auto stream = (*client)->StreamBatches(0, 0, 0);
    ASSERT_TRUE(stream.ok());
    data::RankBatch b;
    ASSERT_TRUE((*stream)->Next(&b).value());
  }  // Dropped after one batch, with more prefetched.
  std::map<int64_t, int> seen;
  std::mutex mu;
  EXPECT_TRUE(Pull(server->address(), 0, 0, 3, &seen, &mu).ok());
}

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
  send(fd, req.data(), req.size(), 0);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
  close(fd);
  return out;
}

TEST_F(ServiceTest, MetricsEndpointReportsTrafficGapsAndQueues) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  std::map<int64_t, int> seen;
  std::mutex mu;
  ASSERT_TRUE(Pull(server->address(), 1, 0, 4, &seen, &mu).ok());
  std::string text = HttpGet(server->metrics_port(), "/metrics");
  EXPECT_NE(text.find("200 OK"), std::string::npos) << text;
  size_t samples = 0;
  for (const auto& [id, n] : seen) samples += n;
  EXPECT_NE(text.find("recfleet_dataloader_samples_total{rank=\"1\",recfleet_job=\"jobs/a\"} " + std::to_string(samples)),
            std::string::npos)
      << text;
  // The stream ended: its queue depth series is gone, not left at 0.
  EXPECT_EQ(text.find("recfleet_dataloader_queue_depth{"), std::string::npos) << text;
  EXPECT_NE(text.find("recfleet_dataloader_straggler_gap{dealing=\"naive\",recfleet_job=\"jobs/a\"}"), std::string::npos);
  EXPECT_NE(text.find("recfleet_dataloader_straggler_gap{dealing=\"policy\",recfleet_job=\"jobs/a\"}"), std::string::npos);
  EXPECT_NE(text.find("recfleet_dataloader_bytes_per_second"), std::string::npos);
  EXPECT_NE(HttpGet(server->metrics_port(), "/other").find("404"), std::string::npos);
}

// One rank's stream of a one-rank job over its own synthetic dataset, and
// the loader's sent counters for it.
struct OneStream {
  std::string dir, job;
  std::unique_ptr<LoaderServer> server;
  std::unique_ptr<DataLoaderClient> client;
  std::unique_ptr<BatchStream> stream;

  static OneStream Open(const std::string& name, int64_t samples, const std::string& lengths, int batch, int base,
                        int prefetch) {
    OneStream out;
    out.dir = std::string(testing::TempDir()) + "/" + name;
    data::SynthOptions o;
    o.samples = samples;
    o.lengths = *data::LengthDistribution::Parse(lengths);
    o.num_items = 3000;
    o.eval_fraction = 0.0;
    EXPECT_TRUE(data::GenerateSynthetic(o, out.dir).ok());
    ServerOptions so;
    so.service.prefetch = prefetch;
    auto server = LoaderServer::Start(so);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return out;
    out.server = *std::move(server);
    out.job = "jobs/" + name;
    auto client =
        DataLoaderClient::Connect(out.server->address(), DataConfigFor(out.job, out.dir, 1, batch, base, 5));
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return out;
    out.client = *std::move(client);
    auto stream = out.client->StreamBatches(0, 0, 0);
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (stream.ok()) out.stream = *std::move(stream);
    return out;
  }

  // The loader's samples_total and bytes_total for the stream (-1 where a
  // series is absent).
  std::pair<double, double> Sent() const {
    auto got = recfleet::HttpGet("127.0.0.1:" + std::to_string(server->metrics_port()), "/metrics");
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return {-1, -1};
    auto e = metrics::ParseExposition(got->body);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return {-1, -1};
    const std::string labels = "{rank=\"0\",recfleet_job=\"" + job + "\"}";
    auto value = [&](const std::string& name) {
      auto it = e->samples.find(name + labels);
      return it == e->samples.end() ? -1.0 : it->second;
    };
    return {value("recfleet_dataloader_samples_total"), value("recfleet_dataloader_bytes_total")};
  }
};

// A reader that stops reading keeps at most the transport's bounded
// read-ahead (kStreamLookaheadBytes) plus the loader's prefetched batches
// ahead of it: measured from the loader's sent counters while the client
// sits on an open stream, after reading fast enough for bandwidth probing
// (off in the client) to have grown an unbounded window (with it on, this
// measured 6.2 MB ahead).
TEST(StreamReadAhead, StalledReaderHoldsTheBoundedWindowOnly) {
  constexpr int kPrefetch = 2, kBatch = 32;
  OneStream s = OneStream::Open("readahead", 40000, "lognormal:mean=40,sigma=0.8,min=1,max=400", kBatch, 16,
                                kPrefetch);
  ASSERT_NE(s.stream, nullptr);
  data::RankBatch b;
  int64_t read = 0;
  for (int i = 0; i < 400; ++i) {
    ASSERT_TRUE(s.stream->Next(&b).value());
    read += static_cast<int64_t>(b.samples.num_rows());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto [sent, bytes] = s.Sent();
  ASSERT_GT(sent, 0);
  ASSERT_GT(bytes, 0);
  const double bytes_per_sample = bytes / sent;
  const double ahead = (sent - static_cast<double>(read)) * bytes_per_sample;
  // The window, the prefetched batches and the one in Write (measured: 1.08
  // MB ahead, of which the window 1.05), with the window again as a margin
  // for what the transport buffers besides.
  const double bound = 2.0 * kStreamLookaheadBytes + (kPrefetch + 1) * kBatch * bytes_per_sample;
  EXPECT_LE(ahead, bound) << "the loader sent " << sent << " samples, the client read " << read << " ("
                          << bytes_per_sample << " bytes a sample)";
  // The whole epoch is far more than the bound, so the bound is what held.
  EXPECT_GT(static_cast<double>(TrainRowsOf(s.dir)) * bytes_per_sample, 4 * bound);
}

// A rank batch larger than the transport's read-ahead still arrives, whole.
TEST(StreamReadAhead, BatchLargerThanTheWindowArrives) {
  OneStream s = OneStream::Open("large", 6000, "lognormal:mean=200,sigma=0.3,min=100,max=400", 2048, 256, 4);
  ASSERT_NE(s.stream, nullptr);
  data::RankBatch b;
  ASSERT_TRUE(s.stream->Next(&b).value());
  EXPECT_EQ(b.samples.num_rows(), 2048u);
  const auto [sent, bytes] = s.Sent();
  ASSERT_GT(sent, 0);
  EXPECT_GT(bytes / sent * 2048, 2.0 * kStreamLookaheadBytes) << "the batch is not larger than the window";
}

}  // namespace
}  // namespace recfleet::dataloader
