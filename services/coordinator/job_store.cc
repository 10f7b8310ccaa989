#include "services/coordinator/job_store.h"

#include <sqlite3.h>

#include <limits>
#include <map>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/random/random.h"
#include "google/protobuf/util/message_differencer.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "services/coordinator/time_util.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::Job;
using ::recfleet::v1::JobSpec;
using ::recfleet::v1::JobStatus;
using ::recfleet::v1::JobTransition;

constexpr int kSchemaVersion = 1;

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order; page tokens use it
  id TEXT NOT NULL UNIQUE,
  request_id TEXT UNIQUE,                 -- NULL when the client gave none
  state INTEGER NOT NULL,                 -- JobStatus.State, also inside status
  spec BLOB NOT NULL,                     -- serialized recfleet.v1.JobSpec
  status BLOB NOT NULL                    -- serialized recfleet.v1.JobStatus
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state);
CREATE TABLE IF NOT EXISTS transitions (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  transition BLOB NOT NULL,               -- serialized recfleet.v1.JobTransition
  from_state INTEGER NOT NULL,            -- duplicated for ad-hoc SQL queries
  to_state INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_by_job ON transitions(job_id, seq);
CREATE TABLE IF NOT EXISTS meta (
  key TEXT PRIMARY KEY,
  value BLOB NOT NULL                     -- page_token_key: 32 random bytes
);
)sql";

// Resets a cached statement when the scope ends.
class StmtScope {
 public:
  explicit StmtScope(sqlite3_stmt* s) : s_(s) {}
  ~StmtScope() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  sqlite3_stmt* get() const { return s_; }

 private:
  sqlite3_stmt* s_;
};

void BindText(sqlite3_stmt* s, int i, const std::string& v) {
  sqlite3_bind_text(s, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
}
void BindBlob(sqlite3_stmt* s, int i, const std::string& v) {
  sqlite3_bind_blob(s, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
}
std::string ColumnBytes(sqlite3_stmt* s, int i) {
  const void* p = sqlite3_column_blob(s, i);
  return p == nullptr ? std::string() : std::string(static_cast<const char*>(p),
                                                    sqlite3_column_bytes(s, i));
}

std::string NewJobId() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  thread_local absl::BitGen gen;
  std::string id = "j";
  for (int i = 0; i < 9; ++i) id.push_back(kAlphabet[absl::Uniform(gen, 0, 36)]);
  return id;
}

// A page token: base64url of the position (8 bytes, little-endian) and the
// first 16 bytes of HMAC-SHA256(key, position || the query's canonical
// form).
constexpr size_t kTokenMacBytes = 16;

std::string CanonicalQuery(const JobStore::Query& q) {
  std::string out = "states:";
  for (JobState st : q.states) absl::StrAppend(&out, static_cast<int>(st), ",");
  for (const auto& [k, v] : q.labels) {
    absl::StrAppend(&out, "|label:", k.size(), ":", k, "=", v.size(), ":", v);
  }
  return out;
}

std::string TokenMac(const std::string& key, const std::string& position,
                     const JobStore::Query& q) {
  const std::string msg = position + CanonicalQuery(q);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), kTokenMacBytes);
}

std::string Position(int64_t seq) {
  std::string p(8, '\0');
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((static_cast<uint64_t>(seq) >> (8 * i)) & 0xff);
  return p;
}

bool ParsePageToken(const std::string& key, const std::string& token, const JobStore::Query& q,
                    int64_t* seq) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw) || raw.size() != 8 + kTokenMacBytes) return false;
  const std::string position = raw.substr(0, 8);
  const std::string want = TokenMac(key, position, q);
  if (CRYPTO_memcmp(want.data(), raw.data() + 8, kTokenMacBytes) != 0) return false;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(position[i])) << (8 * i);
  *seq = static_cast<int64_t>(v);
  return *seq > 0;
}

bool HasLabels(const JobSpec& spec, const std::map<std::string, std::string>& labels) {
  for (const auto& [k, v] : labels) {
    auto it = spec.labels().find(k);
    if (it == spec.labels().end() || it->second != v) return false;
  }
  return true;
}

// Job ids are [a-z0-9-]+ (see Job.name in job.proto).
bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

}  // namespace

std::string JobName(const std::string& id) { return "jobs/" + id; }

