#include "metadata/metadata_store.h"

#include <vector>

#include "metadata/etcd_store.h"
#include "metadata/handshake.h"
#include "metadata/redis_store.h"

namespace kvferry {
namespace {

constexpr std::string_view kValidSchemes =
    "p2p, etcd://host:port[,host:port...], redis://host:port";

// The embedded default: the handshake server serves the descriptor, so publishing is the
// engine's own business and fetching asks the peer directly.
class P2pStore final : public MetadataStore {
 public:
  explicit P2pStore(std::optional<std::string> secret) : secret_(std::move(secret)) {}
  const std::string& uri() const override { return uri_; }
  Status publish(const std::string&, const std::string&) override { return Status::Ok(); }
  Result<std::string> fetch(const std::string& key, Clock::time_point deadline) override {
    KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(key));
    return fetch_descriptor(endpoint, deadline, secret_);
  }

 private:
  std::optional<std::string> secret_;
  std::string uri_ = "p2p";
};

Result<std::vector<Endpoint>> parse_endpoints(std::string_view uri, std::string_view list) {
  std::vector<Endpoint> endpoints;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string_view one =
        list.substr(start, comma == std::string_view::npos ? list.npos : comma - start);
    auto endpoint = parse_endpoint(one);
    if (!endpoint.ok()) {
      return InvalidArgument("metadata URI '" + std::string(uri) +
                             "': " + endpoint.status().message());
    }
    endpoints.push_back(*endpoint);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return endpoints;
}

}  // namespace

std::string metadata_key(std::string_view endpoint) {
  return "kvferry/segments/" + std::string(endpoint);
}

Result<std::unique_ptr<MetadataStore>> open_metadata_store(std::string_view uri,
                                                           const MetadataStoreOptions& options) {
  if (uri == "p2p" || uri == "P2PHANDSHAKE")
    return std::unique_ptr<MetadataStore>(new P2pStore(options.secret));
  auto scheme_end = uri.find("://");
  std::string_view scheme = scheme_end == std::string_view::npos ? uri : uri.substr(0, scheme_end);
  if (scheme_end != std::string_view::npos) {
    std::string_view rest = uri.substr(scheme_end + 3);
    if (scheme == "etcd") {
      KVF_ASSIGN_OR_RETURN(auto endpoints, parse_endpoints(uri, rest));
      KVF_ASSIGN_OR_RETURN(auto store,
                           EtcdStore::open(std::string(uri), std::move(endpoints), options));
      return std::unique_ptr<MetadataStore>(std::move(store));
    }
    if (scheme == "redis") {
      KVF_ASSIGN_OR_RETURN(auto endpoints, parse_endpoints(uri, rest));
      if (endpoints.size() != 1) {
        return InvalidArgument("metadata URI '" + std::string(uri) +
                               "': redis takes one host:port");
      }
      KVF_ASSIGN_OR_RETURN(auto store, RedisStore::open(std::string(uri), endpoints[0], options));
      return std::unique_ptr<MetadataStore>(std::move(store));
    }
  }
  return InvalidArgument("unknown metadata backend '" + std::string(uri) +
                         "' (valid: " + std::string(kValidSchemes) + ")");
}

}  // namespace kvferry
