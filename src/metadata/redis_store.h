// RedisStore: segment descriptors in Redis (hiredis). The record is SET with a TTL that
// a keep-alive thread refreshes every third of the TTL; destroying the store deletes it;
// a killed engine's record expires.
//
// Thread-safety: all methods may be called concurrently (one connection, one mutex).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "core/periodic_task.h"
#include "metadata/metadata_store.h"

struct redisContext;

namespace kvferry {

class RedisStore final : public MetadataStore {
 public:
  static Result<std::unique_ptr<RedisStore>> open(std::string uri, Endpoint endpoint,
                                                  const MetadataStoreOptions& options);
  ~RedisStore() override;

  const std::string& uri() const override { return uri_; }
  Status publish(const std::string& key, const std::string& json) override;
  Result<std::string> fetch(const std::string& key, Clock::time_point deadline) override;

 private:
  RedisStore(std::string uri, Endpoint endpoint, const MetadataStoreOptions& options);
  Status connect_locked();
  Status set_locked();
  void keep_alive();

  std::string uri_;
  Endpoint endpoint_;
  MetadataStoreOptions options_;
  std::mutex mu_;
  redisContext* context_ = nullptr;  // guarded by mu_
  std::string key_, value_;          // guarded by mu_
  std::unique_ptr<PeriodicTask> keeper_;
};

}  // namespace kvferry