absl::Status ValidateJobId(const std::string& job_id) {
  if (job_id.empty()) return absl::OkStatus();
  const bool ok = job_id.size() <= 63 && job_id[0] >= 'a' && job_id[0] <= 'z' &&
                  job_id.back() != '-' && ValidId(job_id);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "job_id must be 1-63 characters of [a-z0-9-], start with a letter and not end with '-', "
      "got \"", job_id, "\""));
}

absl::StatusOr<std::string> ParseJobName(const std::string& name, const std::string& field) {
  if (!absl::StartsWith(name, "jobs/") || !ValidId(name.substr(5))) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be \"jobs/{id}\" with id of [a-z0-9-], got \"", name, "\""));
  }
  return name.substr(5);
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = absl::StrCat("cannot open job store ", path, ": ",
                                   db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    sqlite3_close(db);
    return absl::UnavailableError(msg);
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<JobStore> store(new JobStore(db));
  absl::MutexLock lock(&store->mu_);
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL",
                             "PRAGMA foreign_keys=ON"}) {
    if (absl::Status s = store->ExecLocked(pragma); !s.ok()) return s;
  }
  sqlite3_stmt* v = store->Prepare("PRAGMA user_version");
  if (v == nullptr) return store->Error("read schema version of " + path);
  int version = 0;
  {
    StmtScope scope(v);
    if (sqlite3_step(v) == SQLITE_ROW) version = sqlite3_column_int(v, 0);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("job store ", path, " has schema version ", version,
                     "; this coordinator understands up to ", kSchemaVersion));
  }
  if (absl::Status s = store->ExecLocked(kSchema); !s.ok()) return s;
  if (absl::Status s = store->ExecLocked("PRAGMA user_version=1"); !s.ok()) return s;
  // The page-token key: drawn once per database, so tokens survive a
  // coordinator restart on the same file.
  sqlite3_stmt* k = store->Prepare("SELECT value FROM meta WHERE key = 'page_token_key'");
  if (k == nullptr) return store->Error("read the page-token key of " + path);
  {
    StmtScope scope(k);
    if (sqlite3_step(k) == SQLITE_ROW) store->token_key_ = ColumnBytes(k, 0);
  }
  if (store->token_key_.size() != 32) {
    std::string key(32, '\0');
    if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), 32) != 1) {
      return absl::InternalError("job store: no random bytes for the page-token key");
    }
    sqlite3_stmt* w = store->Prepare(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('page_token_key', ?)");
    if (w == nullptr) return store->Error("prepare page-token key");
    StmtScope scope(w);
    BindBlob(w, 1, key);
    if (sqlite3_step(w) != SQLITE_DONE) return store->Error("store the page-token key");
    store->token_key_ = key;
  }
  return store;
}

std::string JobStore::PageToken(int64_t seq, const Query& query) const {
  const std::string position = Position(seq);
  return absl::WebSafeBase64Escape(position + TokenMac(token_key_, position, query));
}

JobStore::~JobStore() {
  absl::MutexLock lock(&mu_);
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  sqlite3_close(db_);
}

absl::Status JobStore::Error(const std::string& what) {
  return absl::UnavailableError(absl::StrCat("job store: ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status JobStore::ExecLocked(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = absl::StrCat("job store: ", sql, ": ", err != nullptr ? err : "?");
    sqlite3_free(err);
    return absl::UnavailableError(msg);
  }
  return absl::OkStatus();
}

sqlite3_stmt* JobStore::Prepare(const char* sql) {
  for (auto& [text, stmt] : statements_) {
    if (text == sql) return stmt;
  }
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) return nullptr;
  statements_.emplace_back(sql, stmt);
  return stmt;
}

absl::StatusOr<Job> JobStore::GetLocked(const std::string& id) {
  sqlite3_stmt* s = Prepare("SELECT request_id, spec, status FROM jobs WHERE id = ?");
  if (s == nullptr) return Error("prepare get");
  StmtScope scope(s);
  BindText(s, 1, id);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE) return absl::NotFoundError(absl::StrCat(JobName(id), " not found"));
  if (rc != SQLITE_ROW) return Error("get " + id);
  Job job;
  job.set_name(JobName(id));
  if (!job.mutable_spec()->ParseFromString(ColumnBytes(s, 1)) ||
      !job.mutable_status()->ParseFromString(ColumnBytes(s, 2))) {
    return absl::DataLossError(absl::StrCat("job store: row of ", JobName(id), " is corrupt"));
  }
  return job;
}

