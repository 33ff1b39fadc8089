// CUDA runtime programs built by plain nvcc (tests/programs/cudart), unmodified, through the stub
// and a real daemon: cudart, linked statically (nvcc's default) and as a shared library, finds
// the stub as its libcuda.so.1, passes its integrity check, loads its fatbins through the
// export tables and the library API, and gets the results a GPU gives.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace gpuproxy::testing {
namespace {

// nvcc's binaries are not built under the sanitizer presets (they are not instrumented, and an
// instrumented stub cannot be loaded into them).
bool cudartProgramsBuilt() {
  return std::filesystem::exists(buildDir() + "/tests/programs/cudart_checks_static");
}

std::string describe(const RunResult& result, const Daemon& daemon) {
  return "stdout:\n" + result.output + "\nstderr:\n" + result.errors + "\ndaemon:\n" + daemon.log();
}

class CudartPrograms : public ::testing::TestWithParam<const char*> {
protected:
  void SetUp() override {
    if (!cudartProgramsBuilt()) GTEST_SKIP() << "nvcc-built programs are not part of this build";
  }
  // tests/programs/<name>_<static|shared>
  std::string program(const std::string& name) const { return name + "_" + GetParam(); }
  // Runs `cudart_checks <mode>` against a daemon of two sim GPUs; the check passes.
  void checkOnTwoDevices(const std::string& mode, const std::string& expected) {
    Daemon::Options options;
    options.simDevices = 2;
    Daemon daemon(options);
    RunResult result = daemon.runClient(program("cudart_checks"), {mode});
    ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
    EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(mode + ": PASSED"), std::string::npos) << result.output;
  }
};

TEST_P(CudartPrograms, DeviceQueryAgreesWithStatus) {
  Daemon::Options options;
  options.simDevices = 2;
  Daemon daemon(options);
  RunResult result = daemon.runClient(program("cudart_checks"), {"device-query"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  const nlohmann::json status = daemon.status();
  EXPECT_NE(
      result.output.find("devices 2 driver " + std::to_string(status["driver_version"].get<int>())),
      std::string::npos)
      << result.output;
  for (const auto& device : status["devices"]) {
    const std::string line =
        "device " + std::to_string(device["index"].get<int>()) + " name=\"" +
        device["name"].get<std::string>() +
        "\" compute=" + device["compute_capability"].get<std::string>() +
        " sms=132 memory=" + std::to_string(device["memory_total"].get<std::uint64_t>());
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

TEST_P(CudartPrograms, EverydayRuntimeCallsGiveTheGpusResults) {
  Daemon daemon;
  for (const char* mode : {"vectors", "streams", "pinned", "symbols", "malloc-async", "memory-pool",
                           "copies-3d", "hints"}) {
    RunResult result = daemon.runClient(program("cudart_checks"), {mode});
    EXPECT_TRUE(result.status.exitedWith(0)) << mode << "\n" << describe(result, daemon);
    EXPECT_NE(result.output.find(std::string(mode) + ": PASSED"), std::string::npos)
        << result.output;
  }
  // Everything each program held came back when it exited.
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 &&
           status["devices"][0]["memory_kept_for_importers"] == 0 && status["clients"].empty();
  }));
}

TEST_P(CudartPrograms, ResourceLimitsReachTheDevice) {
  // A daemon of its own: on the cuda backend every client shares one context, whose heap is fixed
  // once any client's module that calls malloc has been loaded.
  Daemon daemon;
  RunResult result = daemon.runClient(program("cudart_checks"), {"limits"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("heap blocks 32 x 1048576 bytes, recursion 181 deep"),
            std::string::npos)
      << result.output;
  // The heap was the client's memory, and came back with it.
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  }));
}

TEST_P(CudartPrograms, SeveralDevicesThreadsAndADeviceReset) {
  checkOnTwoDevices("devices", "2 devices, reset, 4 threads");
}

TEST_P(CudartPrograms, CopiesBetweenDevicesGoThroughTheHostWithoutPeerAccess) {
  checkOnTwoDevices("peer-copies", "a pool of device 1 allocated from");
}

