#include "tests/e2e/test_network.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recfleet::e2e {
namespace {

constexpr char kIp[] = "/bin/ip";
constexpr char kNetnsDir[] = "/run/netns";
constexpr char kBridgeHost[] = "bridge";

// Runs `ip ARGS` (arguments without spaces or quotes), returning its
// output; FAILED_PRECONDITION with the command and output when it fails.
absl::StatusOr<std::string> Ip(const std::vector<std::string>& args) {
  const std::string command = absl::StrCat(kIp, " ", absl::StrJoin(args, " "), " 2>&1");
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return absl::FailedPreconditionError(absl::StrCat("cannot run ", command));
  std::string out;
  char buf[1024];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  if (status != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "`", command, "` failed (exit status ", status, "): ", out,
        "; the multi-host test makes network namespaces, veth pairs and a bridge, which needs "
        "root with CAP_SYS_ADMIN and CAP_NET_ADMIN (a container run with those) and iproute2"));
  }
  return out;
}

// Deletes namespaces "rfnet-<pid>-*" whose process no longer exists (a
// test that crashed before its destructor ran).
void DeleteStaleNamespaces() {
  DIR* d = ::opendir(kNetnsDir);
  if (d == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!absl::StartsWith(name, "rfnet-")) continue;
    const std::string pid_text = name.substr(6, name.find('-', 6) - 6);
    int pid = 0;
    if (absl::SimpleAtoi(pid_text, &pid) && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
      stale.push_back(name);
    }
  }
  ::closedir(d);
  for (const std::string& name : stale) (void)Ip({"netns", "del", name});
}

}  // namespace

absl::StatusOr<std::unique_ptr<TestNetwork>> TestNetwork::Create(const std::vector<std::string>& hosts) {
  if (::access(kIp, X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        kIp, " not found: the multi-host test needs iproute2 (tools/setup.sh installs it)"));
  }
  if (::geteuid() != 0) {
    return absl::FailedPreconditionError(
        "the multi-host test must run as root: it makes network namespaces, veth pairs and a bridge");
  }
  DeleteStaleNamespaces();
  std::unique_ptr<TestNetwork> net(new TestNetwork());
  net->prefix_ = absl::StrCat("rfnet-", ::getpid(), "-");
  net->hosts_ = hosts;
  const std::string bridge = net->Namespace(kBridgeHost);
  auto add_namespace = [&](const std::string& ns) -> absl::Status {
    absl::StatusOr<std::string> r = Ip({"netns", "add", ns});
    if (!r.ok()) return r.status();
    net->created_.push_back(ns);
    return Ip({"-n", ns, "link", "set", "lo", "up"}).status();
  };
  if (absl::Status s = add_namespace(bridge); !s.ok()) return s;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"-n", bridge, "link", "add", "br0", "type", "bridge"},
           {"-n", bridge, "link", "set", "br0", "up"}}) {
    if (absl::StatusOr<std::string> r = Ip(args); !r.ok()) return r.status();
  }
  for (size_t i = 0; i < hosts.size(); ++i) {
    const std::string ns = net->Namespace(hosts[i]);
    if (absl::Status s = add_namespace(ns); !s.ok()) return s;
    // The cable: "port<i>" on the bridge's side, eth0 in the host.
    const std::string port = absl::StrCat("port", i);
    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {"-n", bridge, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns},
             {"-n", bridge, "link", "set", port, "master", "br0", "up"},
             {"-n", ns, "addr", "add", net->Address(hosts[i]) + "/24", "dev", "eth0"},
             {"-n", ns, "link", "set", "eth0", "up"}}) {
      if (absl::StatusOr<std::string> r = Ip(args); !r.ok()) return r.status();
    }
  }
  return net;
}

TestNetwork::~TestNetwork() {
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) (void)Ip({"netns", "del", *it});
}

int TestNetwork::Index(const std::string& host) const {
  for (size_t i = 0; i < hosts_.size(); ++i) {
    if (hosts_[i] == host) return static_cast<int>(i);
  }
  std::fprintf(stderr, "TestNetwork: no host %s\n", host.c_str());
  std::abort();
}

std::string TestNetwork::Namespace(const std::string& host) const { return prefix_ + host; }

std::string TestNetwork::Address(const std::string& host) const {
  return absl::StrCat("192.0.2.", 10 + Index(host));
}

std::vector<std::string> TestNetwork::ExecPrefix(const std::string& host) const {
  Index(host);  // Aborts on an unknown host.
  return {kIp, "netns", "exec", Namespace(host)};
}

absl::Status TestNetwork::Enter(const std::string& host) {
  const std::string path = absl::StrCat(kNetnsDir, "/", Namespace(host));
  Index(host);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  const int rc = ::setns(fd, CLONE_NEWNET);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return absl::FailedPreconditionError(absl::StrCat("setns ", path, ": ", std::strerror(err)));
  return absl::OkStatus();
}

absl::Status TestNetwork::SetLink(const std::string& host, bool up) {
  return Ip({"-n", Namespace(kBridgeHost), "link", "set", absl::StrCat("port", Index(host)), up ? "up" : "down"})
      .status();
}

}  // namespace recfleet::e2e
