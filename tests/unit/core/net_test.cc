// core/net.h's addressing helpers: listeners on every interface and the addresses a peer
// dials instead.
#include "core/net.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

TEST(ListenAddresses, OnlyTheWildcardMeansEveryInterface) {
  EXPECT_TRUE(is_any_address("0.0.0.0"));
  EXPECT_FALSE(is_any_address("127.0.0.1"));
  EXPECT_FALSE(is_any_address("10.0.0.0"));
  EXPECT_FALSE(is_any_address(""));
}

TEST(ListenAddresses, LoopbackIsTheWholeBlockAndLocalhost) {
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.5.6.7"));
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_FALSE(is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(is_loopback_host("10.127.0.1"));
}

TEST(ListenAddresses, AWildcardListenerIsDialledAtTheHostItsOwnerWasReachedAt) {
  EXPECT_EQ(reachable_via("0.0.0.0:4100", "198.18.0.2"), "198.18.0.2:4100");
  // A listener on one address keeps it: a descriptor cannot be steered by the dialled host.
  EXPECT_EQ(reachable_via("10.1.2.3:4100", "198.18.0.2"), "10.1.2.3:4100");
  EXPECT_EQ(reachable_via("", "198.18.0.2"), "");
  EXPECT_EQ(reachable_via("no-port", "198.18.0.2"), "no-port");
}

TEST(ListenAddresses, InterfaceAddressesAreDialableAndNeverLoopback) {
  for (const std::string& host : interface_addresses()) {
    EXPECT_FALSE(is_loopback_host(host)) << host;
    EXPECT_FALSE(is_any_address(host)) << host;
    EXPECT_TRUE(parse_endpoint(host + ":1").ok()) << host;
  }
}

}  // namespace
}  // namespace kvferry