// cudaStreamWaitEvent across devices: the stream of one GPU is held until the other GPU's stream
// has reached the record (the program holds that stream with a host function and checks).
TEST_P(CudartPrograms, AStreamWaitsForAnotherDevicesEvent) {
  if (rpcTransport()) {
    GTEST_SKIP() << "over RPC a host function runs in the call itself: none can hold a stream";
  }
  checkOnTwoDevices("cross-device-events", "device 1 waited for device 0's events");
}

// A program's more urgent stream gets its kernel run before the blocks still waiting of a less
// urgent kernel it launched earlier: the scheduler lets it reach the device beside that kernel,
// and the device runs it first.
TEST_P(CudartPrograms, AMoreUrgentStreamsKernelGoesBeforeALessUrgentKernelsWaitingBlocks) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("stream_priorities"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("stream_priorities: PASSED"), std::string::npos) << result.output;
}

TEST_P(CudartPrograms, ThrustAlgorithmsGiveTheHostsResults) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("thrust_algorithms"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("thrust_algorithms: PASSED"), std::string::npos) << result.output;
}

TEST_P(CudartPrograms, AsynchronousCopiesToSharedMemoryGiveTheHostsResults) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("async_copies"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("async-copies: PASSED"), std::string::npos) << result.output;
}

TEST_P(CudartPrograms, TensorCoreTilesGiveTheHostsProducts) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("tensor_cores"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("tensor-cores: PASSED"), std::string::npos) << result.output;
}

TEST_P(CudartPrograms, ACooperativeGridSynchronisesAsAWhole) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("cooperative"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("cooperative: PASSED"), std::string::npos) << result.output;
}

TEST_P(CudartPrograms, ThreadBlockTilesOfSeveralWarpsGiveTheHostsResults) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("thread_groups"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("thread-groups: PASSED"), std::string::npos) << result.output;
}

