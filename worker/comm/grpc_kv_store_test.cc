// GrpcKvStore against an in-test WorkerService that implements only the
// rendezvous RPCs as worker_service.proto specifies them (per-(job, epoch)
// namespaces, stale-epoch fencing, KvWait bounded by its timeout), served on
// 127.0.0.1 with an OS-picked port.

#include "worker/comm/grpc_kv_store.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace comm {
namespace {

class RendezvousService : public v1::WorkerService::Service {
 public:
  void set_epoch(int64_t epoch) {
    absl::MutexLock lock(&mu_);
    epoch_ = epoch;
  }
  // Calls must then carry "authorization: Bearer <token>" (KvSet and KvGet check).
  void require_token(std::string token) {
    absl::MutexLock lock(&mu_);
    token_ = std::move(token);
  }

  // Calls must then carry this worker id and credential.
  void require_worker(std::string id, std::string credential) {
    absl::MutexLock lock(&mu_);
    worker_id_ = std::move(id);
    credential_ = std::move(credential);
  }

  grpc::Status KvSet(grpc::ServerContext* context, const v1::KvSetRequest* request, v1::KvSetResponse*) override {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = Authorize(*context); !s.ok()) return s;
    if (grpc::Status s = Identify(*request); !s.ok()) return s;
    if (grpc::Status s = Fence(request->restart_epoch()); !s.ok()) return s;
    values_[{request->job(), request->key()}] = request->value();
    return grpc::Status::OK;
  }

  grpc::Status KvGet(grpc::ServerContext* context, const v1::KvGetRequest* request,
                     v1::KvGetResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = Authorize(*context); !s.ok()) return s;
    if (grpc::Status s = Identify(*request); !s.ok()) return s;
    if (grpc::Status s = Fence(request->restart_epoch()); !s.ok()) return s;
    auto it = values_.find({request->job(), request->key()});
    if (it == values_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such key");
    response->set_value(it->second);
    return grpc::Status::OK;
  }

  grpc::Status KvWait(grpc::ServerContext*, const v1::KvWaitRequest* request,
                      v1::KvWaitResponse* response) override {
    absl::Duration timeout = absl::Seconds(request->timeout().seconds()) + absl::Nanoseconds(request->timeout().nanos());
    if (timeout <= absl::ZeroDuration()) timeout = absl::Seconds(30);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const std::string& k : request->keys()) {
        if (!values_.count({request->job(), k})) return false;
      }
      return true;
    };
    absl::MutexLock lock(&mu_);
    if (grpc::Status s = Identify(*request); !s.ok()) return s;
    if (grpc::Status s = Fence(request->restart_epoch()); !s.ok()) return s;
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "keys not set in time");
    }
    for (const std::string& k : request->keys()) {
      v1::KeyValue* kv = response->add_values();
      kv->set_key(k);
      kv->set_value(values_[{request->job(), k}]);
    }
    return grpc::Status::OK;
  }

 private:
  grpc::Status Authorize(const grpc::ServerContext& context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (token_.empty()) return grpc::Status::OK;
    auto it = context.client_metadata().find("authorization");
    if (it != context.client_metadata().end() &&
        std::string(it->second.data(), it->second.size()) == "Bearer " + token_) {
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong bearer token");
  }

  template <typename Request>
  grpc::Status Identify(const Request& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (request.worker_id() == worker_id_ && request.worker_credential() == credential_) {
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "wrong worker identity");
  }

  grpc::Status Fence(int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (epoch == epoch_) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("stale restart_epoch ", epoch, ", job is at ", epoch_));
  }

  absl::Mutex mu_;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::string credential_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, std::string>, std::string> values_ ABSL_GUARDED_BY(mu_);
};

class GrpcKvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    stub_ = v1::WorkerService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  RendezvousService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<v1::WorkerService::StubInterface> stub_;
};

TEST_F(GrpcKvStoreTest, KeepsTheKvStoreContract) {
  GrpcKvStore store(stub_, "jobs/a", 1);
  CheckKvStoreContract(store);
}

TEST_F(GrpcKvStoreTest, SendsTheBearerToken) {
  service_.require_token("s3cret");
  GrpcKvStore anonymous(stub_, "jobs/t", 1);
  EXPECT_EQ(anonymous.Set("k", "v").code(), absl::StatusCode::kUnauthenticated);
  GrpcKvStore store(stub_, "jobs/t", 1, absl::Seconds(10), "s3cret");
  ASSERT_TRUE(store.Set("k", "v").ok());
  absl::StatusOr<std::string> got = store.Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
}

TEST_F(GrpcKvStoreTest, SendsTheWorkerIdentityAskedPerCall) {
  service_.require_worker("w-7", "credential-1");
  GrpcKvStore anonymous(stub_, "jobs/t", 1);
  EXPECT_EQ(anonymous.Set("k", "v").code(), absl::StatusCode::kPermissionDenied);
  GrpcKvStore store(stub_, "jobs/t", 1);
  std::string credential = "credential-1";
  store.set_identity([&] { return GrpcKvStore::Identity{"w-7", credential}; });
  ASSERT_TRUE(store.Set("k", "v").ok());
  ASSERT_TRUE(store.Wait({"k"}, absl::Seconds(5)).ok());
  // The worker registered again: the next call carries the new credential.
  service_.require_worker("w-7", "credential-2");
  EXPECT_EQ(store.Get("k").status().code(), absl::StatusCode::kPermissionDenied);
  credential = "credential-2";
  absl::StatusOr<std::string> got = store.Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
}

TEST_F(GrpcKvStoreTest, StaleEpochIsRejected) {
  GrpcKvStore old_epoch(stub_, "jobs/a", 1);
  ASSERT_TRUE(old_epoch.Set("k", "v").ok());
  service_.set_epoch(2);
  EXPECT_EQ(old_epoch.Set("k", "w").code(), absl::StatusCode::kFailedPrecondition);
  absl::Status s = old_epoch.Wait({"k"}, absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("stale restart_epoch 1"), absl::string_view::npos) << s;
}

// Three Gloo ranks bootstrap through the coordinator's store and reduce.
TEST_F(GrpcKvStoreTest, BootstrapsAGlooGroup) {
  GrpcKvStore store(stub_, "jobs/b", 1);
  CommOptions options;
  options.timeout = absl::Seconds(20);
  auto comms = ConnectGlooGroup(store, 3, options);
  ASSERT_TRUE(comms.ok()) << comms.status();
  RunOnThreads(3, [&](int r) {
    int64_t v = r + 1;
    ASSERT_TRUE((*comms)[r]->AllReduce(MakeView(&v, DType::kInt64, {1}), ReduceOp::kSum).ok());
    EXPECT_EQ(v, 6);
  });
}

}  // namespace
}  // namespace comm
}  // namespace recfleet
