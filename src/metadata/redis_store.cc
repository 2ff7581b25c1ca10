#include "metadata/redis_store.h"

#include <hiredis/hiredis.h>

#include "core/logging.h"

namespace kvferry {
namespace {

timeval to_timeval(std::chrono::milliseconds ms) {
  return timeval{static_cast<time_t>(ms.count() / 1000),
                 static_cast<suseconds_t>((ms.count() % 1000) * 1000)};
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace

RedisStore::RedisStore(std::string uri, Endpoint endpoint, const MetadataStoreOptions& options)
    : uri_(std::move(uri)), endpoint_(std::move(endpoint)), options_(options) {}

Result<std::unique_ptr<RedisStore>> RedisStore::open(std::string uri, Endpoint endpoint,
                                                     const MetadataStoreOptions& options) {
  if (options.record_ttl.count() < 1) {
    return InvalidArgument("metadata record TTL " + std::to_string(options.record_ttl.count()) +
                           " s must be at least 1 s");
  }
  std::unique_ptr<RedisStore> store(new RedisStore(std::move(uri), std::move(endpoint), options));
  {
    std::lock_guard lock(store->mu_);
    KVF_RETURN_IF_ERROR(store->connect_locked());
  }
  auto period = std::chrono::duration_cast<std::chrono::milliseconds>(options.record_ttl) / 3;
  RedisStore* raw = store.get();
  KVF_ASSIGN_OR_RETURN(store->keeper_, PeriodicTask::start(
                                           period, [raw] { raw->keep_alive(); }, "kvf-redis-ttl"));
  return store;
}

RedisStore::~RedisStore() {
  keeper_.reset();
  std::lock_guard lock(mu_);
  if (context_ != nullptr && !key_.empty()) {
    Reply(static_cast<redisReply*>(redisCommand(context_, "DEL %b", key_.data(), key_.size())));
  }
  if (context_ != nullptr) redisFree(context_);
}

Status RedisStore::connect_locked() {
  if (context_ != nullptr && context_->err == 0) return Status::Ok();
  if (context_ != nullptr) redisFree(context_);
  context_ = redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port,
                                     to_timeval(options_.io_timeout));
  if (context_ == nullptr || context_->err != 0) {
    std::string why = context_ != nullptr ? context_->errstr : "out of memory";
    if (context_ != nullptr) redisFree(context_);
    context_ = nullptr;
    return PeerUnreachable("metadata store " + uri_ + " unreachable: " + why);
  }
  redisSetTimeout(context_, to_timeval(options_.io_timeout));
  Reply pong(static_cast<redisReply*>(redisCommand(context_, "PING")));
  if (!pong || pong->type == REDIS_REPLY_ERROR) {
    return PeerUnreachable("metadata store " + uri_ + " did not answer PING");
  }
  return Status::Ok();
}

Status RedisStore::set_locked() {
  KVF_RETURN_IF_ERROR(connect_locked());
  Reply reply(static_cast<redisReply*>(
      redisCommand(context_, "SET %b %b EX %lld", key_.data(), key_.size(), value_.data(),
                   value_.size(), static_cast<long long>(options_.record_ttl.count()))));
  if (!reply || reply->type == REDIS_REPLY_ERROR) {
    std::string why = reply ? std::string(reply->str, reply->len) : std::string(context_->errstr);
    if (!reply) {
      redisFree(context_);
      context_ = nullptr;
    }
    return PeerUnreachable("metadata store " + uri_ + ": SET failed: " + why);
  }
  return Status::Ok();
}

Status RedisStore::publish(const std::string& key, const std::string& value) {
  std::lock_guard lock(mu_);
  key_ = metadata_key(key);
  value_ = value;
  return set_locked();
}

void RedisStore::keep_alive() {
  std::lock_guard lock(mu_);
  if (key_.empty()) return;
  if (Status s = set_locked(); !s.ok())
    log().warn("redis: refreshing {} failed: {}", key_, s.to_string());
}

Result<std::string> RedisStore::fetch(const std::string& key, Clock::time_point) {
  std::lock_guard lock(mu_);
  KVF_RETURN_IF_ERROR(connect_locked());
  std::string k = metadata_key(key);
  Reply reply(static_cast<redisReply*>(redisCommand(context_, "GET %b", k.data(), k.size())));
  if (!reply) {
    redisFree(context_);
    context_ = nullptr;
    return PeerUnreachable("metadata store " + uri_ + " did not answer GET " + k);
  }
  if (reply->type == REDIS_REPLY_NIL) {
    return PeerUnreachable("no engine is registered as " + key + " in " + uri_);
  }
  if (reply->type != REDIS_REPLY_STRING) return ProtocolError("redis GET " + k + ": not a string");
  return std::string(reply->str, reply->len);
}

}  // namespace kvferry
