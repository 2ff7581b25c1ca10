#include "metadata/metadata_store.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "core/auth.h"
#include "core/logging.h"
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

// With a secret, a record in a shared store (etcd, Redis) is an envelope whose HMAC covers
// its key and the descriptor: anyone with write access to the store but not the secret can
// neither forge a record nor move a real one under another name. Records without a valid
// signature are refused (and logged), never parsed as descriptors.
constexpr std::string_view kSignedRecordFormat = "kvferry-signed-descriptor-1";

AuthProof record_signature(std::string_view secret, std::string_view key,
                           std::string_view descriptor) {
  std::string message(kSignedRecordFormat);
  message.push_back('\0');
  message.append(key);
  message.push_back('\0');
  message.append(descriptor);
  return auth_signature(secret, message);
}

class SignedStore final : public MetadataStore {
 public:
  SignedStore(std::unique_ptr<MetadataStore> store, std::string secret)
      : store_(std::move(store)), secret_(std::move(secret)) {}
  const std::string& uri() const override { return store_->uri(); }
  Status publish(const std::string& key, const std::string& json) override {
    const AuthProof signature = record_signature(secret_, key, json);
    nlohmann::json record = {
        {"format", kSignedRecordFormat}, {"hmac", to_hex(signature)}, {"descriptor", json}};
    return store_->publish(key, record.dump());
  }
  Result<std::string> fetch(const std::string& key, Clock::time_point deadline) override {
    KVF_ASSIGN_OR_RETURN(std::string value, store_->fetch(key, deadline));
    auto refuse = [&](std::string_view why) {
      std::string message = fmt::format(
          "the record of {} in {} is {}: refused (every engine "
          "with the secret signs its record)",
          key, store_->uri(), why);
      log().warn("{}", message);
      return Unauthenticated(std::move(message));
    };
    nlohmann::json record = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("format") || !record["format"].is_string() ||
        record["format"].get<std::string>() != kSignedRecordFormat || !record.contains("hmac") ||
        !record["hmac"].is_string() || !record.contains("descriptor") ||
        !record["descriptor"].is_string()) {
      return refuse("not signed");
    }
    std::optional<std::string> hmac = from_hex(record["hmac"].get<std::string>());
    std::string descriptor = record["descriptor"].get<std::string>();
    if (!hmac || !auth_proof_matches(record_signature(secret_, key, descriptor),
                                     std::as_bytes(std::span(hmac->data(), hmac->size())))) {
      return refuse("signed with another secret, or altered");
    }
    return descriptor;
  }

 private:
  std::unique_ptr<MetadataStore> store_;
  std::string secret_;
};

// Shared stores are wrapped in SignedStore when there is a secret.
std::unique_ptr<MetadataStore> signed_if_secret(std::unique_ptr<MetadataStore> store,
                                                const MetadataStoreOptions& options) {
  if (!options.secret) return store;
  return std::make_unique<SignedStore>(std::move(store), *options.secret);
}

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
      return signed_if_secret(std::move(store), options);
    }
    if (scheme == "redis") {
      KVF_ASSIGN_OR_RETURN(auto endpoints, parse_endpoints(uri, rest));
      if (endpoints.size() != 1) {
        return InvalidArgument("metadata URI '" + std::string(uri) +
                               "': redis takes one host:port");
      }
      KVF_ASSIGN_OR_RETURN(auto store, RedisStore::open(std::string(uri), endpoints[0], options));
      return signed_if_secret(std::move(store), options);
    }
  }
  return InvalidArgument("unknown metadata backend '" + std::string(uri) +
                         "' (valid: " + std::string(kValidSchemes) + ")");
}

}  // namespace kvferry
