// NotifyInbox: the notification inbox's bounds in entries and bytes, each sender's share of
// them, and the room reserved for a lost sender's entry.
#include "engine/notify_inbox.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvferry::detail {
namespace {

using Outcome = NotifyInbox::Outcome;

Notification message(const std::string& sender, uint64_t incarnation, std::string bytes) {
  Notification n;
  n.sender = sender;
  n.sender_endpoint = "127.0.0.1:7000";
  n.sender_incarnation = incarnation;
  n.bytes = std::move(bytes);
  return n;
}

// Pushes numbered messages from `sender` until one is refused; returns how many went in and
// the refusal.
std::pair<int, Outcome> push_until_refused(NotifyInbox& inbox, const std::string& sender, int first,
                                           size_t bytes = 8) {
  for (int i = first;; ++i) {
    std::string body = std::to_string(i);
    body.resize(bytes, '.');
    Notification n = message(sender, 1, std::move(body));
    const Outcome outcome = inbox.try_push(n, 0);
    if (outcome != Outcome::kAdded) {
      EXPECT_EQ(n.sender, sender) << "a refused notification is left to its caller";
      return {i - first, outcome};
    }
  }
}

TEST(NotifyInbox, OneSenderAloneHoldsHalfAndTheOthersStillGetIn) {
  NotifyInbox inbox({.max_entries = 100, .max_bytes = size_t{1} << 30});
  auto [flooded, refusal] = push_until_refused(inbox, "flooder", 0);
  EXPECT_EQ(flooded, 50);
  EXPECT_EQ(refusal, Outcome::kOverShare);
  // Another sender gets in at once; with two senders holding entries the flooder's share is
  // a third, so it stays refused, and the newcomer may take up to a third.
  auto [other, other_refusal] = push_until_refused(inbox, "other", 1000);
  EXPECT_EQ(other, 33);
  EXPECT_EQ(other_refusal, Outcome::kOverShare);
  Notification more = message("flooder", 1, "more");
  EXPECT_EQ(inbox.try_push(more, 0), Outcome::kOverShare);
  EXPECT_EQ(inbox.usage().entries, 83u);
  EXPECT_EQ(inbox.usage().senders, 2u);
  std::vector<Notification> got = inbox.drain(SIZE_MAX);
  ASSERT_EQ(got.size(), 83u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(got[i].sender, "flooder");
    EXPECT_EQ(got[i].bytes.substr(0, std::to_string(i).size()), std::to_string(i));
  }
  for (int i = 0; i < 33; ++i) EXPECT_EQ(got[50 + i].sender, "other");
  EXPECT_EQ(inbox.usage().entries, 0u);
  EXPECT_EQ(inbox.usage().bytes, 0u);
  EXPECT_EQ(inbox.usage().senders, 0u);
}

TEST(NotifyInbox, TheSameNameFromAnotherIncarnationIsAnotherSender) {
  NotifyInbox inbox({.max_entries = 10, .max_bytes = size_t{1} << 30});
  EXPECT_EQ(push_until_refused(inbox, "engine", 0).first, 5);
  Notification restarted = message("engine", 2, "after restart");
  EXPECT_EQ(inbox.try_push(restarted, 0), Outcome::kAdded);
}

TEST(NotifyInbox, BytesAreBoundedAsWellAsEntries) {
  const size_t cost = NotifyInbox::entry_cost(message("big", 1, std::string(4096, 'x')));
  NotifyInbox inbox({.max_entries = 1000, .max_bytes = 10 * cost});
  auto [pushed, refusal] = push_until_refused(inbox, "big", 0, 4096);
  EXPECT_EQ(pushed, 5);
  EXPECT_EQ(refusal, Outcome::kOverShare);
  EXPECT_LE(inbox.usage().bytes, 5 * cost);
  // The totals: senders holding nothing may each add one, until the bytes run out (their
  // names are a byte shorter than "big", so five fit in the other half).
  int newcomers = 0;
  Outcome last = Outcome::kAdded;
  while (last == Outcome::kAdded) {
    Notification n = message(fmt::format("n{}", newcomers), 1, std::string(4096, 'y'));
    last = inbox.try_push(n, 0);
    if (last == Outcome::kAdded) ++newcomers;
  }
  EXPECT_EQ(last, Outcome::kFull);
  EXPECT_EQ(newcomers, 5);
  EXPECT_LE(inbox.usage().bytes, 10 * cost);
}

TEST(NotifyInbox, ASenderHoldingNothingMayAddOneLargerThanItsShare) {
  NotifyInbox inbox({.max_entries = 100, .max_bytes = 8192});
  Notification large = message("large", 1, std::string(5000, 'z'));
  EXPECT_EQ(inbox.try_push(large, 0), Outcome::kAdded);
  Notification second = message("large", 1, "x");
  EXPECT_EQ(inbox.try_push(second, 0), Outcome::kOverShare);
  ASSERT_EQ(inbox.drain(1).at(0).bytes, std::string(5000, 'z'));
  EXPECT_EQ(inbox.try_push(second, 0), Outcome::kAdded);
}

TEST(NotifyInbox, DrainingGivesTheShareBack) {
  NotifyInbox inbox({.max_entries = 20, .max_bytes = size_t{1} << 30});
  EXPECT_EQ(push_until_refused(inbox, "a", 0).first, 10);
  EXPECT_EQ(inbox.drain(4).size(), 4u);
  EXPECT_EQ(push_until_refused(inbox, "a", 10).first, 4);
  std::vector<Notification> got = inbox.drain(SIZE_MAX);
  ASSERT_EQ(got.size(), 10u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(got[i].bytes.substr(0, std::to_string(i + 4).size()), std::to_string(i + 4));
  }
}

TEST(NotifyInbox, AReservationBecomesTheLostEntryAfterTheSendersMessages) {
  NotifyInbox inbox({.max_entries = 100, .max_bytes = size_t{1} << 20});
  Notification first = message("s", 1, "first");
  const size_t reserve = NotifyInbox::lost_entry_cost("s", "127.0.0.1:7000");
  ASSERT_EQ(inbox.try_push(first, reserve), Outcome::kAdded);
  EXPECT_EQ(inbox.usage().entries, 2u);  // the message and the reservation
  Notification second = message("s", 1, "second");
  ASSERT_EQ(inbox.try_push(second, 0), Outcome::kAdded);
  Notification lost = message("s", 1, std::string(kMaxSenderLostReasonBytes, 'r'));
  lost.kind = Notification::Kind::kSenderLost;
  inbox.push_reserved(lost, reserve);
  EXPECT_EQ(inbox.usage().entries, 3u);
  std::vector<Notification> got = inbox.drain(SIZE_MAX);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].bytes, "first");
  EXPECT_EQ(got[1].bytes, "second");
  EXPECT_EQ(got[2].kind, Notification::Kind::kSenderLost);
  EXPECT_EQ(got[2].bytes, std::string(kMaxSenderLostReasonBytes, 'r'));
  EXPECT_EQ(inbox.usage().entries, 0u);
  EXPECT_EQ(inbox.usage().bytes, 0u);
  // A reservation given back (the sender said goodbye) leaves nothing behind.
  ASSERT_EQ(inbox.try_reserve(message("t", 1, ""), reserve), Outcome::kAdded);
  EXPECT_EQ(inbox.usage().bytes, reserve);
  inbox.release(message("t", 1, ""), reserve);
  EXPECT_EQ(inbox.usage().entries, 0u);
  EXPECT_EQ(inbox.usage().bytes, 0u);
  EXPECT_EQ(inbox.usage().senders, 0u);
}

}  // namespace
}  // namespace kvferry::detail
