#ifndef RECFLEET_WORKER_COMM_GLOO_COMMUNICATOR_H_
#define RECFLEET_WORKER_COMM_GLOO_COMMUNICATOR_H_

// The CPU backend: collectives over Gloo's TCP transport on host tensors.
// Used by CPU workers (tests, the local demo) and as the reference the NCCL
// backend is checked against.
//
// Failure behavior: a peer process that dies closes its sockets, and the
// others fail with Unavailable as soon as the kernel reports it; a peer that
// stays alive but stops calling makes the others fail with DeadlineExceeded
// after the communicator's timeout. A rendezvous whose peers never arrive
// fails with DeadlineExceeded after the same timeout.
//
// Process-wide effect: creating a GlooTransport sets SIGPIPE to SIG_IGN if
// it still has its default action, because Gloo's sockets would otherwise
// kill the process when a peer dies.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/kv_store.h"

namespace gloo {
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace recfleet {
namespace comm {

// The TCP transport of one process: a listening socket and an event loop
// thread. Every Gloo communicator of the process (one per process group)
// may share one. Thread-safe.
class GlooTransport {
 public:
  // Binds to `hostname` (an address of this host; "127.0.0.1" for
  // single-host runs) on a port the OS picks.
  static absl::StatusOr<std::shared_ptr<GlooTransport>> Create(const std::string& hostname);

  std::shared_ptr<gloo::transport::Device> device() const { return device_; }

 private:
  explicit GlooTransport(std::shared_ptr<gloo::transport::Device> device) : device_(std::move(device)) {}
  std::shared_ptr<gloo::transport::Device> device_;
};

// Joins the group of `size` ranks as `rank`: publishes this rank's address
// in `store` and connects to every peer. All ranks must use stores that see
// the same keys (typically one PrefixKvStore namespace per group and epoch).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(KvStore& store, int rank, int size,
                                                          std::shared_ptr<GlooTransport> transport,
                                                          const CommOptions& options);

}  // namespace comm
}  // namespace recfleet

#endif  // RECFLEET_WORKER_COMM_GLOO_COMMUNICATOR_H_
