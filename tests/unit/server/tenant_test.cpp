// A tenant's ledger is shared by every GPU its clients use, and each GPU may be served by a thread
// of its own: charges from several threads at once must add up exactly and never pass the limit.
#include "server/tenant/tenant.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace gpuproxy::server {
namespace {

Tenant limitedTenant(std::uint64_t memoryLimit) {
  TenantLimits limits;
  limits.memoryLimit = memoryLimit;
  limits.maxObjects[static_cast<std::size_t>(TenantObject::kStream)] = 100;
  return Tenant(1, TenantDefinition{"t", "/s", limits});
}

TEST(Tenant, ChargesFromManyThreadsNeverPassTheLimitAndAddUp) {
  constexpr std::uint64_t kLimit = 1000;
  Tenant tenant = limitedTenant(kLimit);
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::atomic<std::uint64_t> granted{0};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<bool> overLimit{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < kRounds; ++round) {
        // 7 bytes at a time: 1000 is no multiple of it, so the last charges must be refused.
        if (tenant.tryCharge(0, 7)) {
          granted += 7;
          if (tenant.memoryUsed(0) > kLimit) overLimit = true;
          if (round % 2 == 0) {
            tenant.credit(0, 7);
            granted -= 7;
          }
        } else {
          ++refused;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_FALSE(overLimit);
  EXPECT_EQ(tenant.memoryUsed(0), granted.load());
  EXPECT_LE(tenant.memoryUsed(0), kLimit);
  EXPECT_GT(refused.load(), 0u);
  EXPECT_EQ(tenant.oomCount.load(), refused.load());
  EXPECT_EQ(tenant.memoryUsed(1), 0u);  // per device
}

TEST(Tenant, ObjectCapsHoldAcrossThreads) {
  Tenant tenant = limitedTenant(0);
  std::atomic<std::uint32_t> taken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        if (tenant.tryTakeObject(TenantObject::kStream)) ++taken;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(taken.load(), 100u);
  EXPECT_EQ(tenant.objectsHeld(TenantObject::kStream), 100u);
  tenant.giveBackObject(TenantObject::kStream);
  EXPECT_TRUE(tenant.tryTakeObject(TenantObject::kStream));
}

TEST(Tenant, ALimitChangedWhileAnotherThreadChargesAppliesToWhatComesAfter) {
  Tenant tenant = limitedTenant(100);
  std::atomic<bool> stop{false};
  std::thread charging([&] {
    while (!stop) {
      if (tenant.tryCharge(0, 10)) tenant.credit(0, 10);
    }
  });
  for (int i = 0; i < 200; ++i) {
    TenantLimits limits = tenant.limits();
    limits.memoryLimit = (i % 2 == 0) ? 5 : 100;
    tenant.setLimits(limits);
  }
  TenantLimits limits = tenant.limits();
  limits.memoryLimit = 5;
  tenant.setLimits(limits);
  stop = true;
  charging.join();
  EXPECT_FALSE(tenant.tryCharge(0, 10));
  EXPECT_EQ(tenant.memoryUsed(0), 0u);
}

TEST(Tenant, SchedulingTermsFollowTheLimits) {
  Tenant tenant = limitedTenant(0);
  EXPECT_EQ(tenant.schedulingTerms().weight, 1u);
  TenantLimits limits = tenant.limits();
  limits.weight = 7;
  limits.tenantClass = TenantClass::kLatencyCritical;
  tenant.setLimits(limits);
  EXPECT_EQ(tenant.schedulingTerms().weight, 7u);
  EXPECT_EQ(tenant.schedulingTerms().tenantClass, TenantClass::kLatencyCritical);
}

TEST(Tenant, RecentGpuTimeIsTheSumOfWhatThreadsAdded) {
  Tenant tenant = limitedTenant(0);
  const std::int64_t now = 5'000'000'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) tenant.addGpuTime(now, 3);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(tenant.recentGpuTime(now), 12'000u);
  EXPECT_EQ(tenant.recentGpuTime(now + 11'000'000'000), 0u);  // older than the window
}

}  // namespace
}  // namespace gpuproxy::server
