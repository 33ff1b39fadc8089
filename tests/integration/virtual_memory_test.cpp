// Virtual memory management through the stub (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess, ...): mapped memory is device memory to kernels and copies, one allocation
// mapped twice is one memory, the calls CUDA refuses are refused, the physical memory is charged
// to the client and comes back when it is killed, and no other client reaches it.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <string>

namespace gpuproxy::testing {
namespace {

std::uint64_t deviceMemoryUsed(const Daemon& daemon) {
  return daemon.status()["devices"][0]["memory_used"].get<std::uint64_t>();
}

TEST(VirtualMemory, MappedMemoryIsDeviceMemoryAndTheRulesAreCudas) {
  Daemon daemon;
  const RunResult result = daemon.runClient("virtual_memory", {"run"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon.logs();
  EXPECT_NE(result.output.find("virtual_memory: PASSED"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("granularity 2097152"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("a kernel wrote across two mappings"), std::string::npos);
  EXPECT_NE(result.output.find("one allocation at two addresses"), std::string::npos);
  auto got = answers(result.output);
  for (const char* refused :
       {"cuMemcpyHtoD(before cuMemSetAccess)", "cuMemMap(over a mapping)",
        "cuMemMap(outside any reservation)", "cuMemMap(past the memory)", "cuMemMap(not granular)",
        "cuMemSetAccess(part of a mapping)", "cuMemUnmap(part of a mapping)",
        "cuMemAddressFree(still mapped)", "cuMemAddressFree(wrong size)",
        "cuMemCreate(not granular)", "cuMemRelease(unknown)", "cuMemcpyHtoD(unmapped)",
        "cuMemRelease(twice)"}) {
    EXPECT_EQ(got[refused], "CUDA_ERROR_INVALID_VALUE") << refused << "\n" << result.output;
  }
  EXPECT_EQ(got["cuMemCreate(fabric handle)"], "CUDA_ERROR_NOT_SUPPORTED") << result.output;
  EXPECT_EQ(got["cuMemCreate(no such device)"], "CUDA_ERROR_INVALID_DEVICE") << result.output;
  // Everything was given back.
  EXPECT_TRUE(eventually([&] { return deviceMemoryUsed(daemon) == 0; })) << daemon.status().dump(2);
}

// As cuCtxDestroy leaves memory made by cuMemCreate: a program that destroys the context its
// addresses and memory were made in still reads the memory, makes more with no context at all,
// and unmaps, releases and frees it all afterwards (NVIDIA's memMapIPCDrv sample destroys its
// context before it unmaps).
TEST(VirtualMemory, VirtualMemoryOutlivesTheContextItWasMadeIn) {
  Daemon daemon;
  const RunResult result = daemon.runClient("virtual_memory", {"outlive-context"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon.logs();
  EXPECT_NE(result.output.find("virtual memory outlived its context"), std::string::npos)
      << result.output;
  EXPECT_TRUE(eventually([&] { return deviceMemoryUsed(daemon) == 0; })) << daemon.status().dump(2);
}

// Physical memory exported to a file descriptor (cuMemExportToShareableHandle) and passed to two
// child processes: each imports it (cuMemImportFromShareableHandle), maps it at addresses of its
// own, reads what the parent wrote and writes what the parent then reads. One memory for three
// processes, charged once, given back once all have let go.
TEST(VirtualMemory, ExportedMemoryIsOneMemoryForEveryProcessThatImportsIt) {
  Daemon daemon;
  const RunResult result = daemon.runClient("virtual_memory", {"share", "2"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon.logs();
  EXPECT_NE(result.output.find("shared with 2 processes"), std::string::npos) << result.output;
  auto got = answers(result.output);
  EXPECT_EQ(got["cuMemExportToShareableHandle(fabric)"], "CUDA_ERROR_NOT_SUPPORTED")
      << result.output;
  EXPECT_EQ(got["cuMemExportToShareableHandle(not made for it)"], "CUDA_ERROR_INVALID_VALUE")
      << result.output;
  EXPECT_EQ(got["cuMemImportFromShareableHandle(another file)"], "CUDA_ERROR_INVALID_VALUE")
      << result.output;
  EXPECT_TRUE(eventually([&] { return deviceMemoryUsed(daemon) == 0; })) << daemon.status().dump(2);
}

TEST(VirtualMemory, PhysicalMemoryIsChargedAndComesBackWhenItsClientIsKilled) {
  Daemon daemon;
  constexpr std::uint64_t kHeld = 8 << 20;
  auto holder = daemon.startClient("virtual_memory", {"hold", std::to_string(kHeld)});
  std::string pointer;
  ASSERT_TRUE(eventually([&] {
    pointer = answers(holder->output())["pointer"];
    return !pointer.empty();
  })) << holder->output()
      << holder->errors() << daemon.logs();
  nlohmann::json status = daemon.status();
  ASSERT_EQ(status["clients"].size(), 1u);
  // The physical memory, and the test kernels' module.
  const std::uint64_t moduleBytes = status["clients"][0]["module_bytes"].get<std::uint64_t>();
  EXPECT_EQ(status["clients"][0]["memory_used"].get<std::uint64_t>(), kHeld + moduleBytes)
      << status.dump(2);
  EXPECT_EQ(deviceMemoryUsed(daemon), kHeld + moduleBytes);

  // Another client cannot reach it, by copy or by kernel.
  RunResult probe = daemon.runClient("error_probe", {"foreign-pointer", pointer});
  auto got = answers(probe.output);
  EXPECT_EQ(got["cuMemcpyDtoH(foreign)"], "CUDA_ERROR_INVALID_VALUE") << probe.output;
  EXPECT_EQ(got["cuMemcpyHtoD(foreign)"], "CUDA_ERROR_INVALID_VALUE") << probe.output;
  EXPECT_EQ(got["cuMemsetD8(foreign)"], "CUDA_ERROR_INVALID_VALUE") << probe.output;
  if (!chainedCudaBackend()) {
    // One CUDA context on a GPU could not stop the kernel (README, "What one shared context
    // isolates"); the sim does, as an illegal address that poisons the GPU for its clients.
    EXPECT_EQ(got["cuCtxSynchronize(after foreign kernel)"], "CUDA_ERROR_ILLEGAL_ADDRESS")
        << probe.output;
  }

  holder->signal(SIGKILL);
  EXPECT_EQ(holder->wait().signal, SIGKILL);
  EXPECT_TRUE(eventually([&] {
    nlohmann::json now = daemon.status();
    return now["devices"][0]["memory_used"].get<std::uint64_t>() == 0 &&
           now["devices"][0]["sticky_error"].is_null();
  })) << daemon.status().dump(2);
  // The daemon serves the next program as before.
  RunResult next = daemon.runClient("virtual_memory", {"run"});
  EXPECT_TRUE(next.status.exitedWith(0)) << next.output << next.errors << daemon.logs();
}

// Through gpuproxy no two devices are peers: memory of one GPU is not mapped where another GPU's
// context reserved the addresses, and no GPU is given access to another's memory.
TEST(VirtualMemory, NoDeviceReachesAnothersMemory) {
  Daemon::Options options;
  options.simDevices = 2;
  Daemon daemon(options);
  const RunResult result = daemon.runClient("virtual_memory", {"cross-device"});
  ASSERT_TRUE(result.status.exitedWith(0)) << result.output << result.errors << daemon.logs();
  auto got = answers(result.output);
  EXPECT_EQ(got["cuMemMap(memory of another device)"], "CUDA_ERROR_NOT_SUPPORTED") << result.output;
  EXPECT_EQ(got["cuMemSetAccess(from another device)"], "CUDA_ERROR_INVALID_DEVICE")
      << result.output;
  EXPECT_NE(daemon.log().find("no two devices are peers"), std::string::npos) << daemon.log();
  EXPECT_TRUE(eventually([&] {
    nlohmann::json status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["devices"][1]["memory_used"] == 0;
  })) << daemon.status().dump(2);
}

}  // namespace
}  // namespace gpuproxy::testing
