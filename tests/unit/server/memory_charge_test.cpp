// The memory ledger: a charge is recorded in every count that includes it for exactly as long as
// it lives, and one the tenant's limit refuses is recorded nowhere.
#include "server/gpu/memory_charge.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <utility>

namespace gpuproxy::server {
namespace {

class MemoryChargeTest : public ::testing::Test {
protected:
  MemoryChargeTest() {
    TenantLimits limits;
    limits.memoryLimit = 1000;
    stats_->tenant = std::make_shared<Tenant>(1, TenantDefinition{"t", "/s", limits});
  }

  MemoryLedger ledger() { return MemoryLedger{stats_, 1, onDevice_, &deviceTotal_}; }

  std::shared_ptr<ClientStats> stats_ = std::make_shared<ClientStats>();
  std::shared_ptr<std::uint64_t> onDevice_ = std::make_shared<std::uint64_t>(0);
  std::uint64_t deviceTotal_ = 500;  // other clients' memory on the GPU
};

TEST_F(MemoryChargeTest, IsRecordedEverywhereWhileItLives) {
  {
    auto charge = MemoryCharge::take(ledger(), 600, MemoryCharge::Kind::kModule);
    ASSERT_TRUE(charge);
    EXPECT_EQ(stats_->tenant->memoryUsed(1), 600u);
    EXPECT_EQ(stats_->tenant->memoryUsed(0), 0u);  // the limit is per device
    EXPECT_EQ(stats_->memoryUsed, 600u);
    EXPECT_EQ(stats_->moduleBytes, 600u);
    EXPECT_EQ(*onDevice_, 600u);
    EXPECT_EQ(deviceTotal_, 1100u);
    // Moving it hands the charge on; only the last owner gives it back.
    std::optional<MemoryCharge> moved;
    moved.emplace(std::move(*charge));
    charge.reset();
    EXPECT_EQ(stats_->memoryUsed, 600u);
  }
  EXPECT_EQ(stats_->tenant->memoryUsed(1), 0u);
  EXPECT_EQ(stats_->memoryUsed, 0u);
  EXPECT_EQ(stats_->moduleBytes, 0u);
  EXPECT_EQ(*onDevice_, 0u);
  EXPECT_EQ(deviceTotal_, 500u);
}

TEST_F(MemoryChargeTest, OneThatPassesTheLimitIsRecordedNowhere) {
  auto first = MemoryCharge::take(ledger(), 700, MemoryCharge::Kind::kAllocation);
  ASSERT_TRUE(first);
  EXPECT_FALSE(MemoryCharge::take(ledger(), 301, MemoryCharge::Kind::kAllocation));
  EXPECT_EQ(stats_->tenant->oomCount, 1u);
  EXPECT_EQ(stats_->memoryUsed, 700u);
  EXPECT_EQ(stats_->moduleBytes, 0u);  // an allocation is not module memory
  EXPECT_EQ(*onDevice_, 700u);
  EXPECT_TRUE(MemoryCharge::take(ledger(), 300, MemoryCharge::Kind::kAllocation));
}

}  // namespace
}  // namespace gpuproxy::server