absl::Status JobStore::InsertTransitionLocked(const std::string& id, const JobTransition& t) {
  sqlite3_stmt* s = Prepare(
      "INSERT INTO transitions (job_id, transition, from_state, to_state) VALUES (?, ?, ?, ?)");
  if (s == nullptr) return Error("prepare transition insert");
  StmtScope scope(s);
  BindText(s, 1, id);
  BindBlob(s, 2, t.SerializeAsString());
  sqlite3_bind_int(s, 3, t.from());
  sqlite3_bind_int(s, 4, t.to());
  if (sqlite3_step(s) != SQLITE_DONE) return Error("insert transition of " + id);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Job>> JobStore::FindCreatedLocked(const JobSpec& spec, const std::string& request_id,
                                                                const std::string& job_id) {
  if (request_id.empty()) return std::nullopt;
  sqlite3_stmt* s = Prepare("SELECT id FROM jobs WHERE request_id = ?");
  if (s == nullptr) return Error("prepare request_id lookup");
  std::string existing;
  {
    StmtScope scope(s);
    BindText(s, 1, request_id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
      existing = ColumnBytes(s, 0);
    } else if (rc != SQLITE_DONE) {
      return Error("look up request_id");
    }
  }
  if (existing.empty()) return std::nullopt;
  absl::StatusOr<Job> job = GetLocked(existing);
  if (!job.ok()) return job.status();
  if (!google::protobuf::util::MessageDifferencer::Equals(job->spec(), spec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id \"", request_id, "\" already created ", job->name(),
                     " with a different spec; use a new request_id for a new job"));
  }
  if (!job_id.empty() && job->name() != JobName(job_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id \"", request_id, "\" already created ", job->name(),
                     ", not jobs/", job_id, "; use a new request_id for a new job"));
  }
  return std::optional<Job>(*std::move(job));
}

absl::StatusOr<std::optional<Job>> JobStore::FindCreated(const JobSpec& spec, const std::string& request_id,
                                                         const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  return FindCreatedLocked(spec, request_id, job_id);
}

absl::StatusOr<Job> JobStore::Create(const JobSpec& spec, const std::string& request_id,
                                     absl::Time now, bool* created, const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  *created = false;
  absl::StatusOr<std::optional<Job>> existing = FindCreatedLocked(spec, request_id, job_id);
  if (!existing.ok()) return existing.status();
  if (existing->has_value()) return **existing;

  Job job;
  *job.mutable_spec() = spec;
  JobStatus* st = job.mutable_status();
  st->set_state(JobStatus::QUEUED);
  st->set_reason("Submitted");
  ToProto(now, st->mutable_create_time());
  ToProto(now, st->mutable_update_time());
  JobTransition t;
  t.set_from(JobStatus::STATE_UNSPECIFIED);
  t.set_to(JobStatus::QUEUED);
  t.set_reason("Submitted");
  ToProto(now, t.mutable_time());

  if (absl::Status s = ExecLocked("BEGIN IMMEDIATE"); !s.ok()) return s;
  sqlite3_stmt* s = Prepare(
      "INSERT INTO jobs (id, request_id, state, spec, status) VALUES (?, ?, ?, ?, ?)");
  if (s == nullptr) {
    ExecLocked("ROLLBACK").IgnoreError();
    return Error("prepare insert");
  }
  std::string id;
  // A chosen id gets one try; a drawn one retries on a clash.
  const int attempts = job_id.empty() ? 5 : 1;
  for (int attempt = 0; attempt < attempts && id.empty(); ++attempt) {
    std::string candidate = job_id.empty() ? NewJobId() : job_id;
    StmtScope scope(s);
    BindText(s, 1, candidate);
    if (request_id.empty()) {
      sqlite3_bind_null(s, 2);
    } else {
      BindText(s, 2, request_id);
    }
    sqlite3_bind_int(s, 3, JobStatus::QUEUED);
    BindBlob(s, 4, spec.SerializeAsString());
    BindBlob(s, 5, st->SerializeAsString());
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
      id = candidate;
    } else if (rc != SQLITE_CONSTRAINT) {  // A constraint failure is an id clash: retry.
      absl::Status err = Error("insert job");
      ExecLocked("ROLLBACK").IgnoreError();
      return err;
    }
  }
  if (id.empty()) {
    ExecLocked("ROLLBACK").IgnoreError();
    if (!job_id.empty()) {
      return absl::AlreadyExistsError(
          absl::StrCat("jobs/", job_id, " already exists; choose another job_id"));
    }
    return absl::InternalError("job store: could not draw an unused job id");
  }
  if (absl::Status s = InsertTransitionLocked(id, t); !s.ok()) {
    ExecLocked("ROLLBACK").IgnoreError();
    return s;
  }
  if (absl::Status s = ExecLocked("COMMIT"); !s.ok()) {
    ExecLocked("ROLLBACK").IgnoreError();
    return s;
  }
  job.set_name(JobName(id));
  *created = true;
  return job;
}

