// SlotRing and HostBuffer: the slot state machine, blocking and closing, bounded memory.
#include <gtest/gtest.h>

#include <thread>

#include "conveyor/pinned.h"

namespace conveyor {
namespace {

using namespace std::chrono_literals;

SlotRing::Options two_fields(size_t slots) {
  SlotRing::Options o;
  o.slots = slots;
  o.layout.field_bytes = {1000, 24};
  return o;
}

TEST(HostBuffer, AllocatesZeroedAlignedMemoryAndSaysWhetherItIsPinned) {
  HostBuffer b(10000);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_GE(b.size(), 10000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
  EXPECT_EQ(b.is_pinned(), cuda_available());
  for (size_t i = 0; i < b.size(); i += 997) EXPECT_EQ(b.data()[i], std::byte{0});
  HostBuffer moved = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_NE(moved.data(), nullptr);
  HostBuffer pageable(100, HostBuffer::Kind::kPageable);
  EXPECT_FALSE(pageable.is_pinned());
}

TEST(SlotRing, FieldsAreDisjointAlignedAndTheSizeIsFixed) {
  SlotRing ring(two_fields(3));
  EXPECT_EQ(ring.slots(), 3u);
  EXPECT_GE(ring.bytes(), ring.slots() * ring.slot_bytes());
  EXPECT_LT(ring.bytes(), ring.slots() * ring.slot_bytes() + 4096);  // page rounding only
  EXPECT_GE(ring.bytes(), 3u * (1000 + 24));
  for (uint32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ring.field(s, 0)) % 256, 0u);
    EXPECT_GE(ring.field(s, 1) - ring.field(s, 0), 1000);
    if (s > 0) {
      EXPECT_GE(ring.field(s, 0) - ring.field(s - 1, 1), 24);
    }
  }
}

TEST(SlotRing, StatesFollowTheLifecycleAndIllegalMovesThrow) {
  SlotRing ring(two_fields(2));
  auto a = ring.try_acquire();
  ASSERT_TRUE(a);
  EXPECT_EQ(ring.state(*a), SlotState::kFilling);
  EXPECT_THROW(ring.begin_copy(*a), std::logic_error);  // not ready yet
  ring.mark_ready(*a);
  EXPECT_EQ(ring.state(*a), SlotState::kReady);
  ring.begin_copy(*a);
  EXPECT_EQ(ring.state(*a), SlotState::kCopying);
  EXPECT_THROW(ring.release(*a), std::logic_error);  // a copy may still read it
  auto b = ring.try_acquire();
  ASSERT_TRUE(b);
  EXPECT_FALSE(ring.try_acquire()) << "both slots are taken";
  ring.copy_finished(*a);
  EXPECT_EQ(ring.state(*a), SlotState::kFree);
  auto c = ring.try_acquire();
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, *a);
  auto counts = ring.count_states();
  EXPECT_EQ(counts[static_cast<size_t>(SlotState::kFilling)], 2u);
}

TEST(SlotRing, AcquireBlocksUntilASlotIsFreedAndCloseWakesWaiters) {
  SlotRing ring(two_fields(1));
  auto only = ring.acquire();
  ASSERT_TRUE(only);
  EXPECT_FALSE(ring.try_acquire_for(20ms));
  std::optional<uint32_t> got;
  std::thread waiter([&] { got = ring.acquire(); });
  std::this_thread::sleep_for(20ms);
  ring.release(*only);
  waiter.join();
  ASSERT_TRUE(got);
  std::thread closed_waiter([&] { got = ring.acquire(); });
  std::this_thread::sleep_for(20ms);
  ring.close();
  closed_waiter.join();
  EXPECT_FALSE(got);
  EXPECT_FALSE(ring.acquire());
}

TEST(SlotRing, ManyThreadsNeverShareASlot) {
  SlotRing ring(two_fields(4));
  std::atomic<int> owners[4] = {};
  std::atomic<int> violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto s = ring.acquire();
        if (owners[*s].fetch_add(1) != 0) violations++;
        owners[*s].fetch_sub(1);
        ring.release(*s);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(ring.count_states()[static_cast<size_t>(SlotState::kFree)], 4u);
}

}  // namespace
}  // namespace conveyor
