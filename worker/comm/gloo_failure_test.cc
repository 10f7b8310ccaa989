// A dead or absent peer must not hang the others: every failure surfaces as
// a Status within the communicator's timeout, and the communicator stays
// broken afterwards.

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace comm {
namespace {

CommOptions Timeout(absl::Duration d) {
  CommOptions o;
  o.timeout = d;
  return o;
}

TEST(GlooFailureTest, RendezvousFailsWhenAPeerNeverArrives) {
  InProcessKvStore store;
  auto transport = GlooTransport::Create("127.0.0.1");
  ASSERT_TRUE(transport.ok()) << transport.status();
  const absl::Time start = absl::Now();
  // Rank 1 of 2 never shows up.
  auto comm = ConnectGloo(store, 0, 2, *transport, Timeout(absl::Milliseconds(500)));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_NE(comm.status().message().find("rendezvous"), absl::string_view::npos) << comm.status();
  EXPECT_LT(took, absl::Seconds(5));
}

// A peer that is alive but never calls the collective: the caller fails with
// DeadlineExceeded after the timeout, for Gloo's algorithms and for our ring.
TEST(GlooFailureTest, CollectiveTimesOutWhenAPeerStopsCalling) {
  InProcessKvStore store, ring_store;
  auto comms = ConnectGlooGroup(store, 2, Timeout(absl::Milliseconds(600)));
  ASSERT_TRUE(comms.ok()) << comms.status();
  std::vector<float> data(64, 1.0f), out(32);
  const TensorView v = MakeView(data.data(), DType::kFloat32, {64});
  const TensorView o = MakeView(out.data(), DType::kFloat32, {32});

  absl::Time start = absl::Now();
  absl::Status s = (*comms)[0]->AllReduce(v, ReduceOp::kSum);
  absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(took, absl::Milliseconds(500));
  EXPECT_LT(took, absl::Seconds(5));

  // Gloo closes the connections of a timed-out operation, so the idle peer
  // learns of it too instead of hanging on its next call.
  start = absl::Now();
  s = (*comms)[1]->Barrier();
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // Our ring reduce-scatter honors the deadline as well (a fresh group).
  auto ring = ConnectGlooGroup(ring_store, 2, Timeout(absl::Milliseconds(600)));
  ASSERT_TRUE(ring.ok()) << ring.status();
  start = absl::Now();
  absl::Status rs = (*ring)[1]->ReduceScatter(v, o, ReduceOp::kSum);
  took = absl::Now() - start;
  EXPECT_EQ(rs.code(), absl::StatusCode::kDeadlineExceeded) << rs;
  EXPECT_GE(took, absl::Milliseconds(500));
  EXPECT_LT(took, absl::Seconds(5));

  // Broken for good: later calls fail at once and quote the first error.
  start = absl::Now();
  s = (*comms)[0]->Barrier();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("all_reduce"), absl::string_view::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
}

// A peer whose communicator goes away (its sockets close, as when its
// process dies) makes the waiting rank fail long before the timeout.
TEST(GlooFailureTest, PeerThatClosesFailsTheOthersFast) {
  InProcessKvStore store;
  auto comms = ConnectGlooGroup(store, 3, Timeout(absl::Seconds(30)));
  ASSERT_TRUE(comms.ok()) << comms.status();
  std::vector<std::vector<float>> data(3, std::vector<float>(1000, 1.0f));
  absl::Status status[3];
  absl::Duration took[3];
  RunOnThreads(3, [&](int r) {
    if (r == 2) {
      absl::SleepFor(absl::Milliseconds(100));
      (*comms)[2].reset();
      return;
    }
    const absl::Time start = absl::Now();
    status[r] = (*comms)[r]->AllReduce(MakeView(data[r].data(), DType::kFloat32, {1000}), ReduceOp::kSum);
    took[r] = absl::Now() - start;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(status[r].ok()) << "rank " << r;
    EXPECT_LT(took[r], absl::Seconds(10)) << "rank " << r << ": " << status[r];
  }
}

TEST(GlooFailureTest, AbortBreaksTheCommunicator) {
  InProcessKvStore store;
  auto comms = ConnectGlooGroup(store, 1, Timeout(absl::Seconds(5)));
  ASSERT_TRUE(comms.ok()) << comms.status();
  Communicator& c = *(*comms)[0];
  ASSERT_TRUE(c.Barrier().ok());
  c.Abort("job restarting");
  c.Abort("second call is a no-op");
  absl::Status s = c.Barrier();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("job restarting"), absl::string_view::npos) << s;
  EXPECT_EQ(c.health().code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace comm
}  // namespace recfleet
