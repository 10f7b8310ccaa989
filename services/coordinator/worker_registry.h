#ifndef RECFLEET_SERVICES_COORDINATOR_WORKER_REGISTRY_H_
#define RECFLEET_SERVICES_COORDINATOR_WORKER_REGISTRY_H_

// Live worker daemons, their leases and credentials. A worker is live from RegisterWorker
// until its lease (renewed by every heartbeat) runs out; Expire() removes the
// workers whose lease ended and returns them so the caller can restart their
// jobs. Worker state is soft: after a coordinator restart workers register
// again (see worker_service.proto), so nothing here is persisted.
//
// Not thread-safe: the Coordinator serializes access. Time is passed in, so
// tests drive expiry without sleeping.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recfleet/v1/worker_service.pb.h"

namespace recfleet::coordinator {

// What the coordinator knows about one worker.
struct WorkerRecord {
  std::string id;
  // The random secret drawn at registration; every later call of the
  // worker must present it (worker_service.proto, "Worker identity").
  std::string credential;
  ::recfleet::v1::RegisterWorkerRequest info;  // Host, GPUs, topology.
  absl::Time registered;
  absl::Time lease_expiry;
  // The job this worker is assigned to ("" = idle), its first rank and the
  // epoch of the assignment.
  std::string job_id;
  int rank = -1;
  int64_t epoch = 0;
  // The worker's last reported task.
  ::recfleet::v1::TaskStatus task;

  bool idle() const { return job_id.empty(); }
  int gpu_count() const { return info.gpus_size(); }
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(absl::Duration lease) : lease_(lease) {}

  absl::Duration lease() const { return lease_; }

  // Adds a worker with a fresh lease and a new random credential.
  // `info.worker_id` empty = a new id is drawn; otherwise the worker is
  // registered under that id, replacing any record of it (returned in
  // *replaced when non-null). Replacing a record whose lease is still live
  // needs that record's credential in `info.worker_credential`, so nobody
  // can take over a live worker's id.
  // Errors: INVALID_ARGUMENT (no host, bad id), PERMISSION_DENIED (live id,
  // wrong credential), INTERNAL (no randomness).
  absl::StatusOr<WorkerRecord*> Register(const ::recfleet::v1::RegisterWorkerRequest& info,
                                         absl::Time now, WorkerRecord* replaced);

  // The worker `id` if `credential` is its registration's credential.
  // Errors: NOT_FOUND (unknown: the worker must register again),
  // PERMISSION_DENIED (wrong credential).
  absl::StatusOr<WorkerRecord*> Authenticate(const std::string& id,
                                             const std::string& credential);

  // Authenticates, then extends the lease of a live worker. Errors: those of
  // Authenticate; NOT_FOUND also when the lease expired.
  absl::StatusOr<WorkerRecord*> Renew(const std::string& id, const std::string& credential,
                                      absl::Time now);

  // A live worker, or nullptr.
  WorkerRecord* Find(const std::string& id);

  // Removes and returns the workers whose lease ended at or before `now`.
  std::vector<WorkerRecord> Expire(absl::Time now);

  // Live workers, by id.
  const std::map<std::string, WorkerRecord>& workers() const { return workers_; }

  int64_t idle_count() const;

 private:
  const absl::Duration lease_;
  std::map<std::string, WorkerRecord> workers_;
};

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_WORKER_REGISTRY_H_
