#include "services/dataloader/client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/common/bearer_auth.h"
#include "services/dataloader/convert.h"

namespace recfleet::dataloader {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

BatchStream::~BatchStream() {
  if (!done_ && reader_ != nullptr) {
    ctx_.TryCancel();
    reader_->Finish();
  }
}

absl::StatusOr<bool> BatchStream::Next(data::RankBatch* out) {
  if (done_) return false;
  if (reader_->Read(&msg_)) {
    if (auto st = RankBatchFromProto(msg_, schema_, out); !st.ok()) return st;
    return true;
  }
  done_ = true;
  grpc::Status st = reader_->Finish();
  if (!st.ok()) return FromGrpc(st);
  return false;
}

absl::StatusOr<std::unique_ptr<DataLoaderClient>> DataLoaderClient::Connect(
    const std::string& target, const recfleet::v1::DataConfig& config, ConnectOptions options) {
  const absl::Duration timeout = options.timeout;
  grpc::ChannelArguments args;
  // A rank batch of long histories is tens of MB.
  args.SetMaxReceiveMessageSize(-1);
  // Read-ahead bounded by kStreamLookaheadBytes, not by probing.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamLookaheadBytes);
  std::unique_ptr<DataLoaderClient> c(new DataLoaderClient());
  c->auth_token_ = std::move(options.auth_token);
  c->data_grant_ = std::move(options.data_grant);
  c->channel_ = grpc::CreateCustomChannel(
      target, options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials(), args);
  if (!c->channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::UnavailableError(absl::StrCat("data loader at ", target, " unreachable within ",
                                               absl::FormatDuration(timeout)));
  }
  c->stub_ = recfleet::v1::DataLoader::NewStub(c->channel_);
  c->config_ = config;
  grpc::ClientContext ctx;
  // The first request of a job opens its dataset (and may generate a
  // synthetic one), which can take longer than connecting.
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + std::max(timeout, absl::Minutes(5))));
  AttachBearerToken(c->auth_token_, &ctx);
  recfleet::v1::GetInfoRequest info_request;
  *info_request.mutable_config() = config;
  info_request.set_data_grant(c->data_grant_);
  if (auto st = c->stub_->GetInfo(&ctx, info_request, &c->info_); !st.ok()) {
    return FromGrpc(st);
  }
  auto schema = SchemaFromProto(c->info_);
  if (!schema.ok()) return schema.status();
  c->schema_ = std::make_shared<const data::Schema>(*std::move(schema));
  return c;
}

absl::StatusOr<std::unique_ptr<BatchStream>> DataLoaderClient::StreamBatches(int rank,
                                                                             int64_t epoch,
                                                                             int64_t start_step,
                                                                             int64_t end_step) {
  std::unique_ptr<BatchStream> s(new BatchStream(schema_));
  recfleet::v1::StreamBatchesRequest req;
  *req.mutable_config() = config_;
  req.set_rank(rank);
  req.set_epoch(epoch);
  req.set_start_step(start_step);
  req.set_end_step(end_step);
  req.set_data_grant(data_grant_);
  AttachBearerToken(auth_token_, &s->ctx_);
  s->reader_ = stub_->StreamBatches(&s->ctx_, req);
  return s;
}

}  // namespace recfleet::dataloader
