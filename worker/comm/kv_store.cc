#include "worker/comm/kv_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recfleet {
namespace comm {
absl::Status RendezvousTimeoutError(absl::Span<const std::string> missing, absl::Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat("rendezvous: keys [", absl::StrJoin(missing, ", "),
                                                  "] not set within ", absl::FormatDuration(timeout),
                                                  " (a peer never arrived or died)"));
}

namespace {

absl::Status MissingKeys(absl::Span<const std::string> keys, const std::vector<bool>& present,
                         absl::Duration timeout) {
  std::vector<std::string> missing;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!present[i]) missing.push_back(keys[i]);
  }
  return RendezvousTimeoutError(missing, timeout);
}

}  // namespace

std::string RendezvousNamespace(absl::string_view job_id, int64_t epoch) {
  return absl::StrCat("job/", job_id, "/epoch/", epoch, "/");
}

absl::StatusOr<std::string> WaitAndGet(KvStore& store, absl::string_view key, absl::Duration timeout) {
  const std::string k(key);
  absl::Status s = store.Wait({k}, timeout);
  if (!s.ok()) return s;
  return store.Get(k);
}

absl::Status PrefixKvStore::Set(absl::string_view key, absl::string_view value) {
  return base_->Set(absl::StrCat(prefix_, key), value);
}

absl::StatusOr<std::string> PrefixKvStore::Get(absl::string_view key) {
  return base_->Get(absl::StrCat(prefix_, key));
}

absl::Status PrefixKvStore::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(absl::StrCat(prefix_, k));
  return base_->Wait(full, timeout);
}

absl::Status InProcessKvStore::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  values_[key] = std::string(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> InProcessKvStore::Get(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return absl::NotFoundError(absl::StrCat("rendezvous: key '", key, "' is not set"));
  return it->second;
}

absl::Status InProcessKvStore::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  auto all_present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& k : keys) {
      if (!values_.contains(k)) return false;
    }
    return true;
  };
  absl::MutexLock lock(&mu_);
  if (mu_.AwaitWithTimeout(absl::Condition(&all_present), timeout)) return absl::OkStatus();
  std::vector<bool> present;
  for (const std::string& k : keys) present.push_back(values_.contains(k));
  return MissingKeys(keys, present, timeout);
}

absl::StatusOr<std::unique_ptr<FileKvStore>> FileKvStore::Open(std::string directory) {
  if (directory.empty()) return absl::InvalidArgumentError("FileKvStore: directory is empty");
  // mkdir -p, component by component.
  for (size_t pos = 1; pos <= directory.size(); ++pos) {
    if (pos == directory.size() || directory[pos] == '/') {
      std::string part = directory.substr(0, pos);
      if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::InternalError(absl::StrCat("FileKvStore: cannot create directory '", part,
                                                "': ", std::strerror(errno)));
      }
    }
  }
  return std::unique_ptr<FileKvStore>(new FileKvStore(std::move(directory)));
}

std::string FileKvStore::PathFor(absl::string_view key) const {
  std::string name;
  name.reserve(key.size());
  for (char c : key) {
    if (c == '/') {
      name += "%2F";
    } else if (c == '%') {
      name += "%25";
    } else {
      name += c;
    }
  }
  return absl::StrCat(directory_, "/", name);
}

absl::Status FileKvStore::Set(absl::string_view key, absl::string_view value) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = PathFor(key);
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("FileKvStore: cannot write '", tmp, "'"));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("FileKvStore: cannot rename '", tmp, "' to '", path,
                                            "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileKvStore::Get(absl::string_view key) {
  const std::string path = PathFor(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("rendezvous: key '", key, "' is not set (no file ", path, ")"));
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

absl::Status FileKvStore::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<bool> present(keys.size(), false);
  while (true) {
    bool all = true;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!present[i]) present[i] = access(PathFor(keys[i]).c_str(), F_OK) == 0;
      all = all && present[i];
    }
    if (all) return absl::OkStatus();
    if (absl::Now() >= deadline) return MissingKeys(keys, present, timeout);
    absl::SleepFor(absl::Milliseconds(2));
  }
}

}  // namespace comm
}  // namespace recfleet