// Texture and surface objects over CUDA arrays, linear and pitched memory: what each fetch, gather
// and surface load or store gives is what the program computes on the host.
TEST_P(CudartPrograms, TexturesAndSurfacesGiveTheHostsResults) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("textures"));
  if (chainedCudaBackend()) {
    // Texture and surface objects are headers the sim's texture unit reads in the client's
    // memory; on a GPU they would be the driver's, made by the daemon, which makes none. Arrays
    // are memory, and are served.
    EXPECT_TRUE(result.status.exitedWith(1)) << describe(result, daemon);
    EXPECT_NE(result.output.find("arrays: 2D, array to array"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("cudaCreateTextureObject"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("returned cudaErrorNotSupported"), std::string::npos)
        << result.output;
  } else {
    ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
    EXPECT_NE(result.output.find("cube maps: 864 directions on every face"), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("textures: PASSED"), std::string::npos) << result.output;
  }
  // The arrays, textures and surfaces the program held came back when it exited.
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
}

// cuBLAS keys its state by the context and the stream, which it learns through the driver's
// private tables (TOOLS_TLS, CONTEXT_INTERNALS): without them its reductions fail.
TEST_P(CudartPrograms, CuBlasRoutinesGiveTheHostsResults) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("cublas_routines"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("on a stream of its own: as on the host"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("cublas_routines: PASSED"), std::string::npos) << result.output;
}

// cuBLAS's GEMMs are machine code for compute capability 9.0, but some of them are PTX for 10.0:
// on a sim device that says it is 10.0, sgemm and its strided batches give the host's answers.
TEST_P(CudartPrograms, CuBlasSgemmRunsOnADeviceOfTheComputeCapabilityItsPtxWasBuiltFor) {
  Daemon::Options options;
  options.extraArguments = {"--sim-compute-capability", "10.0"};
  Daemon daemon(options);
  RunResult result = daemon.runClient(program("cublas_gemm"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line :
       {"sgemm 128 x 128 x 128, a batch of 1: as on the host",
        "sgemm 100 x 37 x 300, a batch of 1: as on the host",
        "sgemm 32 x 48 x 64, a batch of 4: as on the host", "cublas_gemm: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

// cuSPARSE ships PTX only for the newest GPUs: a sim device that says it is one (compute
// capability 12.0) runs the kernels cuSPARSE picks for it as they were built, and a
// conjugate-gradient solve with cuBLAS converges to the host's answer.
TEST_P(CudartPrograms, CuSparseSolvesOnADeviceOfTheComputeCapabilityItsPtxWasBuiltFor) {
  Daemon::Options options;
  options.extraArguments = {"--sim-compute-capability", "12.0"};
  Daemon daemon(options);
  RunResult result = daemon.runClient(program("cusparse_spmv"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("SpMV of a 1000 x 1000 CSR matrix with 2998 non-zeros: as on the "
                               "host"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("cusparse_spmv: PASSED"), std::string::npos) << result.output;
}

TEST_P(CudartPrograms, CuRandGeneratesOnTheDevice) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("curand_uniform"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("curand_uniform: PASSED"), std::string::npos) << result.output;
}

TEST_P(CudartPrograms, DependentLaunchesSeeTheirProducersResults) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("dependent_launch"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("dependent_launch: PASSED"), std::string::npos) << result.output;
}

TEST_P(CudartPrograms, AnImpossibleLaunchIsReportedAndCleared) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("cudart_checks"), {"bad-launch"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("refused with cudaError"), std::string::npos) << result.output;
}

TEST_P(CudartPrograms, TheTenantsMemoryLimitIsCudaErrorMemoryAllocation) {
  Daemon daemon;
  ASSERT_TRUE(daemon.ctl({"set-limit", "default", "--memory", "64MiB"}).status.exitedWith(0));
  RunResult result =
      daemon.runClient(program("cudart_checks"), {"out-of-memory", std::to_string(128 << 20)});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("returned cudaErrorMemoryAllocation"), std::string::npos);
}

TEST_P(CudartPrograms, AKilledProgramsMemoryComesBack) {
  Daemon daemon;
  auto holder = daemon.startClient(program("cudart_checks"), {"hold", std::to_string(32 << 20)});
  ASSERT_TRUE(eventually([&] { return holder->output().find("holding") != std::string::npos; }))
      << holder->output() << holder->errors() << daemon.log();
  EXPECT_GE(daemon.status()["devices"][0]["memory_used"].get<std::uint64_t>(), 32u << 20);
  ::kill(holder->pid(), SIGKILL);
  holder->wait();
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
  // The daemon serves the next program as before.
  RunResult after = daemon.runClient(program("cudart_checks"), {"vectors"});
  EXPECT_TRUE(after.status.exitedWith(0)) << describe(after, daemon);
}

// A program killed while a stream of one GPU waits for another GPU's event that will never come:
// both GPUs get their memory back and drop its held work, and the next program's waits work.
TEST_P(CudartPrograms, AProgramKilledWhileWaitingForAnotherDevicesEventLeavesNothingBehind) {
  if (rpcTransport()) {
    GTEST_SKIP() << "over RPC a host function runs in the call itself: none can hold a stream";
  }
  Daemon::Options options;
  options.simDevices = 2;
  Daemon daemon(options);
  auto holder = daemon.startClient(program("cudart_checks"), {"hold-cross-device"});
  ASSERT_TRUE(eventually([&] { return holder->output().find("holding") != std::string::npos; }))
      << holder->output() << holder->errors() << daemon.log();
  auto status = daemon.status();
  for (int device : {0, 1}) {
    EXPECT_GE(status["devices"][device]["memory_used"].get<std::uint64_t>(), 4u << 20)
        << status.dump(2);
  }
  ::kill(holder->pid(), SIGKILL);
  holder->wait();
  EXPECT_TRUE(eventually([&] {
    auto now = daemon.status();
    return now["devices"][0]["memory_used"] == 0 && now["devices"][1]["memory_used"] == 0 &&
           now["clients"].empty();
  })) << daemon.status().dump(2);
  RunResult after = daemon.runClient(program("cudart_checks"), {"cross-device-events"});
  EXPECT_TRUE(after.status.exitedWith(0)) << describe(after, daemon);
}

TEST_P(CudartPrograms, AFatbinForSeveralGpusRunsTheNewestPtxTheSimCanRun) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("multi_arch"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  // compute_90 PTX: sm_75/sm_90 machine code cannot run on the sim, compute_100 is too new.
  EXPECT_NE(result.output.find("sum 499500, code for compute 900"), std::string::npos)
      << result.output;
}

TEST_P(CudartPrograms, MachineCodeWithoutPtxIsNoKernelImageAndTheDaemonCarriesOn) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("machine_code_only"));
  EXPECT_TRUE(result.status.exitedWith(1)) << describe(result, daemon);
  EXPECT_NE(result.output.find("cudaErrorNoKernelImageForDevice"), std::string::npos)
      << result.output;
  if (!chainedCudaBackend()) {  // the sim's account, in the upstream daemon's log
    EXPECT_NE(daemon.log().find("no PTX entry for sm_90; the fatbin holds: sm_90 (ELF)"),
              std::string::npos)
        << daemon.log();
  }
  RunResult after = daemon.runClient(program("multi_arch"));
  EXPECT_TRUE(after.status.exitedWith(0)) << describe(after, daemon);
}

// cudaMallocManaged memory lives in the client's shared pinned heap, which gpuproxyd maps at the
// same address and registers with the GPUs: the host and kernels share it, copies and memsets
// name it, and it is charged to the tenant's pinned memory.
TEST_P(CudartPrograms, ManagedMemoryIsSharedByTheHostAndKernels) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("managed_memory"), {"saxpy"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("saxpy max error 0"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("saxpy: PASSED"), std::string::npos) << result.output;
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return tenantNamed(status, "default")["pinned_memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
}

// __managed__ variables: cudart asks for them (cuLibraryGetManaged) before any context exists;
// each gets managed memory of its own to which the daemon moves it, so the host reads and writes
// it by name where the kernels use it.
TEST_P(CudartPrograms, ManagedVariablesAreSharedByTheHostAndKernels) {
  if (chainedCudaBackend()) {
    GTEST_SKIP() << "the cuda backend cannot move a managed variable into the client's memory: "
                    "the driver places it in gpuproxyd's own process";
  }
  Daemon daemon;
  RunResult result = daemon.runClient(program("managed_variables"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("counter 356, samples[255] 127.5"), std::string::npos)
      << result.output;
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return tenantNamed(status, "default")["pinned_memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
}

// Past the pinned heap's room, or without a heap at all, each allocation is shared memory of its
// own that gpuproxyd maps at the same address.
TEST_P(CudartPrograms, ManagedMemoryNeedsNoRoomInThePinnedHeap) {
  Daemon daemon;
  RunResult large =
      daemon.runClientOn(daemon.socketPath(), program("managed_memory"),
                         {"large", std::to_string(48 << 20)}, {{"GPUPROXY_PINNED_HEAP", "8MiB"}});
  ASSERT_TRUE(large.status.exitedWith(0)) << describe(large, daemon);
  EXPECT_NE(large.output.find("50331648 managed bytes doubled"), std::string::npos) << large.output;
  RunResult overRpc = daemon.runClientOn(daemon.socketPath(), program("managed_memory"), {"saxpy"},
                                         {{"GPUPROXY_TRANSPORT", "rpc"}});
  ASSERT_TRUE(overRpc.status.exitedWith(0)) << describe(overRpc, daemon);
  EXPECT_NE(overRpc.output.find("saxpy: PASSED"), std::string::npos) << overRpc.output;
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return tenantNamed(status, "default")["pinned_memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
}

TEST_P(CudartPrograms, ManagedMemoryCountsAgainstThePinnedMemoryLimit) {
  Daemon daemon;
  ASSERT_TRUE(
      daemon.ctl({"set-limit", "default", "--pinned-memory", "16MiB"}).status.exitedWith(0));
  RunResult result =
      daemon.runClient(program("managed_memory"), {"over-limit", std::to_string(64 << 20)});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("returned cudaErrorMemoryAllocation"), std::string::npos)
      << result.output;
}

TEST_P(CudartPrograms, AKilledProgramsManagedMemoryComesBack) {
  Daemon daemon;
  // One allocation in the pinned heap, one (larger than the heap) of its own.
  auto inHeap = daemon.startClient(program("managed_memory"), {"hold", std::to_string(24 << 20)});
  auto ownMapping =
      daemon.startClientOn(daemon.socketPath(), program("managed_memory"),
                           {"hold", std::to_string(40 << 20)}, {{"GPUPROXY_PINNED_HEAP", "8MiB"}});
  for (auto* holder : {inHeap.get(), ownMapping.get()}) {
    ASSERT_TRUE(eventually([&] { return holder->output().find("holding") != std::string::npos; }))
        << holder->output() << holder->errors() << daemon.log();
  }
  EXPECT_GE(tenantNamed(daemon.status(), "default")["pinned_memory_used"].get<std::uint64_t>(),
            64u << 20);
  for (auto* holder : {inHeap.get(), ownMapping.get()}) {
    ::kill(holder->pid(), SIGKILL);
    holder->wait();
  }
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return tenantNamed(status, "default")["pinned_memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
}

// Stream capture records the work instead of running it; each launch of the graph runs it all
// again, reading the pinned input as it is then.
TEST_P(CudartPrograms, ACapturedGraphRunsEachTimeItIsLaunched) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"capture"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("graph of 5 nodes"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("3 launches, host function called 3 times"), std::string::npos)
      << result.output;
}

// The graph a capture builds is the application's to add to while the capture lasts: a node added
// by hand, made the stream's dependency, runs between the captured kernels around it.
TEST_P(CudartPrograms, NodesAddedToACaptureInProgressRunWhereTheyWereAdded) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"capture-graph"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line :
       {"captured graph of 6 nodes, one added by hand",
        "2 launches: the added node ran between the captured kernels",
        "refusals: cudaErrorInvalidValue, cudaErrorInvalidValue, cudaErrorIllegalState",
        "capture-graph: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

// A graph's structure reads back as it was built and changes as asked; a child graph node runs its
// own copy of the graph it was given.
TEST_P(CudartPrograms, AGraphsStructureReadsBackAndChildGraphsRunTheirCopy) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"structure"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line : {"structure: 1 root, 4 edges, a child graph of 3 nodes",
                           "child graph: x = 2i at each launch, the original's new node not in it",
                           "structure: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

// A node destroyed leaves the graph with its edges, and the graph runs without it; what was made
// from the graph before (an executable graph, a clone) keeps it, and the clone's copy of each
// node is found from the original's handle.
TEST_P(CudartPrograms, ADestroyedGraphNodeIsGoneFromItsGraphButNotFromItsClone) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"destroy-node"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line :
       {"destroy-node: 3 nodes, 2 roots and 1 edge left",
        "destroy-node: the graph runs without it, an executable graph made before with it",
        "destroy-node: a clone made before keeps it, found in the clone",
        "destroy-node: a child node's graph goes with it; the refusals", "destroy-node: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

// A kernel node's launch attributes read back as set, survive new parameters and copy to another
// node; cooperative kernel nodes run; what no device here can honour is refused.
TEST_P(CudartPrograms, KernelNodeAttributesReadBackAndCooperativeNodesRun) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"kernel-attributes"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line :
       {"kernel-attributes: priority, access policy window and cooperative read back",
        "kernel-attributes: kept by new parameters, copied, launched: x = 3i",
        "kernel-attributes: the refusals", "kernel-attributes: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

// A captured graph's nodes read back their parameters; changed in the executable graph (or in
// the graph, then taken over by an update), the next launch does what they now say.
TEST_P(CudartPrograms, GraphNodeParametersReadBackAndChangeWhatTheNextLaunchDoes) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"params"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line : {"params: memset, copy and kernel read back",
                           "params: executable graph changed, memset 1.0, kernel off and on",
                           "params: graph changed and taken over by an update", "params: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

// A user object lives as long as a reference to it: the program's, a graph's, an executable
// graph's until its last launch has run.
TEST_P(CudartPrograms, UserObjectsLiveAsLongAsTheGraphsThatMayStillUseThem) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"user-objects"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line :
       {"user object: destroyed after the last launch ran",
        "user object: counts kept, refusals cudaErrorInvalidValue, cudaErrorInvalidValue",
        "user-objects: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

// Event record and wait nodes, built or captured: a launch waits for an event recorded outside
// the graph (as of that launch) and records one of its own.
TEST_P(CudartPrograms, GraphEventNodesWaitForAndRecordEvents) {
  if (rpcTransport()) {
    GTEST_SKIP() << "over RPC a host function runs in the call itself: none can hold a stream";
  }
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"event-nodes"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line : {"event nodes: waited for 42, 43 and 7",
                           "event nodes: captured as wait, kernel, record; waited for 99",
                           "event nodes: refusals cudaErrorInvalidValue, cudaErrorInvalidValue",
                           "event-nodes: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

// A graph built node by node runs its nodes in dependency order; an executable graph takes new
// kernel arguments, and an update from a graph of the same shape.
TEST_P(CudartPrograms, AGraphBuiltNodeByNodeRunsAndUpdates) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"nodes"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line :
       {"graph of 6 nodes", "4 launches, scaled by 2, 3, 5 and 5",
        "update from another shape: cudaErrorGraphExecUpdateFailure, result 2", "nodes: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

// Memory nodes: an allocation captured or added keeps its address at every launch, lives until
// freed (in the graph, by the program, or by another graph), and comes back to the tenant when
// the graphs are gone.
TEST_P(CudartPrograms, GraphMemoryNodesAllocateAndFreeAsCudaSays) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"memory"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line :
       {"captured graph of 6 nodes: 1 alloc, 1 free", "captured: 3 launches at one address",
        "launch while its allocation is live: cudaErrorInvalidValue",
        "kept: freed by the program, then by another graph", "auto free on launch: launched twice",
        "graph memory given back", "memory: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
}

// Conditional nodes: if (with and without else), while and switch, decided by the graph's own
// kernels. The cuda backend's driver keeps conditional values itself, so there the handle is
// refused (the program says so and exits 3).
TEST_P(CudartPrograms, ConditionalNodesRunTheBodyTheirKernelsChoose) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"conditional"});
  if (chainedCudaBackend()) {
    ASSERT_TRUE(result.status.exitedWith(3)) << describe(result, daemon);
    EXPECT_NE(result.output.find("conditional handles: cudaErrorNotSupported"), std::string::npos)
        << result.output;
    return;
  }
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line :
       {"if/else: then, else, then", "while: 5 runs, then none",
        "while with a captured body: 3 runs at each launch",
        "while added to a capture in progress: 4 runs, then the captured kernel",
        "switch: case 2, case 0, no case",
        "refusals: cudaErrorInvalidValue, cudaErrorInvalidValue, cudaErrorInvalidValue",
        "conditional: PASSED"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
  // Each handle's value was device memory of the client's: none stays charged once it is gone.
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
}

TEST_P(CudartPrograms, WhatCaptureCannotHoldIsRefusedAsCudaRefusesIt) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("graphs"), {"capture-errors"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  for (const char* line : {"synchronize during capture: cudaErrorStreamCaptureUnsupported",
                           "end of an invalidated capture: cudaErrorStreamCaptureInvalidated",
                           "end with an unjoined stream: cudaErrorStreamCaptureUnjoined"}) {
    EXPECT_NE(result.output.find(line), std::string::npos) << line << "\n" << result.output;
  }
}

// Interprocess handles (cudaIpc*): a process and its child share an allocation and an event, with
// the refusals CUDA gives on the way (ipc_sharing.cu); everything comes back when both have gone.
TEST_P(CudartPrograms, ProcessesShareMemoryAndEventsByInterprocessHandles) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("ipc_sharing"));
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("child: PASSED"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("share: PASSED"), std::string::npos) << result.output;
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
}

// A memory pool shared by file descriptor (cudaMemPoolExportToShareableHandle) and one of its
// allocations by exported pointer: the child imports both, works on the memory, and gives the
// import back with cudaFreeAsync.
TEST_P(CudartPrograms, ProcessesShareAMemoryPoolByFileDescriptor) {
  Daemon daemon;
  RunResult result = daemon.runClient(program("ipc_sharing"), {"pool"});
  ASSERT_TRUE(result.status.exitedWith(0)) << describe(result, daemon);
  EXPECT_NE(result.output.find("pool child: PASSED"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("pool: PASSED"), std::string::npos) << result.output;
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
}

namespace {

// The handle `ipc_sharing export` printed, once it has.
std::string exportedHandle(const Child& exporter) {
  std::string handle;
  eventually([&] {
    const std::string output = exporter.output();
    const std::size_t at = output.find("handle ");
    const std::size_t end = output.find('\n', at);
    if (at == std::string::npos || end == std::string::npos) return false;
    handle = output.substr(at + 7, end - at - 7);
    return true;
  });
  return handle;
}

}  // namespace

// An exporter killed while another process has its memory open: the memory stays the importer's,
// with the exporter's data, until it is closed; then it is freed, and the handle opens no more.
TEST_P(CudartPrograms, InterprocessMemoryOutlivesAKilledExporterUntilClosed) {
  Daemon daemon;
  TempDir directory;
  const std::string go = directory.file("go");
  auto exporter = daemon.startClient(program("ipc_sharing"), {"export", directory.file("never")});
  const std::string handle = exportedHandle(*exporter);
  ASSERT_FALSE(handle.empty()) << exporter->output() << exporter->errors() << daemon.log();
  auto importer = daemon.startClient(program("ipc_sharing"), {"import", handle, go});
  ASSERT_TRUE(eventually([&] { return importer->output().find("opened") != std::string::npos; }))
      << importer->output() << importer->errors() << daemon.log();

  exporter->signal(SIGKILL);
  exporter->wait();
  ASSERT_TRUE(eventually([&] { return daemon.status()["clients"].size() == 1; }))
      << daemon.status().dump(2);
  const nlohmann::json device = daemon.status()["devices"][0];
  EXPECT_GT(device["memory_used"].get<std::uint64_t>(), 0u)
      << "the memory went with its exporter while another process had it open";
  // Status says whose it is now: nobody's but the importers'.
  EXPECT_EQ(device["memory_kept_for_importers"], device["memory_used"]) << device.dump(2);
  EXPECT_NE(daemon.ctl({"status"}).output.find("kept for processes that opened it"),
            std::string::npos);

  std::ofstream(go).close();
  const ExitStatus imported = importer->wait();
  EXPECT_TRUE(imported.exitedWith(0)) << importer->output() << importer->errors() << daemon.log();
  EXPECT_NE(importer->output().find("import: PASSED"), std::string::npos) << importer->output();
  EXPECT_TRUE(eventually([&] {
    auto status = daemon.status();
    return status["devices"][0]["memory_used"] == 0 && status["clients"].empty();
  })) << daemon.status().dump(2);
  RunResult late = daemon.runClient(program("ipc_sharing"), {"import", handle});
  EXPECT_TRUE(late.status.exitedWith(2)) << describe(late, daemon);
  EXPECT_NE(late.output.find("open: cudaErrorInvalidValue"), std::string::npos) << late.output;
}

// A handle is only good within its tenant: another tenant's process opening it gets what a made-up
// handle gets, and the exporter's memory is untouched.
TEST_P(CudartPrograms, AnotherTenantCannotOpenAnInterprocessHandle) {
  TempDir directory;
  const std::string config = directory.file("tenants.yaml");
  const std::string otherSocket = directory.file("other/gpuproxy.sock");
  std::ofstream(config) << "tenants:\n  - name: other\n    socket: " << otherSocket << "\n";
  Daemon::Options options;
  options.extraArguments = {"--config", config};
  Daemon daemon(options);
  const std::string go = directory.file("go");
  auto exporter = daemon.startClient(program("ipc_sharing"), {"export", go});
  const std::string handle = exportedHandle(*exporter);
  ASSERT_FALSE(handle.empty()) << exporter->output() << exporter->errors() << daemon.log();

  RunResult other = daemon.runClientOn(otherSocket, program("ipc_sharing"), {"import", handle});
  EXPECT_TRUE(other.status.exitedWith(2)) << describe(other, daemon);
  EXPECT_NE(other.output.find("open: cudaErrorInvalidValue"), std::string::npos) << other.output;
  // A process of the exporter's own tenant opens it, and finds the exporter's data.
  RunResult same = daemon.runClient(program("ipc_sharing"), {"import", handle});
  EXPECT_TRUE(same.status.exitedWith(0)) << describe(same, daemon);
  EXPECT_NE(same.output.find("import: PASSED"), std::string::npos) << same.output;

  std::ofstream(go).close();
  EXPECT_TRUE(exporter->wait().exitedWith(0)) << exporter->output() << exporter->errors();
}

INSTANTIATE_TEST_SUITE_P(StaticAndSharedCudart, CudartPrograms,
                         ::testing::Values("static", "shared"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace gpuproxy::testing
