// What the Gloo backend publishes in the rendezvous store (which is the
// coordinator's, readable by the job's other ranks): its listening
// addresses, with no byte of stale process memory in them.

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"

namespace recfleet {
namespace comm {
namespace {

// Gloo's serialized tcp::Address: a sockaddr_storage, then a sequence number.
constexpr size_t kAddressBytes = sizeof(sockaddr_storage) + sizeof(ssize_t);

class RecordingStore : public KvStore {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      values_.emplace_back(key, value);
    }
    return inner_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key) override { return inner_.Get(key); }
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override {
    return inner_.Wait(keys, timeout);
  }
  std::vector<std::pair<std::string, std::string>> values() {
    std::lock_guard<std::mutex> l(mu_);
    return values_;
  }

 private:
  InProcessKvStore inner_;
  std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> values_;
};

// Leaves a recognizable pattern where the next calls' stack frames will be,
// as an earlier computation of the process would.
__attribute__((noinline)) void DirtyStack() {
  volatile unsigned char junk[256 << 10];
  for (size_t i = 0; i < sizeof(junk); ++i) junk[i] = 0xA5;
}

TEST(GlooRendezvousTest, PublishedAddressesCarryNoStaleBytes) {
  RecordingStore store;
  constexpr int kSize = 3;
  std::vector<absl::Status> results(kSize);
  std::vector<std::unique_ptr<Communicator>> comms(kSize);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kSize; ++rank) {
    threads.emplace_back([&, rank] {
      // The transport reads its listening address (getsockname) here.
      DirtyStack();
      absl::StatusOr<std::shared_ptr<GlooTransport>> transport = GlooTransport::Create("127.0.0.1");
      if (!transport.ok()) {
        results[rank] = transport.status();
        return;
      }
      DirtyStack();
      CommOptions options;
      options.timeout = absl::Seconds(20);
      absl::StatusOr<std::unique_ptr<Communicator>> c =
          ConnectGloo(store, rank, kSize, *std::move(transport), options);
      results[rank] = c.status();
      if (c.ok()) comms[rank] = *std::move(c);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;

  int addresses = 0;
  for (const auto& [key, value] : store.values()) {
    if (value.empty() || value.size() % kAddressBytes != 0) continue;
    for (size_t at = 0; at < value.size(); at += kAddressBytes) {
      sockaddr_storage ss;
      std::memcpy(&ss, value.data() + at, sizeof(ss));
      ASSERT_EQ(ss.ss_family, AF_INET) << "key " << key;
      ++addresses;
      for (size_t i = sizeof(sockaddr_in); i < sizeof(sockaddr_storage); ++i) {
        ASSERT_EQ(static_cast<unsigned char>(value[at + i]), 0)
            << "key " << key << ": byte " << i << " of address " << at / kAddressBytes
            << " is not part of an IPv4 address but holds " << int(static_cast<unsigned char>(value[at + i]));
      }
    }
  }
  // Each rank publishes one address per peer.
  EXPECT_EQ(addresses, kSize * (kSize - 1));
}

}  // namespace
}  // namespace comm
}  // namespace recfleet
