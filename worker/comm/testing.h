#ifndef RECFLEET_WORKER_COMM_TESTING_H_
#define RECFLEET_WORKER_COMM_TESTING_H_

// Test helpers: several ranks as threads of one process, connected over
// Gloo on 127.0.0.1 through an in-process store.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/process_groups.h"

namespace recfleet {
namespace comm {

// Runs fn(rank) for rank in [0, size) on `size` threads and joins them.
void RunOnThreads(int size, const std::function<void(int rank)>& fn);

// Connects `size` Gloo ranks (one thread each, each with its own transport)
// through `store` and returns their communicators, indexed by rank.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ConnectGlooGroup(KvStore& store, int size,
                                                                            const CommOptions& options);

// Rank r's factory of Gloo communicators over 127.0.0.1 (its own transport;
// collectives time out after `timeout`), for ProcessGroups::Build and the
// backend-independent checks that connect each rank themselves.
CommFactory LoopbackGloo(absl::Duration timeout = absl::Seconds(30));

// Checks, with gtest expectations, the contract every KvStore keeps: Get of
// a missing key is NotFound, values are binary-safe and overwritable, Wait
// returns once late keys are set and fails with DeadlineExceeded naming the
// missing keys after about its timeout. Leaves keys "a/b", "late1" and
// "late2" set.
void CheckKvStoreContract(KvStore& store);

// Borrowed pointers to `comms`, in order.
std::vector<Communicator*> Raw(const std::vector<std::unique_ptr<Communicator>>& comms);

}  // namespace comm
}  // namespace recfleet

#endif  // RECFLEET_WORKER_COMM_TESTING_H_
