#include "worker/comm/gloo_communicator.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/comm/host_reduce.h"

namespace recfleet {
namespace comm {
namespace {

// Carries a Status out of our Store adapter through Gloo's code, which only
// propagates exceptions.
class StoreError : public std::runtime_error {
 public:
  explicit StoreError(absl::Status status)
      : std::runtime_error(std::string(status.message())), status(std::move(status)) {}
  absl::Status status;
};

// Gloo's serialized tcp::Address (what connectFullMesh publishes per peer):
// a raw copy of {sockaddr_storage, sequence number}. The sockaddr_storage
// comes from getsockname(), which fills only the address family's length;
// the rest is whatever was on Gloo's stack.
struct GlooAddressLayout : gloo::transport::tcp::Address {
  static constexpr size_t kBytes = sizeof(Impl);
  static_assert(sizeof(Impl) == sizeof(sockaddr_storage) + sizeof(gloo::transport::tcp::sequence_number_t),
                "gloo's tcp::Address layout changed; revisit ZeroAddressPadding");
};

// Zeroes the bytes of every serialized address in `data` that lie beyond
// its family's sockaddr, so no stale process memory reaches the rendezvous
// store (the coordinator, readable by the other ranks). Values that are
// not a list of IPv4/IPv6 addresses are left alone.
void ZeroAddressPadding(std::vector<char>* data) {
  constexpr size_t kBytes = GlooAddressLayout::kBytes;
  if (data->empty() || data->size() % kBytes != 0) return;
  std::vector<size_t> lengths;
  for (size_t at = 0; at < data->size(); at += kBytes) {
    sa_family_t family;
    std::memcpy(&family, data->data() + at + offsetof(sockaddr_storage, ss_family), sizeof(family));
    if (family == AF_INET) {
      lengths.push_back(sizeof(sockaddr_in));
    } else if (family == AF_INET6) {
      lengths.push_back(sizeof(sockaddr_in6));
    } else {
      return;
    }
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    char* address = data->data() + i * kBytes;
    std::memset(address + lengths[i], 0, sizeof(sockaddr_storage) - lengths[i]);
  }
}

// gloo::rendezvous::Store on top of our KvStore. Every wait is bounded: by
// the caller's timeout, or by the communicator's when Gloo passes none.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(KvStore* store, absl::Duration timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    std::vector<char> clean = data;
    ZeroAddressPadding(&clean);
    absl::Status s = store_->Set(key, absl::string_view(clean.data(), clean.size()));
    if (!s.ok()) throw StoreError(std::move(s));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = WaitAndGet(*store_, key, timeout_);
    if (!v.ok()) throw StoreError(v.status());
    return std::vector<char>(v->begin(), v->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, kUseDefault); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const absl::Duration t = timeout.count() > 0 ? absl::FromChrono(timeout) : timeout_;
    absl::Status s = store_->Wait(keys, std::min(t, timeout_));
    if (!s.ok()) throw StoreError(std::move(s));
  }

 private:
  static constexpr std::chrono::milliseconds kUseDefault{0};
  KvStore* store_;
  absl::Duration timeout_;
};

// Gloo reports a timeout and a broken connection with the same exception
// type; its message tells them apart.
absl::Status FromException(const std::exception& e) {
  if (const auto* se = dynamic_cast<const StoreError*>(&e)) return se->status;
  const std::string what = e.what();
  if (dynamic_cast<const gloo::IoException*>(&e) != nullptr) {
    if (absl::StrContains(what, "imed out") || absl::StrContains(what, "imeout")) {
      return absl::DeadlineExceededError(absl::StrCat("timed out waiting for a peer: ", what));
    }
    return absl::UnavailableError(absl::StrCat("connection to a peer failed (did it die?): ", what));
  }
  return absl::InternalError(absl::StrCat("gloo: ", what));
}

template <typename Fn>
absl::Status Guarded(Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return FromException(e);
  }
}

// Gloo sizes buffers by sizeof(T); these stand in for dtypes Gloo does not
// know (bf16) and let one code path serve every dtype of a given width. The
// reduction itself is ours (CombineHost), chosen by dtype.
template <size_t N>
struct Bytes {
  char b[N];
};

// Non-null pointer for empty buffers: Gloo rejects null even for 0 bytes.
char* NonNull(void* p) {
  static char dummy;
  return p != nullptr ? static_cast<char*>(p) : &dummy;
}

