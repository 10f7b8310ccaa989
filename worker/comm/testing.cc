#include "worker/comm/testing.h"

#include <thread>

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

std::vector<Communicator*> Raw(const std::vector<std::unique_ptr<Communicator>>& comms) {
  std::vector<Communicator*> out;
  for (const auto& c : comms) out.push_back(c.get());
  return out;
}

}  // namespace comm
}  // namespace recfleet