absl::StatusOr<Job> JobStore::Get(const std::string& id) {
  absl::MutexLock lock(&mu_);
  return GetLocked(id);
}

absl::StatusOr<JobStore::Page> JobStore::List(int page_size, const std::string& page_token,
                                              const Query& query, int64_t max_bytes) {
  int64_t after = std::numeric_limits<int64_t>::max();
  if (!page_token.empty() && !ParsePageToken(token_key_, page_token, query, &after)) {
    return absl::InvalidArgumentError(
        "page_token is not a next_page_token that ListJobs returned for this filter and these "
        "states; start again from the first page (empty page_token)");
  }
  std::string where = absl::StrCat("seq < ", after);
  if (!query.states.empty()) {
    absl::StrAppend(&where, " AND state IN (",
                    absl::StrJoin(query.states, ",", [](std::string* out, JobState s) {
                      absl::StrAppend(out, static_cast<int>(s));
                    }),
                    ")");
  }
  // Labels live inside the spec: rows are read newest first and filtered
  // here, until the page is full and one more match says another page
  // exists.
  std::string sql = absl::StrCat("SELECT seq, id, spec, status FROM jobs WHERE ", where,
                                 " ORDER BY seq DESC");
  if (query.labels.empty()) absl::StrAppend(&sql, " LIMIT ", page_size + 1);
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) {
    return Error("prepare list");
  }
  Page page;
  int64_t last_seq = 0;
  int64_t bytes = 0;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    const int64_t row_bytes = sqlite3_column_bytes(s, 2) + sqlite3_column_bytes(s, 3);
    Job job;
    job.set_name(JobName(ColumnBytes(s, 1)));
    if (!job.mutable_spec()->ParseFromString(ColumnBytes(s, 2)) ||
        !job.mutable_status()->ParseFromString(ColumnBytes(s, 3))) {
      sqlite3_finalize(s);
      return absl::DataLossError(absl::StrCat("job store: row of ", job.name(), " is corrupt"));
    }
    if (!HasLabels(job.spec(), query.labels)) continue;
    if (static_cast<int>(page.jobs.size()) == page_size ||
        (!page.jobs.empty() && bytes + row_bytes > max_bytes)) {
      page.next_page_token = PageToken(last_seq, query);
      break;
    }
    bytes += row_bytes;
    last_seq = sqlite3_column_int64(s, 0);
    page.jobs.push_back(std::move(job));
  }
  bool failed = rc != SQLITE_ROW && rc != SQLITE_DONE;
  sqlite3_finalize(s);
  if (failed) return Error("list jobs");
  return page;
}

absl::Status JobStore::RecordTransition(const std::string& id, const JobStatus& status,
                                        const JobTransition& t) {
  if (status.state() != t.to()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordTransition: status.state ", StateName(status.state()),
                     " differs from transition target ", StateName(t.to())));
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Job> current = GetLocked(id);
  if (!current.ok()) return current.status();
  if (current->status().state() != t.from()) {
    return absl::FailedPreconditionError(
        absl::StrCat(JobName(id), " is ", StateName(current->status().state()), ", not ",
                     StateName(t.from()), "; transition to ", StateName(t.to()), " refused"));
  }
  if (absl::Status s = CheckTransition(JobName(id), t.from(), t.to()); !s.ok()) return s;
  if (absl::Status s = ExecLocked("BEGIN IMMEDIATE"); !s.ok()) return s;
  sqlite3_stmt* s = Prepare("UPDATE jobs SET state = ?, status = ? WHERE id = ?");
  absl::Status result;
  if (s == nullptr) {
    result = Error("prepare status update");
  } else {
    StmtScope scope(s);
    sqlite3_bind_int(s, 1, status.state());
    BindBlob(s, 2, status.SerializeAsString());
    BindText(s, 3, id);
    if (sqlite3_step(s) != SQLITE_DONE) result = Error("update status of " + id);
  }
  if (result.ok()) result = InsertTransitionLocked(id, t);
  if (result.ok()) result = ExecLocked("COMMIT");
  if (!result.ok()) ExecLocked("ROLLBACK").IgnoreError();
  return result;
}

