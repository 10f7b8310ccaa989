#ifndef RECFLEET_SERVICES_COORDINATOR_RENDEZVOUS_H_
#define RECFLEET_SERVICES_COORDINATOR_RENDEZVOUS_H_

// The rendezvous key-value store ranks use to bootstrap collectives (NCCL
// unique ids, Gloo's store). One namespace per job, fenced by the job's
// restart epoch: Open(job, e) discards the namespace of any older epoch and
// fails its pending waits, and every call must name the current epoch, so a
// rank of a previous attempt can neither read nor overwrite the new one's keys.
//
// Wait() is asynchronous (the gRPC adapter finishes the call from the
// callback, so a waiting rank holds no thread); a timer thread enforces
// deadlines. Callbacks run without internal locks held, on the calling
// thread of Set/Open/Close or on the timer thread.
//
// Thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace recfleet::coordinator {

class Rendezvous {
 public:
  using WaitCallback = std::function<void(absl::StatusOr<std::vector<std::string>>)>;

  // Limits from worker_service.proto.
  static constexpr size_t kMaxKeyBytes = 512;
  static constexpr size_t kMaxValueBytes = 1 << 20;

  Rendezvous();
  ~Rendezvous();  // Fails pending waits with UNAVAILABLE.

  // Starts epoch `epoch` of `job` with an empty namespace.
  void Open(const std::string& job, int64_t epoch);
  // Drops the job's namespace (job finished or waiting to be re-placed).
  void Close(const std::string& job);

  // Errors: NOT_FOUND (no open namespace for the job), FAILED_PRECONDITION
  // (epoch is not the current one), INVALID_ARGUMENT (key/value size).
  absl::Status Set(const std::string& job, int64_t epoch, const std::string& key,
                   std::string value);
  absl::StatusOr<std::string> Get(const std::string& job, int64_t epoch, const std::string& key);

  // Calls `done` exactly once: with the values of `keys` (in order) as soon as
  // all exist; DEADLINE_EXCEEDED at `deadline`; FAILED_PRECONDITION /
  // NOT_FOUND if the epoch is or becomes stale or the job closes.
  void Wait(const std::string& job, int64_t epoch, std::vector<std::string> keys,
            absl::Time deadline, WaitCallback done);

  // Fails every pending and future Wait with UNAVAILABLE (server shutdown:
  // lets in-flight calls finish). Idempotent.
  void Shutdown();

  // Number of keys across all namespaces (for metrics).
  int64_t key_count() const;

 private:
  struct Waiter {
    std::vector<std::string> keys;
    absl::Time deadline;
    WaitCallback done;
  };
  struct Namespace {
    int64_t epoch = 0;
    std::map<std::string, std::string> values;
    std::map<uint64_t, Waiter> waiters;  // By waiter id.
  };
  using Fired = std::vector<std::pair<WaitCallback, absl::StatusOr<std::vector<std::string>>>>;

  absl::Status CheckLocked(const std::string& job, int64_t epoch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves waiters of `ns` whose keys all exist into `fired`.
  static void CollectReady(Namespace& ns, Fired& fired);
  static void FailAll(Namespace& ns, const absl::Status& status, Fired& fired);
  void TimerLoop();

  mutable absl::Mutex mu_;
  std::map<std::string, Namespace> namespaces_ ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_RENDEZVOUS_H_
