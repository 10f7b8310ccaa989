#include "worker/comm/testing.h"

#include <thread>

#include "gtest/gtest.h"

#include "worker/comm/gloo_communicator.h"

namespace recfleet {
namespace comm {

void RunOnThreads(int size, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int r = 0; r < size; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ConnectGlooGroup(KvStore& store, int size,
                                                                            const CommOptions& options) {
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> results(size);
  RunOnThreads(size, [&](int rank) {
    absl::StatusOr<std::shared_ptr<GlooTransport>> transport = GlooTransport::Create("127.0.0.1");
    if (!transport.ok()) {
      results[rank] = transport.status();
      return;
    }
    results[rank] = ConnectGloo(store, rank, size, *std::move(transport), options);
  });
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    comms.push_back(*std::move(r));
  }
  return comms;
}

CommFactory LoopbackGloo(absl::Duration timeout) {
  auto transport = GlooTransport::Create("127.0.0.1");
  EXPECT_TRUE(transport.ok()) << transport.status();
  CommOptions options;
  options.timeout = timeout;
  return [transport = *transport, options](KvStore& s, int r, int n) { return ConnectGloo(s, r, n, transport, options); };
}

void CheckKvStoreContract(KvStore& store) {
  EXPECT_EQ(store.Get("a/b").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store.Set("a/b", std::string("x\0y", 3)).ok());
  auto v = store.Get("a/b");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("x\0y", 3));  // Binary values survive.
  ASSERT_TRUE(store.Set("a/b", "z").ok());
  EXPECT_EQ(*store.Get("a/b"), "z");

  // Wait returns once a late writer has set every key.
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_TRUE(store.Set("late1", "1").ok());
    EXPECT_TRUE(store.Set("late2", "2").ok());
  });
  EXPECT_TRUE(store.Wait({"a/b", "late1", "late2"}, absl::Seconds(10)).ok());
  writer.join();

  // A key nobody sets: DeadlineExceeded, naming it, after about the timeout.
  const absl::Time start = absl::Now();
  absl::Status s = store.Wait({"late1", "never"}, absl::Milliseconds(100));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("never"), absl::string_view::npos) << s;
  EXPECT_EQ(s.message().find("late1"), absl::string_view::npos) << s;
  EXPECT_GE(took, absl::Milliseconds(90));
  EXPECT_LT(took, absl::Seconds(5));
}

std::vector<Communicator*> Raw(const std::vector<std::unique_ptr<Communicator>>& comms) {
  std::vector<Communicator*> out;
  for (const auto& c : comms) out.push_back(c.get());
  return out;
}

}  // namespace comm
}  // namespace recfleet
