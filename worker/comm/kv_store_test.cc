#include "worker/comm/kv_store.h"

#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace recfleet {
namespace comm {
namespace {

// The contract every KvStore implementation keeps.
void CheckContract(KvStore& store) {
  EXPECT_EQ(store.Get("a/b").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store.Set("a/b", std::string("x\0y", 3)).ok());
  auto v = store.Get("a/b");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("x\0y", 3));  // Binary values survive.
  ASSERT_TRUE(store.Set("a/b", "z").ok());
  EXPECT_EQ(*store.Get("a/b"), "z");

  // Wait returns once a late writer has set every key.
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_TRUE(store.Set("late1", "1").ok());
    EXPECT_TRUE(store.Set("late2", "2").ok());
  });
  EXPECT_TRUE(store.Wait({"a/b", "late1", "late2"}, absl::Seconds(10)).ok());
  writer.join();

  // A key nobody sets: DeadlineExceeded, naming it, after about the timeout.
  const absl::Time start = absl::Now();
  absl::Status s = store.Wait({"late1", "never"}, absl::Milliseconds(100));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("never"), absl::string_view::npos) << s;
  EXPECT_EQ(s.message().find("late1"), absl::string_view::npos) << s;
  EXPECT_GE(took, absl::Milliseconds(90));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST(InProcessKvStoreTest, KeepsTheContract) {
  InProcessKvStore store;
  CheckContract(store);
}

TEST(FileKvStoreTest, KeepsTheContract) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  auto store = FileKvStore::Open(absl::StrCat(tmp, "/kv/nested"));
  ASSERT_TRUE(store.ok()) << store.status();
  CheckContract(**store);
}

TEST(PrefixKvStoreTest, NamespacesByJobAndEpoch) {
  InProcessKvStore base;
  EXPECT_EQ(RendezvousNamespace("j1", 3), "job/j1/epoch/3/");
  PrefixKvStore epoch3(&base, RendezvousNamespace("j1", 3));
  PrefixKvStore epoch4(&base, RendezvousNamespace("j1", 4));
  ASSERT_TRUE(epoch3.Set("nccl_id", "old").ok());
  // A key of the old epoch is invisible to the new one.
  EXPECT_EQ(epoch4.Get("nccl_id").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(epoch4.Wait({"nccl_id"}, absl::Milliseconds(10)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*base.Get("job/j1/epoch/3/nccl_id"), "old");
  CheckContract(epoch4);
}

}  // namespace
}  // namespace comm
}  // namespace recfleet
