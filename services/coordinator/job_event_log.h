#ifndef RECFLEET_SERVICES_COORDINATOR_JOB_EVENT_LOG_H_
#define RECFLEET_SERVICES_COORDINATOR_JOB_EVENT_LOG_H_

// The events WatchJob streams, per job: a bounded buffer of numbered events
// (state changes and progress), so a watcher can ask for everything after the
// last sequence number it saw. A watcher further behind than the buffer is
// told it missed events and must resynchronize from a snapshot.
//
// Not thread-safe: the coordinator holds its mutex around every call (events
// are appended in the same critical section as the change they describe).

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "recfleet/v1/job_service.pb.h"

namespace recfleet::coordinator {

class JobEventLog {
 public:
  // (sequence number, event); sequence numbers start at 1 per job.
  using Event = std::pair<int64_t, ::recfleet::v1::WatchJobResponse>;

  // Keeps the newest `capacity` events of each job.
  explicit JobEventLog(int capacity) : capacity_(capacity) {}

  // Appends `event` to the job's log and returns its sequence number.
  int64_t Append(const std::string& job_id, ::recfleet::v1::WatchJobResponse event);

  // Sequence number of the job's latest event; 0 when it has none.
  int64_t LastSeq(const std::string& job_id) const;

  // The events after sequence number `after`. `missed` is set (and `events`
  // empty) when some of them were already dropped from the buffer: the
  // caller should send a snapshot at LastSeq() instead. Both empty: nothing
  // new yet.
  struct Since {
    bool missed = false;
    std::vector<Event> events;
  };
  Since EventsAfter(const std::string& job_id, int64_t after) const;

  // The job reached a terminal state at `when`: its log is kept for late
  // watchers until DropEndedBefore passes `when`.
  void MarkEnded(const std::string& job_id, absl::Time when);
  // Forgets the log of one job (deleted).
  void Forget(const std::string& job_id) { logs_.erase(job_id); }
  // Forgets the logs of jobs that ended before `cutoff`.
  void DropEndedBefore(absl::Time cutoff);

 private:
  struct Log {
    int64_t last_seq = 0;
    std::deque<Event> events;  // Oldest first.
    absl::Time ended = absl::InfiniteFuture();
  };

  const int capacity_;
  std::map<std::string, Log> logs_;
};

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_JOB_EVENT_LOG_H_
