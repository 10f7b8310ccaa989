#include "worker/comm/kv_store.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace comm {
namespace {

TEST(InProcessKvStoreTest, KeepsTheContract) {
  InProcessKvStore store;
  CheckKvStoreContract(store);
}

TEST(FileKvStoreTest, KeepsTheContract) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  auto store = FileKvStore::Open(absl::StrCat(tmp, "/kv/nested"));
  ASSERT_TRUE(store.ok()) << store.status();
  CheckKvStoreContract(**store);
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
  CheckKvStoreContract(epoch4);
}

}  // namespace
}  // namespace comm
}  // namespace recfleet
