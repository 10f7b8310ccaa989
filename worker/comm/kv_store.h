#ifndef RECFLEET_WORKER_COMM_KV_STORE_H_
#define RECFLEET_WORKER_COMM_KV_STORE_H_

// The rendezvous key-value store that bootstraps every communicator: ranks
// publish addresses (Gloo) or unique ids (NCCL) under agreed keys and wait
// for each other's. Keys are written once; a later Set of the same key
// overwrites it. Implementations: InProcessKvStore (ranks are threads of one
// process), FileKvStore (ranks are processes sharing a directory) and the
// coordinator-backed client, which fences every call by the job's restart
// epoch.
//
// Every rendezvous of one job and one restart epoch lives under its own key
// namespace (RendezvousNamespace + PrefixKvStore), so a late rank of an old
// epoch can never read a key published for the new one.

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace recfleet {
namespace comm {

// Interface. Implementations are thread-safe.
class KvStore {
 public:
  virtual ~KvStore() = default;

  // Publishes `value` under `key`.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // The value under `key`; NotFound if nobody set it yet (no waiting).
  virtual absl::StatusOr<std::string> Get(absl::string_view key) = 0;
  // Blocks until every key in `keys` is set; DeadlineExceeded naming the
  // missing keys once `timeout` has passed.
  virtual absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) = 0;
};

// "job/<job_id>/epoch/<epoch>/": the namespace of one rendezvous.
std::string RendezvousNamespace(absl::string_view job_id, int64_t epoch);

// The DeadlineExceeded every implementation's Wait returns, naming the keys
// still missing (they tell which peer never arrived).
absl::Status RendezvousTimeoutError(absl::Span<const std::string> missing, absl::Duration timeout);

// Waits for `key` and returns its value.
absl::StatusOr<std::string> WaitAndGet(KvStore& store, absl::string_view key, absl::Duration timeout);

// Prepends a fixed prefix to every key of a base store (not owned, must
// outlive this object).
class PrefixKvStore : public KvStore {
 public:
  PrefixKvStore(KvStore* base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override;

  const std::string& prefix() const { return prefix_; }

 private:
  KvStore* base_;
  std::string prefix_;
};

// A map in memory, for ranks that are threads of one process (tests,
// single-process multi-GPU runs).
class InProcessKvStore : public KvStore {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override;

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// One file per key in a directory that every rank can see (processes on one
// host, or a shared file system). Set writes a temporary file and renames it,
// so a reader sees a value whole or not at all. Wait polls.
class FileKvStore : public KvStore {
 public:
  // Creates `directory` if it does not exist.
  static absl::StatusOr<std::unique_ptr<FileKvStore>> Open(std::string directory);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override;

 private:
  explicit FileKvStore(std::string directory) : directory_(std::move(directory)) {}
  // Keys may hold '/', which becomes a file-name-safe escape.
  std::string PathFor(absl::string_view key) const;

  std::string directory_;
};

}  // namespace comm
}  // namespace recfleet

#endif  // RECFLEET_WORKER_COMM_KV_STORE_H_
