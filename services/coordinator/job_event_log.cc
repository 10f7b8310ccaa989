#include "services/coordinator/job_event_log.h"

namespace recfleet::coordinator {

int64_t JobEventLog::Append(const std::string& job_id, ::recfleet::v1::WatchJobResponse event) {
  Log& log = logs_[job_id];
  log.events.emplace_back(++log.last_seq, std::move(event));
  while (static_cast<int>(log.events.size()) > capacity_) log.events.pop_front();
  return log.last_seq;
}

int64_t JobEventLog::LastSeq(const std::string& job_id) const {
  auto it = logs_.find(job_id);
  return it == logs_.end() ? 0 : it->second.last_seq;
}

JobEventLog::Since JobEventLog::EventsAfter(const std::string& job_id, int64_t after) const {
  Since out;
  auto it = logs_.find(job_id);
  if (it == logs_.end() || it->second.last_seq <= after) return out;
  const std::deque<Event>& events = it->second.events;
  if (events.empty() || events.front().first > after + 1) {
    out.missed = true;
    return out;
  }
  for (const Event& e : events) {
    if (e.first > after) out.events.push_back(e);
  }
  return out;
}

void JobEventLog::MarkEnded(const std::string& job_id, absl::Time when) {
  logs_[job_id].ended = when;
}

void JobEventLog::DropEndedBefore(absl::Time cutoff) {
  for (auto it = logs_.begin(); it != logs_.end();) {
    if (it->second.ended < cutoff) {
      it = logs_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace recfleet::coordinator
