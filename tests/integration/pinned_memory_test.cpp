// Pinned host memory end to end: cuMemAllocHost / cuMemHostAlloc from the shared pinned heap
// (tests/programs/pinned_probe.cpp through the real stub and a real daemon), copies that are DMA
// from and to it, kernels that use it as device-mapped memory, the tenant's pinned_memory_limit,
// what `gpuproxyctl status` shows, reclamation after SIGKILL, and the daemon's checks of the
// ranges a client registers (spoken to by a hand-written client). The copy test also runs with
// GPUPROXY_TRANSPORT=rpc, where pinned memory stays local to the client.

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "ipc/shared_segment.hpp"
#include "ipc/unix_socket.hpp"
#include "protocol/ring_format.hpp"
#include "tests/support/process.hpp"

namespace gpuproxy::testing {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

class Pinned : public ::testing::Test {
protected:
  RunResult probe(std::vector<std::string> arguments) {
    RunResult result = daemon_.runClient("pinned_probe", std::move(arguments));
    EXPECT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon_.log();
    return result;
  }
  Daemon daemon_;
};

TEST_F(Pinned, CopiesFromAndToPinnedMemoryAreByteExact) {
  for (std::uint64_t bytes : {std::uint64_t{4} * kMiB, 3 * kMiB + 17}) {
    RunResult result = probe({"copies", std::to_string(bytes)});
    EXPECT_NE(result.output.find("copies OK"), std::string::npos) << result.output;
  }
  // Everything was freed: nothing stays charged.
  auto status = daemon_.status();
  EXPECT_EQ(tenantNamed(status, "default")["pinned_memory_used"], 0) << status.dump(2);
}

TEST_F(Pinned, KernelsReadAndWritePinnedMemoryThroughItsDevicePointer) {
  if (rpcTransport()) GTEST_SKIP() << "device-mapped host memory needs the shared pinned heap";
  RunResult result = probe({"kernel", "100000"});
  EXPECT_NE(result.output.find("kernel OK"), std::string::npos) << result.output;
}

// cuMemHostRegister: memory in a shared mapping of a sealed memfd, and whole pages of private
// memory (moved into one in place), are mapped by the daemon at the same address, so a kernel
// writes them through their device pointer; part of malloc'd pages is registered for copies only
// (DEVICEMAP refused honestly). Over either transport, and through the chain.
TEST_F(Pinned, RegisteredHostMemoryIsReachableWhereItCanBeShared) {
  RunResult result = probe({"register"});
  ASSERT_NE(result.output.find("register OK"), std::string::npos) << result.output;
  auto got = answers(result.output);
  const std::map<std::string, std::string> expected = {
      {"register-shared", "CUDA_SUCCESS"},
      {"register-shared-again", "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"},
      // cuMemHostGetFlags reports cuMemHostAlloc's flags only.
      {"registered-flags", "CUDA_ERROR_INVALID_VALUE"},
      {"shared-device-pointer", "CUDA_SUCCESS"},
      {"shared-device-pointer-is-host", "yes"},
      {"shared-kernel", "CUDA_SUCCESS"},
      {"shared-kernel-sync", "CUDA_SUCCESS"},
      {"shared-kernel-wrote", "yes"},
      {"unregister-shared", "CUDA_SUCCESS"},
      {"unregister-shared-again", "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
      {"register-heap-devicemap", "CUDA_ERROR_NOT_SUPPORTED"},
      {"register-heap", "CUDA_SUCCESS"},
      {"register-heap-overlap", "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"},
      {"heap-device-pointer", "CUDA_ERROR_NOT_SUPPORTED"},
      {"unregister-heap-inside", "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
      {"unregister-heap", "CUDA_SUCCESS"},
      {"register-private-pages-devicemap", "CUDA_SUCCESS"},
      {"private-pages-kept", "yes"},
      {"private-pages-device-pointer", "CUDA_SUCCESS"},
      {"private-pages-kernel", "CUDA_SUCCESS"},
      {"private-pages-kernel-wrote", "yes"},
      {"unregister-private-pages", "CUDA_SUCCESS"},
      {"private-pages-usable", "yes"},
      {"register-unsealed-devicemap", "CUDA_ERROR_NOT_SUPPORTED"},
      {"register-null", "CUDA_ERROR_INVALID_VALUE"},
      {"register-empty", "CUDA_ERROR_INVALID_VALUE"},
      {"register-bad-flags", "CUDA_ERROR_INVALID_VALUE"},
      {"register-iomemory", "CUDA_ERROR_NOT_SUPPORTED"},
      {"unregister-never", "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
  };
  for (const auto& [check, value] : expected) EXPECT_EQ(got[check], value) << check;
  // The shared range was charged while registered and credited when unregistered.
  auto status = daemon_.status();
  EXPECT_EQ(tenantNamed(status, "default")["pinned_memory_used"], 0) << status.dump(2);
}

TEST_F(Pinned, AsyncCopiesReturnAtOnceAndBlockingOnesWait) {
  if (rpcTransport()) GTEST_SKIP() << "over RPC every copy waits for the daemon";
  auto got = answers(probe({"async"}).output);
  ASSERT_EQ(got.count("async"), 1u);
  // The stream is busy for 300 ms either time.
  EXPECT_LT(std::stod(got["async-copy-ms"]), 150.0);
  EXPECT_GE(std::stod(got["blocking-copy-ms"]), 200.0);
}

// `alpha` may pin 8 MiB, `beta` has no pinned limit.
class PinnedTenants : public ::testing::Test {
protected:
  PinnedTenants() {
    std::ofstream(config_) << "tenants:\n"
                           << "  - name: alpha\n"
                           << "    socket: " << alpha_ << "\n"
                           << "    pinned_memory_limit: 8MiB\n"
                           << "  - name: beta\n"
                           << "    socket: " << beta_ << "\n";
    Daemon::Options options;
    options.extraArguments = {"--config", config_};
    daemon_ = std::make_unique<Daemon>(options);
  }

  // What cuMemHostAlloc answers a fresh client of `socket`; the client is gone afterwards.
  std::string holdResult(const std::string& socket, std::uint64_t bytes) {
    auto client = daemon_->startClientOn(socket, "pinned_probe", {"hold", std::to_string(bytes)});
    EXPECT_TRUE(eventually([&] {
      return client->output().find("cuMemHostAlloc") != std::string::npos || !client->running();
    })) << client->errors();
    std::string result = answers(client->output())["cuMemHostAlloc"];
    if (client->running()) client->signal(SIGKILL);
    client->wait();
    return result;
  }

  TempDir directory_;
  std::string config_ = directory_.file("tenants.yaml");
  std::string alpha_ = directory_.file("alpha/gpuproxy.sock");
  std::string beta_ = directory_.file("beta/gpuproxy.sock");
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(PinnedTenants, TheLimitRefusesPinnedMemoryAndAKilledClientGivesItBack) {
  if (rpcTransport()) GTEST_SKIP() << "pinned memory is the client's own over RPC";
  auto holder = daemon_->startClientOn(alpha_, "pinned_probe", {"hold", std::to_string(6 * kMiB)});
  ASSERT_TRUE(eventually([&] { return holder->output().find("holding") != std::string::npos; }))
      << holder->output() << holder->errors() << daemon_->log();

  // Another client of alpha would pass the limit; beta is not limited by alpha's use.
  EXPECT_EQ(holdResult(alpha_, 4 * kMiB), "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(holdResult(beta_, 64 * kMiB), "CUDA_SUCCESS");

  auto status = daemon_->status();
  auto alpha = tenantNamed(status, "alpha");
  EXPECT_EQ(alpha["pinned_memory_used"], 6 * kMiB) << status.dump(2);
  EXPECT_EQ(alpha["pinned_memory_limit"], 8 * kMiB);
  EXPECT_EQ(alpha["oom_count"], 1);
  EXPECT_EQ(tenantNamed(status, "beta")["pinned_memory_limit"], nullptr);
  ASSERT_EQ(status["clients"].size(), 1u) << status.dump(2);
  EXPECT_EQ(status["clients"][0]["pinned_memory_used"], 6 * kMiB);
  RunResult table = daemon_->ctl({"status"});
  EXPECT_NE(table.output.find("PINNED"), std::string::npos) << table.output;

  holder->signal(SIGKILL);
  EXPECT_EQ(holder->wait().signal, SIGKILL);
  EXPECT_TRUE(eventually([&] {
    return tenantNamed(daemon_->status(), "alpha")["pinned_memory_used"] == 0;
  })) << daemon_->status().dump(2);

  // An operator raises the limit: what was refused now fits.
  RunResult set = daemon_->ctl({"set-limit", "alpha", "--pinned-memory", "1GiB"});
  ASSERT_TRUE(set.status.exitedWith(0)) << set.errors;
  EXPECT_EQ(tenantNamed(daemon_->status(), "alpha")["pinned_memory_limit"], 1ull << 30);
  EXPECT_EQ(holdResult(alpha_, 16 * kMiB), "CUDA_SUCCESS");
}

// Memory registered with cuMemHostRegister counts against the same limit, over either
// transport, and a killed client gives it back. The limit answers first, wherever the memory
// lies; memory of another client's at an address the daemon has mapped already cannot be
// device-mapped (the daemon maps it at the client's address), and does not reach the first's.
TEST_F(PinnedTenants, RegisteredHostMemoryCountsAgainstTheLimit) {
  auto holder =
      daemon_->startClientOn(alpha_, "pinned_probe", {"hold-registered", std::to_string(6 * kMiB)});
  ASSERT_TRUE(eventually([&] { return holder->output().find("holding") != std::string::npos; }))
      << holder->output() << holder->errors() << daemon_->log();
  const std::string address = answers(holder->output())["holding at"];
  ASSERT_EQ(address.rfind("0x", 0), 0u) << holder->output();

  auto second =
      daemon_->runClientOn(alpha_, "pinned_probe", {"hold-registered", std::to_string(4 * kMiB)});
  EXPECT_EQ(answers(second.output)["cuMemHostRegister"], "CUDA_ERROR_OUT_OF_MEMORY")
      << second.output << second.errors << daemon_->logs();
  auto sameAddress = daemon_->runClientOn(alpha_, "pinned_probe",
                                          {"hold-registered", std::to_string(4 * kMiB), address});
  EXPECT_EQ(answers(sameAddress.output)["cuMemHostRegister"], "CUDA_ERROR_OUT_OF_MEMORY")
      << sameAddress.output << sameAddress.errors << daemon_->logs();
  auto otherTenant = daemon_->runClientOn(beta_, "pinned_probe",
                                          {"hold-registered", std::to_string(4 * kMiB), address});
  EXPECT_EQ(answers(otherTenant.output)["cuMemHostRegister"], "CUDA_ERROR_NOT_SUPPORTED")
      << otherTenant.output << otherTenant.errors << daemon_->logs();
  EXPECT_NE(otherTenant.errors.find("has that address in use already"), std::string::npos)
      << otherTenant.errors;

  auto status = daemon_->status();
  EXPECT_EQ(tenantNamed(status, "alpha")["pinned_memory_used"], 6 * kMiB) << status.dump(2);
  EXPECT_EQ(tenantNamed(status, "alpha")["oom_count"], 2) << status.dump(2);
  EXPECT_EQ(tenantNamed(status, "beta")["pinned_memory_used"], 0) << status.dump(2);
  EXPECT_TRUE(holder->running()) << holder->errors();
  holder->signal(SIGKILL);
  EXPECT_EQ(holder->wait().signal, SIGKILL);
  EXPECT_TRUE(eventually([&] {
    return tenantNamed(daemon_->status(), "alpha")["pinned_memory_used"] == 0;
  })) << daemon_->status().dump(2);
}

// ---- the daemon's checks, from a hand-written client ----

int connectTo(const std::string& path) {
  return ipc::connectUnixSocket(path).release();
}

// The start of the first mapping of process `pid`: an address certainly in use there.
std::uint64_t firstMapping(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string range;
  maps >> range;
  return std::stoull(range.substr(0, range.find('-')), nullptr, 16);
}

class RawPinnedClient {
public:
  RawPinnedClient(kj::AsyncIoContext& io, const std::string& socketPath)
      : io_(io),
        stream_(io_.lowLevelProvider->wrapUnixSocketFd(
            connectTo(socketPath), kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP)),
        client_(*stream_, 4),
        session_(nullptr) {
    auto attach = client_.bootstrap().castAs<protocol::Gateway>().attachRequest();
    attach.setProtocolVersion(protocol::PROTOCOL_VERSION);
    session_ = attach.send().wait(io_.waitScope).getSession();
    auto retain = session_.retainPrimaryContextRequest();
    retain.setDevice(0);
    EXPECT_EQ(retain.send().wait(io_.waitScope).getResult(), CUDA_SUCCESS);
  }

  struct Opened {
    CUresult result;
    std::uint64_t segmentBytes;
    std::uint64_t pinnedHeapBytes;
  };
  Opened open(std::uint64_t heapBytes, std::uint64_t address, std::uint64_t reservedBytes) {
    auto request = session_.openDataPlaneRequest();
    request.setPinnedHeapBytes(heapBytes);
    request.setAddress(address);
    request.setReservedBytes(reservedBytes);
    auto response = request.send().wait(io_.waitScope);
    Opened opened{static_cast<CUresult>(response.getResult()), response.getSegmentBytes(),
                  response.getPinnedHeapBytes()};
    if (opened.result == CUDA_SUCCESS) {
      auto fd = response.getSegment().getFd().wait(io_.waitScope);
      KJ_IF_MAYBE (received, fd) {
        segment_ = ipc::SharedSegment::map(ipc::UniqueFd(::fcntl(*received, F_DUPFD_CLOEXEC, 0)),
                                           opened.segmentBytes, reservation_);
      }
    }
    return opened;
  }

  CUresult registerPinned(std::uint64_t offset, std::uint64_t bytes) {
    auto request = session_.registerPinnedRequest();
    request.setOffset(offset);
    request.setBytes(bytes);
    return static_cast<CUresult>(request.send().wait(io_.waitScope).getResult());
  }

  CUresult unregisterPinned(std::uint64_t offset) {
    auto request = session_.unregisterPinnedRequest();
    request.setOffset(offset);
    return static_cast<CUresult>(request.send().wait(io_.waitScope).getResult());
  }

  ipc::AddressReservation reservation_;
  ipc::SharedSegment segment_;

private:
  kj::AsyncIoContext& io_;
  kj::Own<kj::AsyncCapabilityStream> stream_;
  capnp::TwoPartyClient client_;
  protocol::Session::Client session_;
};

TEST(PinnedRanges, TheDaemonMapsTheSegmentWhereAskedAndRefusesBadRanges) {
  if (rpcTransport()) GTEST_SKIP() << "the transport does not matter to a hand-written client";
  Daemon daemon;
  auto io = kj::setupAsyncIo();
  RawPinnedClient client(io, daemon.socketPath());
  constexpr std::uint64_t kHeap = 4 * kMiB;
  client.reservation_ = ipc::AddressReservation::reserve(kHeap + 64 * kMiB);
  const auto address = reinterpret_cast<std::uintptr_t>(client.reservation_.address());

  // Too small a reservation: the daemon says how much it needs and creates nothing.
  auto small = client.open(kHeap, address, kHeap);
  EXPECT_EQ(small.result, CUDA_ERROR_INVALID_VALUE);
  EXPECT_GT(small.segmentBytes, kHeap);
  EXPECT_LE(small.segmentBytes, client.reservation_.size());
  // An address the daemon has in use.
  EXPECT_EQ(client.open(kHeap, firstMapping(daemon.pid()), 1ull << 40).result,
            CUDA_ERROR_ALREADY_MAPPED);
  // Room enough, at an address free in the daemon: mapped there, with the heap asked for.
  auto opened = client.open(kHeap, address, client.reservation_.size());
  ASSERT_EQ(opened.result, CUDA_SUCCESS);
  EXPECT_EQ(opened.pinnedHeapBytes, kHeap);
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(client.segment_.data()), address);
  EXPECT_EQ(client.open(kHeap, address, client.reservation_.size()).result,
            CUDA_ERROR_ALREADY_MAPPED);  // once per session

  EXPECT_EQ(client.registerPinned(8192, 8192), CUDA_SUCCESS);
  EXPECT_EQ(client.registerPinned(0, 0), CUDA_ERROR_INVALID_VALUE);         // empty
  EXPECT_EQ(client.registerPinned(100, 4096), CUDA_ERROR_INVALID_VALUE);    // unaligned start
  EXPECT_EQ(client.registerPinned(0, 5000), CUDA_ERROR_INVALID_VALUE);      // unaligned size
  EXPECT_EQ(client.registerPinned(kHeap, 4096), CUDA_ERROR_INVALID_VALUE);  // past the end
  EXPECT_EQ(client.registerPinned(kHeap - 4096, 8192), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(client.registerPinned(~std::uint64_t{4095}, 8192), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(client.registerPinned(4096, 8192), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(client.registerPinned(12288, 4096), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(client.registerPinned(16384, 4096), CUDA_SUCCESS);  // adjacent is fine
  EXPECT_EQ(daemon.status()["clients"][0]["pinned_memory_used"], 12288);

  EXPECT_EQ(client.unregisterPinned(4096), CUDA_ERROR_INVALID_VALUE);  // not a start
  EXPECT_EQ(client.unregisterPinned(8192), CUDA_SUCCESS);
  EXPECT_EQ(client.unregisterPinned(8192), CUDA_ERROR_INVALID_VALUE);  // already gone
  EXPECT_EQ(client.registerPinned(4096, 8192), CUDA_SUCCESS);          // the range is free again
  EXPECT_EQ(daemon.status()["clients"][0]["pinned_memory_used"], 12288);
}

}  // namespace
}  // namespace gpuproxy::testing
