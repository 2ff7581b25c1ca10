// EtcdStore: segment descriptors in etcd (v3 API through its JSON gateway, over HTTP with
// cpp-httplib). The record is attached to a lease that a keep-alive thread renews every
// third of its TTL; if the lease was lost (etcd restarted, a long pause) a new one is
// granted and the record put again. A publish that failed (etcd down) is put again by the
// keep-alive until it succeeds, so the record is current within a third of the TTL of
// etcd answering again. Destroying the store revokes the lease, which
// deletes the record; a killed engine's record disappears when its lease expires.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/periodic_task.h"
#include "metadata/metadata_store.h"

namespace kvferry {

class EtcdStore final : public MetadataStore {
 public:
  static Result<std::unique_ptr<EtcdStore>> open(std::string uri, std::vector<Endpoint> endpoints,
                                                 const MetadataStoreOptions& options);
  ~EtcdStore() override;

  const std::string& uri() const override { return uri_; }
  Status publish(const std::string& key, const std::string& json) override;
  Result<std::string> fetch(const std::string& key, Clock::time_point deadline) override;

 private:
  EtcdStore(std::string uri, std::vector<Endpoint> endpoints, const MetadataStoreOptions& options);
  // POSTs a JSON body to the first endpoint that answers; returns the parsed reply body.
  Result<std::string> call(const std::string& path, const std::string& body,
                           std::chrono::milliseconds timeout);
  Status grant_and_put_locked();
  // Puts the record under the current lease, or a new one if that is gone.
  Status put_locked();
  void keep_alive();

  std::string uri_;
  std::vector<Endpoint> endpoints_;
  MetadataStoreOptions options_;
  std::mutex mu_;
  int64_t lease_ = 0;        // guarded by mu_
  std::string key_, value_;  // the published record; guarded by mu_
  size_t preferred_ = 0;     // endpoint that answered last; guarded by mu_
  // The last put of the record failed, so etcd may hold an older one (or none) although the
  // lease lives on: keep_alive puts it again until a put succeeds. Guarded by mu_.
  bool unpublished_ = false;
  std::unique_ptr<PeriodicTask> keeper_;
};

}  // namespace kvferry