// The started collectives of one communicator: run one after another, in
// issue order, on a thread of their own (started at the first of them).
class CollectiveThread {
 public:
  CollectiveThread() = default;
  CollectiveThread(const CollectiveThread&) = delete;
  CollectiveThread& operator=(const CollectiveThread&) = delete;
  // Runs what is queued, then stops.
  ~CollectiveThread() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  std::unique_ptr<PendingCollective> Start(std::function<absl::Status()> run) {
    auto state = std::make_shared<State>();
    absl::MutexLock lock(&mu_);
    queue_.push_back({std::move(run), state});
    ++pending_;
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    return std::make_unique<Pending>(std::move(state));
  }

  // Returns once every started collective has finished.
  void WaitIdle() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &CollectiveThread::Idle));
  }

 private:
  struct State {
    absl::Notification done;
    absl::Status status;  // Written before `done` is notified.
  };
  class Pending : public PendingCollective {
   public:
    explicit Pending(std::shared_ptr<State> state) : state_(std::move(state)) {}
    ~Pending() override { state_->done.WaitForNotification(); }
    absl::Status Ready() override { return Wait(); }
    absl::Status Wait() override {
      state_->done.WaitForNotification();
      return state_->status;
    }

   private:
    std::shared_ptr<State> state_;
  };
  struct Item {
    std::function<absl::Status()> run;
    std::shared_ptr<State> state;
  };

  bool Idle() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return pending_ == 0; }
  bool HasWork() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  void Loop() {
    while (true) {
      Item item;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &CollectiveThread::HasWork));
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      item.state->status = item.run();
      {
        absl::MutexLock lock(&mu_);
        --pending_;
      }
      item.state->done.Notify();
    }
  }

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(int rank, int size, absl::Duration timeout, std::shared_ptr<gloo::Context> context,
                   std::shared_ptr<GlooTransport> transport)
      : Communicator(rank, size, Device::kCpu, timeout),
        context_(std::move(context)),
        transport_(std::move(transport)) {}

  absl::string_view backend() const override { return "gloo"; }

 protected:
  std::chrono::milliseconds Timeout() const {
    return std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout()));
  }

  absl::Status DoAllGather(const TensorView& in, const TensorView& out) override {
    if (in.nbytes() == 0) return absl::OkStatus();
    return Guarded([&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(NonNull(in.data), in.nbytes());
      opts.setOutput(NonNull(out.data), out.nbytes());
      opts.setTimeout(Timeout());
      gloo::allgather(opts);
    });
  }

  absl::Status DoAllReduce(const TensorView& inout, ReduceOp op) override {
    if (inout.nbytes() == 0) return absl::OkStatus();
    absl::Status s;
    switch (DTypeSize(inout.dtype)) {
      case 2: s = AllReduceWidth<Bytes<2>>(inout, op); break;
      case 4: s = AllReduceWidth<Bytes<4>>(inout, op); break;
      case 8: s = AllReduceWidth<Bytes<8>>(inout, op); break;
      default: return absl::InternalError("unsupported element width");
    }
    if (s.ok() && op == ReduceOp::kAvg) ScaleInPlace(inout.dtype, inout.data, inout.numel(), 1.0 / size());
    return s;
  }

  // Ring reduce-scatter over Gloo's point-to-point buffers (this Gloo has no
  // options-based reduce-scatter): p-1 steps, each sending one block to the
  // right neighbor and folding the block from the left into a scratch copy,
  // scheduled so that rank r ends holding the full reduction of block r.
  absl::Status DoReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op) override {
    const int p = size();
    const int r = rank();
    const size_t block = out.nbytes();
    const size_t n = out.numel();
    if (block == 0) return absl::OkStatus();
    std::vector<char> scratch(static_cast<const char*>(in.data), static_cast<const char*>(in.data) + in.nbytes());
    std::vector<char> incoming(block);
    absl::Status s = Guarded([&] {
      const auto deadline = std::chrono::steady_clock::now() + Timeout();
      auto remaining = [&] {
        return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          deadline - std::chrono::steady_clock::now()));
      };
      auto send_buf = context_->createUnboundBuffer(scratch.data(), scratch.size());
      auto recv_buf = context_->createUnboundBuffer(incoming.data(), incoming.size());
      const uint64_t slot = static_cast<uint64_t>(context_->nextSlot());
      const int right = (r + 1) % p;
      const int left = (r + p - 1) % p;
      for (int step = 0; step + 1 < p; ++step) {
        const int send_block = ((r - step - 1) % p + p) % p;
        const int recv_block = ((r - step - 2) % p + p) % p;
        send_buf->send(right, slot, send_block * block, block);
        recv_buf->recv(left, slot, 0, block);
        recv_buf->waitRecv(remaining());
        char* acc = scratch.data() + recv_block * block;
        CombineHost(in.dtype, op, acc, acc, incoming.data(), n);
        send_buf->waitSend(remaining());
      }
    });
    if (!s.ok()) return s;
    std::memcpy(out.data, scratch.data() + r * block, block);
    if (op == ReduceOp::kAvg) ScaleInPlace(out.dtype, out.data, n, 1.0 / p);
    return absl::OkStatus();
  }

  absl::Status DoAllToAll(const TensorView& in, absl::Span<const int64_t> send_counts, const TensorView& out,
                          absl::Span<const int64_t> recv_counts) override {
    const int64_t width = static_cast<int64_t>(DTypeSize(in.dtype));
    std::vector<int64_t> send_bytes, recv_bytes;
    for (int64_t c : send_counts) send_bytes.push_back(c * width);
    for (int64_t c : recv_counts) recv_bytes.push_back(c * width);
    return Guarded([&] {
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(NonNull(in.data), send_bytes);
      opts.setOutput(NonNull(out.data), recv_bytes);
      opts.setTimeout(Timeout());
      gloo::alltoallv(opts);
    });
  }

  absl::Status DoBroadcast(const TensorView& inout, int root) override {
    if (inout.nbytes() == 0) return absl::OkStatus();
    return Guarded([&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(NonNull(inout.data), inout.nbytes());
      opts.setRoot(root);
      opts.setTimeout(Timeout());
      gloo::broadcast(opts);
    });
  }

  absl::Status DoBarrier() override {
    return Guarded([&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(Timeout());
      gloo::barrier(opts);
    });
  }

  std::unique_ptr<PendingCollective> DoStart(std::function<absl::Status()> run) override {
    return started_.Start(std::move(run));
  }

  absl::Status AfterStarted() override {
    started_.WaitIdle();
    // A started collective that failed while we waited broke the context:
    // the blocking call must not run on it.
    return health();
  }

 private:
  template <typename T>
  absl::Status AllReduceWidth(const TensorView& inout, ReduceOp op) {
    const DType dtype = inout.dtype;
    return Guarded([&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(static_cast<T*>(inout.data), static_cast<size_t>(inout.numel()));
      opts.setReduceFunction([dtype, op](void* out, const void* a, const void* b, size_t n) {
        CombineHost(dtype, op, out, a, b, n);
      });
      opts.setTimeout(Timeout());
      gloo::allreduce(opts);
    });
  }

  std::shared_ptr<gloo::Context> context_;
  // Keeps the device (its sockets and event loop) alive as long as the
  // context that uses it.
  std::shared_ptr<GlooTransport> transport_;
  // Last: destroyed first, so its thread is done before the context goes.
  CollectiveThread started_;
};