absl::Status JobStore::SaveStatus(const std::string& id, const JobStatus& status) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* s = Prepare("UPDATE jobs SET status = ? WHERE id = ? AND state = ?");
  if (s == nullptr) return Error("prepare status save");
  StmtScope scope(s);
  BindBlob(s, 1, status.SerializeAsString());
  BindText(s, 2, id);
  sqlite3_bind_int(s, 3, status.state());
  if (sqlite3_step(s) != SQLITE_DONE) return Error("save status of " + id);
  if (sqlite3_changes(db_) == 0) {
    absl::StatusOr<Job> current = GetLocked(id);
    if (!current.ok()) return current.status();
    return absl::FailedPreconditionError(
        absl::StrCat(JobName(id), " is ", StateName(current->status().state()),
                     "; SaveStatus cannot change the state to ", StateName(status.state()),
                     " (use RecordTransition)"));
  }
  return absl::OkStatus();
}

absl::Status JobStore::Delete(const std::string& id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Job> job = GetLocked(id);
  if (!job.ok()) return job.status();
  if (!IsTerminal(job->status().state())) {
    return absl::FailedPreconditionError(
        absl::StrCat(JobName(id), " is ", StateName(job->status().state()),
                     "; only SUCCEEDED, FAILED or CANCELLED jobs can be deleted"));
  }
  if (absl::Status s = ExecLocked("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status result;
  for (const char* sql : {"DELETE FROM transitions WHERE job_id = ?", "DELETE FROM jobs WHERE id = ?"}) {
    sqlite3_stmt* s = Prepare(sql);
    if (s == nullptr) {
      result = Error("prepare delete");
      break;
    }
    StmtScope scope(s);
    BindText(s, 1, id);
    if (sqlite3_step(s) != SQLITE_DONE) {
      result = Error("delete " + id);
      break;
    }
  }
  if (result.ok()) result = ExecLocked("COMMIT");
  if (!result.ok()) ExecLocked("ROLLBACK").IgnoreError();
  return result;
}

absl::StatusOr<std::vector<JobTransition>> JobStore::Transitions(const std::string& id) {
  absl::MutexLock lock(&mu_);
  if (absl::StatusOr<Job> job = GetLocked(id); !job.ok()) return job.status();
  sqlite3_stmt* s = Prepare("SELECT transition FROM transitions WHERE job_id = ? ORDER BY seq");
  if (s == nullptr) return Error("prepare transitions");
  StmtScope scope(s);
  BindText(s, 1, id);
  std::vector<JobTransition> out;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    out.emplace_back();
    if (!out.back().ParseFromString(ColumnBytes(s, 0))) {
      return absl::DataLossError(absl::StrCat("job store: a transition of ", JobName(id),
                                              " is corrupt"));
    }
  }
  if (rc != SQLITE_DONE) return Error("read transitions of " + id);
  return out;
}

absl::StatusOr<std::vector<Job>> JobStore::ActiveJobs() {
  std::vector<std::string> ids;
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* s = Prepare("SELECT id FROM jobs WHERE state IN (?, ?, ?, ?) ORDER BY seq");
  if (s == nullptr) return Error("prepare active jobs");
  {
    StmtScope scope(s);
    sqlite3_bind_int(s, 1, JobStatus::QUEUED);
    sqlite3_bind_int(s, 2, JobStatus::SCHEDULING);
    sqlite3_bind_int(s, 3, JobStatus::RUNNING);
    sqlite3_bind_int(s, 4, JobStatus::RESTARTING);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) ids.push_back(ColumnBytes(s, 0));
    if (rc != SQLITE_DONE) return Error("list active jobs");
  }
  std::vector<Job> out;
  for (const std::string& id : ids) {
    absl::StatusOr<Job> job = GetLocked(id);
    if (!job.ok()) return job.status();
    out.push_back(*std::move(job));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<JobState, int64_t>>> JobStore::CountByState() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* s = Prepare("SELECT state, COUNT(*) FROM jobs GROUP BY state");
  if (s == nullptr) return Error("prepare counts");
  StmtScope scope(s);
  std::map<int, int64_t> counts;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    counts[sqlite3_column_int(s, 0)] = sqlite3_column_int64(s, 1);
  }
  if (rc != SQLITE_DONE) return Error("count jobs");
  std::vector<std::pair<JobState, int64_t>> out;
  for (JobState st : AllStates()) out.emplace_back(st, counts[st]);
  return out;
}

}  // namespace recfleet::coordinator
