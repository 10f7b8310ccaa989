// A rank in another process killed with SIGKILL: the surviving rank's next
// collective fails within the timeout (in practice as soon as the kernel
// closes the dead process's sockets). The ranks rendezvous through a
// FileKvStore, as processes on one host do.

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"

namespace recfleet {
namespace comm {
namespace {

absl::StatusOr<std::unique_ptr<Communicator>> Join(KvStore& store, int rank, absl::Duration timeout) {
  auto transport = GlooTransport::Create("127.0.0.1");
  if (!transport.ok()) return transport.status();
  CommOptions options;
  options.timeout = timeout;
  return ConnectGloo(store, rank, 2, *std::move(transport), options);
}

TEST(GlooPeerDeathTest, KilledPeerFailsTheSurvivorWithinTheTimeout) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  const std::string dir = absl::StrCat(tmp, "/rendezvous_", getpid());
  const absl::Duration timeout = absl::Seconds(20);

  // Fork before this process starts any thread (Gloo's transport has one).
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = FileKvStore::Open(dir);
    if (!store.ok()) _exit(2);
    auto comm = Join(**store, 1, timeout);
    if (!comm.ok() || !(*comm)->Barrier().ok()) _exit(3);
    raise(SIGKILL);  // Dies holding open connections, mid-job.
    _exit(4);
  }

  auto store = FileKvStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto comm = Join(**store, 0, timeout);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_TRUE((*comm)->Barrier().ok());

  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << "child status " << wstatus;

  std::vector<float> data(4096, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status s = (*comm)->AllReduce(MakeView(data.data(), DType::kFloat32, {4096}), ReduceOp::kSum);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("rank 0/2"), absl::string_view::npos) << s;
  EXPECT_LT(took, timeout) << s;
  std::cout << "survivor failed after " << absl::FormatDuration(took) << ": " << s << "\n";
}

}  // namespace
}  // namespace comm
}  // namespace recfleet
