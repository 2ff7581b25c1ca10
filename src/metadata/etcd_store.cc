#include "metadata/etcd_store.h"

#include <httplib.h>
#include <openssl/evp.h>

#include <nlohmann/json.hpp>

#include "core/logging.h"

namespace kvferry {
namespace {

using json = nlohmann::json;

std::string base64_encode(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return ProtocolError("etcd: value is not base64");
  std::string out(3 * in.size() / 4, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  if (n < 0) return ProtocolError("etcd: value is not base64");
  size_t padding = 0;
  for (size_t i = in.size(); i > 0 && in[i - 1] == '='; --i) ++padding;
  out.resize(static_cast<size_t>(n) - padding);
  return out;
}

// etcd's gateway prints int64 as strings.
int64_t json_int64(const json& v) {
  if (v.is_string()) return std::stoll(v.get<std::string>());
  if (v.is_number_integer()) return v.get<int64_t>();
  return 0;
}

}  // namespace

EtcdStore::EtcdStore(std::string uri, std::vector<Endpoint> endpoints,
                     const MetadataStoreOptions& options)
    : uri_(std::move(uri)), endpoints_(std::move(endpoints)), options_(options) {}

Result<std::unique_ptr<EtcdStore>> EtcdStore::open(std::string uri, std::vector<Endpoint> endpoints,
                                                   const MetadataStoreOptions& options) {
  if (options.record_ttl.count() < 1) {
    return InvalidArgument("metadata record TTL " + std::to_string(options.record_ttl.count()) +
                           " s must be at least 1 s");
  }
  std::unique_ptr<EtcdStore> store(new EtcdStore(std::move(uri), std::move(endpoints), options));
  // Reachable now, or an error now.
  auto status = store->call("/v3/maintenance/status", "{}", options.io_timeout);
  if (!status.ok()) return status.status();
  auto period = std::chrono::duration_cast<std::chrono::milliseconds>(options.record_ttl) / 3;
  EtcdStore* raw = store.get();
  KVF_ASSIGN_OR_RETURN(store->keeper_, PeriodicTask::start(
                                           period, [raw] { raw->keep_alive(); }, "kvf-etcd-ttl"));
  return store;
}

EtcdStore::~EtcdStore() {
  keeper_.reset();
  std::lock_guard lock(mu_);
  if (lease_ != 0) {
    call("/v3/lease/revoke", json{{"ID", std::to_string(lease_)}}.dump(), options_.io_timeout)
        .status()
        .ignore();
  }
}

Result<std::string> EtcdStore::call(const std::string& path, const std::string& body,
                                    std::chrono::milliseconds timeout) {
  std::string last_error;
  size_t first = preferred_;
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    size_t i = (first + k) % endpoints_.size();
    httplib::Client client(endpoints_[i].host, endpoints_[i].port);
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    auto reply = client.Post(path.c_str(), body, "application/json");
    if (!reply) {
      last_error = endpoints_[i].to_string() + ": " + httplib::to_string(reply.error());
      continue;
    }
    if (reply->status != 200) {
      return ProtocolError("etcd " + endpoints_[i].to_string() + path + " answered HTTP " +
                           std::to_string(reply->status) + ": " + reply->body.substr(0, 200));
    }
    preferred_ = i;
    return reply->body;
  }
  return PeerUnreachable("metadata store " + uri_ + " unreachable (" + last_error + ")");
}

Status EtcdStore::grant_and_put_locked() {
  KVF_ASSIGN_OR_RETURN(std::string granted,
                       call("/v3/lease/grant", json{{"TTL", options_.record_ttl.count()}}.dump(),
                            options_.io_timeout));
  json g = json::parse(granted, nullptr, false);
  if (g.is_discarded() || !g.contains("ID")) return ProtocolError("etcd lease grant: " + granted);
  lease_ = json_int64(g["ID"]);
  json put = {{"key", base64_encode(key_)},
              {"value", base64_encode(value_)},
              {"lease", std::to_string(lease_)}};
  return call("/v3/kv/put", put.dump(), options_.io_timeout).status();
}

Status EtcdStore::put_locked() {
  if (lease_ == 0) return grant_and_put_locked();
  json put = {{"key", base64_encode(key_)},
              {"value", base64_encode(value_)},
              {"lease", std::to_string(lease_)}};
  auto reply = call("/v3/kv/put", put.dump(), options_.io_timeout);
  if (reply.ok()) return Status::Ok();
  // The lease may be gone (etcd restarted); start over.
  return grant_and_put_locked();
}

Status EtcdStore::publish(const std::string& key, const std::string& value) {
  std::lock_guard lock(mu_);
  key_ = metadata_key(key);
  value_ = value;
  Status s = put_locked();
  unpublished_ = !s.ok();  // keep_alive puts it until one put succeeds
  return s;
}

void EtcdStore::keep_alive() {
  std::lock_guard lock(mu_);
  if (key_.empty()) return;
  if (unpublished_) {
    // A publish failed (etcd down or unreachable): the record in etcd, if any, is stale
    // whatever its lease says. Put the current value until etcd takes it.
    Status s = put_locked();
    unpublished_ = !s.ok();
    if (s.ok()) {
      log().info("etcd: published {} again after a failed publish", key_);
    } else {
      log().warn(
          "etcd: publishing {} failed again (retried every {} ms): {}", key_,
          (std::chrono::duration_cast<std::chrono::milliseconds>(options_.record_ttl) / 3).count(),
          s.to_string());
    }
    return;
  }
  if (lease_ == 0) return;
  auto reply =
      call("/v3/lease/keepalive", json{{"ID", std::to_string(lease_)}}.dump(), options_.io_timeout);
  bool alive = false;
  if (reply.ok()) {
    json r = json::parse(*reply, nullptr, false);
    alive = !r.is_discarded() && r.contains("result") && r["result"].contains("TTL") &&
            json_int64(r["result"]["TTL"]) > 0;
  }
  if (alive) return;
  log().warn("etcd lease {} lost; publishing {} again", lease_, key_);
  if (Status s = grant_and_put_locked(); !s.ok()) {
    unpublished_ = true;
    log().warn("etcd: republishing failed: {}", s.to_string());
  }
}

Result<std::string> EtcdStore::fetch(const std::string& key, Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return PeerUnreachable("no time left to ask " + uri_ + " for " + key);
  std::string reply_body;
  {
    std::lock_guard lock(mu_);
    KVF_ASSIGN_OR_RETURN(
        reply_body,
        call("/v3/kv/range", json{{"key", base64_encode(metadata_key(key))}}.dump(), left));
  }
  json r = json::parse(reply_body, nullptr, false);
  if (r.is_discarded()) return ProtocolError("etcd range reply is not JSON");
  if (!r.contains("kvs") || !r["kvs"].is_array() || r["kvs"].empty()) {
    return PeerUnreachable("no engine is registered as " + key + " in " + uri_);
  }
  const json& value = r["kvs"][0]["value"];
  if (!value.is_string()) return ProtocolError("etcd range reply has no value");
  return base64_decode(value.get<std::string>());
}

}  // namespace kvferry