// This Gloo writes to its sockets without MSG_NOSIGNAL, so a write to a
// peer that died raises SIGPIPE, whose default action kills the process
// instead of letting the error surface as a Status. Ignore it, unless the
// program installed a handler of its own.
void IgnoreSigpipeOnce() {
  static const bool done = [] {
    struct sigaction current;
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
    return true;
  }();
  (void)done;
}

}  // namespace

absl::StatusOr<std::shared_ptr<GlooTransport>> GlooTransport::Create(const std::string& hostname) {
  IgnoreSigpipeOnce();
  std::shared_ptr<gloo::transport::Device> device;
  absl::Status s = Guarded([&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("gloo transport on '", hostname, "': ", s.message()));
  }
  return std::shared_ptr<GlooTransport>(new GlooTransport(std::move(device)));
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(KvStore& store, int rank, int size,
                                                          std::shared_ptr<GlooTransport> transport,
                                                          const CommOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("gloo: rank ", rank, " is not in [0, size=", size, ")"));
  }
  if (transport == nullptr) return absl::InvalidArgumentError("gloo: transport is null");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo: options.timeout must be positive");
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout)));
  GlooStoreAdapter adapter(&store, options.timeout);
  std::shared_ptr<gloo::transport::Device> device = transport->device();
  absl::Status s = Guarded([&] { context->connectFullMesh(adapter, device); });
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("gloo rendezvous (rank ", rank, "/", size, "): ", s.message()));
  }
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(rank, size, options.timeout, std::move(context), std::move(transport)));
}

}  // namespace comm
}  // namespace recfleet
