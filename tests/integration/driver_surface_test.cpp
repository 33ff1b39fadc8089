// The driver calls around launches and copies, end to end through the stub and a sim daemon
// (tests/programs/driver_surface.cpp): function and kernel attributes, the occupancy calculator,
// pointer attributes, 2D copies, host functions on streams, cuLaunchKernelEx, stream queries and
// managed memory.
// Also run with GPUPROXY_TRANSPORT=rpc.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>

namespace gpuproxy::testing {
namespace {

class DriverSurface : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    Daemon daemon;
    RunResult result = daemon.runClient("driver_surface");
    output_ = result.output;
    errors_ = result.errors + daemon.log();
    exitedCleanly_ = result.status.exitedWith(0);
  }
  void SetUp() override {
    ASSERT_TRUE(exitedCleanly_) << output_ << errors_;
    got_ = answers(output_);
  }
  // Every check in `expected` got the expected answer.
  void expectAnswers(const std::map<std::string, std::string>& expected) {
    for (const auto& [check, value] : expected) {
      EXPECT_EQ(got_[check], value) << check << "\n" << output_;
    }
  }

  static inline std::string output_;
  static inline std::string errors_;
  static inline bool exitedCleanly_ = false;
  std::map<std::string, std::string> got_;
};

TEST_F(DriverSurface, FunctionAttributesDescribeTheKernelOnTheDevice) {
  expectAnswers({{"attr-max-threads", "1024"},
                 {"attr-shared", "0"},
                 {"attr-carveout", "-1"},
                 {"attr-max-dynamic-default", "yes"},
                 {"attr-bad", "CUDA_ERROR_INVALID_VALUE"},
                 {"attr-null-function", "CUDA_ERROR_INVALID_HANDLE"},
                 {"func-name", "fill_u32"},
                 {"func-module", "CUDA_SUCCESS"},
                 {"func-module-is-its-module", "yes"},
                 {"func-module-null-function", "CUDA_ERROR_INVALID_VALUE"},
                 {"param-0", "0+8"},
                 {"param-1", "8+4"},
                 {"param-2", "16+8"},
                 {"param-out-of-range", "CUDA_ERROR_INVALID_VALUE"},
                 {"cache-config", "CUDA_SUCCESS"},
                 {"shared-config", "CUDA_SUCCESS"}});
  EXPECT_EQ(got_["attr-binary-version"], got_["device-cc"]);
  // Mapped pinned memory needs the pinned heap, which only the shared-memory transport has.
  EXPECT_EQ(got_["can-map-host-memory"], rpcTransport() ? "0" : "1");
  EXPECT_GT(std::stoi(got_["attr-num-regs"]), 0);
}

TEST_F(DriverSurface, OptingIntoMoreDynamicSharedMemoryAllowsTheLaunch) {
  expectAnswers({{"launch-large-shared-before", "CUDA_ERROR_INVALID_VALUE"},
                 {"set-max-dynamic", "CUDA_SUCCESS"},
                 {"attr-max-dynamic-set", "65536"},
                 {"launch-large-shared-after", "CUDA_SUCCESS"},
                 {"launch-large-shared-sync", "CUDA_SUCCESS"},
                 {"launch-over-set", "CUDA_ERROR_INVALID_VALUE"},
                 {"set-max-dynamic-over-optin", "CUDA_ERROR_INVALID_VALUE"},
                 {"set-carveout", "CUDA_SUCCESS"},
                 {"set-carveout-bad", "CUDA_ERROR_INVALID_VALUE"},
                 {"set-read-only", "CUDA_ERROR_INVALID_VALUE"},
                 {"set-cluster", "CUDA_ERROR_NOT_SUPPORTED"},
                 {"set-non-portable-cluster", "CUDA_SUCCESS"},
                 {"attr-non-portable-cluster", "1"}});
}

// The sim reports an H100-like SM: 2048 threads, 32 blocks, 64K registers, 228 KiB of shared
// memory (1 KiB reserved per block), 132 SMs.
TEST_F(DriverSurface, OccupancyFollowsTheDeviceLimits) {
  expectAnswers({{"occupancy-256", "8"},
                 {"occupancy-256-expected", "yes"},
                 {"occupancy-128-40000", "5"},
                 {"occupancy-128-40000-expected", "yes"},
                 {"occupancy-over-dynamic-limit", "0"},
                 {"occupancy-zero-block", "CUDA_ERROR_INVALID_VALUE"},
                 {"occupancy-bad-flags", "CUDA_ERROR_INVALID_VALUE"},
                 {"clusters-of-one-fill-the-device", "yes"},
                 {"clusters-of-two", "0"},
                 {"potential-cluster-size", "1"},
                 {"limit-stack", "1024"},
                 {"limit-keep-stack", "CUDA_SUCCESS"},
                 {"limit-grow-heap", "CUDA_SUCCESS"},
                 {"limit-heap-mib", "64"},
                 {"limit-l2-fetch-granularity", "128"},
                 {"limit-cig-enabled", "0"},
                 {"limit-set-cig-enabled", "CUDA_ERROR_INVALID_VALUE"},
                 {"limit-set-unknown", "CUDA_ERROR_UNSUPPORTED_LIMIT"},
                 {"limit-unknown", "CUDA_ERROR_UNSUPPORTED_LIMIT"},
                 {"potential-block", "1024"},
                 {"potential-grid", "264"},
                 {"potential-callback-grid-consistent", "yes"},
                 {"potential-callback-best", "yes"},
                 {"potential-limited-block", "64"},
                 {"available-dynamic-fits", "yes"},
                 {"available-dynamic-tight", "yes"},
                 {"available-dynamic-too-many", "CUDA_ERROR_INVALID_VALUE"}});
}

TEST_F(DriverSurface, KernelsAnswerForTheirFunctionOnADevice) {
  expectAnswers({{"kernel-get-attribute", "CUDA_SUCCESS"},
                 {"kernel-attribute-matches", "yes"},
                 {"kernel-bad-device", "CUDA_ERROR_INVALID_DEVICE"},
                 {"kernel-set-attribute", "CUDA_SUCCESS"},
                 {"kernel-max-dynamic", "81920"},
                 {"kernel-cache-config", "CUDA_SUCCESS"},
                 {"kernel-param-2", "16+8"},
                 {"kernel-occupancy", "CUDA_SUCCESS"},
                 {"kernel-occupancy-positive", "yes"},
                 {"kernel-as-function-attribute", "CUDA_SUCCESS"}});
}

TEST_F(DriverSurface, PointerAttributesOfDeviceAndPinnedMemory) {
  expectAnswers({{"device-memory-type", "2"},
                 {"device-context", "yes"},
                 {"device-ordinal", "0"},
                 {"device-range-start", "yes"},
                 {"device-range-size", "1048576"},
                 {"device-device-pointer", "yes"},
                 {"device-host-pointer", "CUDA_ERROR_INVALID_VALUE"},
                 {"device-buffer-ids-differ", "yes"},
                 {"device-managed", "0"},
                 {"device-mapped", "1"},
                 {"address-range", "yes"},
                 {"sync-memops-set", "CUDA_SUCCESS"},
                 {"sync-memops-reads-back", "yes"},
                 {"set-other-attribute", "CUDA_ERROR_INVALID_VALUE"},
                 {"attributes-device", "CUDA_SUCCESS"},
                 {"attributes-device-values", "yes"},
                 {"host-memory-type", "1"},
                 {"host-host-pointer", "yes"},
                 {"host-flags", "CUDA_SUCCESS"},
                 {"host-flags-value", "1"},  // CU_MEMHOSTALLOC_PORTABLE
                 {"host-flags-pageable", "CUDA_ERROR_INVALID_VALUE"},
                 {"host-flags-freed", "CUDA_ERROR_INVALID_VALUE"},
                 {"host-range-start", "yes"},
                 {"host-context", "yes"},
                 {"host-ordinal", "0"},
                 {"freed-host-memory-type", "CUDA_ERROR_INVALID_VALUE"},
                 {"freed-device-memory-type", "CUDA_ERROR_INVALID_VALUE"}});
}

// cuPointerGetAttributes succeeds for memory CUDA does not know, which cudaPointerGetAttributes
// relies on to report cudaMemoryTypeUnregistered.
// Managed memory: from the shared pinned heap, or (over RPC, which has no heap) shared memory of
// the allocation's own; the same either way.
TEST_F(DriverSurface, ManagedMemoryAndItsHints) {
  expectAnswers({{"managed-zero-bytes", "CUDA_ERROR_INVALID_VALUE"},
                 {"managed-bad-flags", "CUDA_ERROR_INVALID_VALUE"},
                 {"managed-attribute", "1"},
                 {"managed-alloc", "CUDA_SUCCESS"},
                 {"managed-kernel-and-host-agree", "yes"},
                 {"managed-is-managed", "1"},
                 {"managed-host-pointer", "yes"},
                 {"managed-prefetch", "CUDA_SUCCESS"},
                 {"managed-prefetch-host", "CUDA_SUCCESS"},
                 {"managed-prefetch-no-device", "CUDA_ERROR_INVALID_DEVICE"},
                 {"managed-prefetch-past-end", "CUDA_ERROR_INVALID_VALUE"},
                 {"managed-prefetch-device-memory", "CUDA_ERROR_INVALID_VALUE"},
                 {"managed-advise", "CUDA_SUCCESS"},
                 {"managed-advise-unknown", "CUDA_ERROR_INVALID_VALUE"},
                 {"managed-advise-device-memory", "CUDA_ERROR_INVALID_VALUE"},
                 {"managed-attach", "CUDA_SUCCESS"},
                 {"managed-attach-part", "CUDA_ERROR_INVALID_VALUE"},
                 {"managed-attach-inside", "CUDA_ERROR_INVALID_VALUE"},
                 {"managed-free-host", "CUDA_ERROR_INVALID_VALUE"},
                 {"managed-free-inside", "CUDA_ERROR_INVALID_VALUE"},
                 {"managed-free", "CUDA_SUCCESS"},
                 {"managed-freed-prefetch", "CUDA_ERROR_INVALID_VALUE"}});
}

// Capture keeps the work instead of running it; each launch runs it again.
TEST_F(DriverSurface, ACapturedGraphRunsAtEachLaunch) {
  expectAnswers({{"capture-begin", "CUDA_SUCCESS"},
                 {"capture-status", "1"},
                 {"capture-id", "yes"},
                 {"capture-launch", "CUDA_SUCCESS"},
                 {"capture-copy", "CUDA_SUCCESS"},
                 {"capture-memset", "CUDA_SUCCESS"},
                 {"capture-info-v3", "CUDA_SUCCESS"},
                 {"capture-info-next", "yes"},
                 {"capture-same-graph", "yes"},
                 {"capture-end", "CUDA_SUCCESS"},
                 {"capture-ran-nothing", "0"},
                 {"graph-nodes", "CUDA_SUCCESS"},
                 {"graph-node-count", "3"},
                 {"graph-node-types", "12"},
                 {"graph-instantiate", "CUDA_SUCCESS"},
                 {"graph-launch", "CUDA_SUCCESS"},
                 {"graph-launch-again", "CUDA_SUCCESS"},
                 {"graph-results", "yes"},
                 {"graph-launch-destroyed", "CUDA_ERROR_INVALID_VALUE"},
                 {"after-capture-launch", "CUDA_SUCCESS"},
                 {"after-capture-sync", "CUDA_SUCCESS"}});
}

TEST_F(DriverSurface, AGraphBuiltNodeByNodeRunsInDependencyOrder) {
  expectAnswers({{"node-memset", "CUDA_SUCCESS"},
                 {"node-kernel", "CUDA_SUCCESS"},
                 {"node-dependency", "CUDA_SUCCESS"},
                 {"node-dependency-again", "CUDA_ERROR_INVALID_VALUE"},
                 {"node-host", "CUDA_SUCCESS"},
                 {"node-unknown-dependency", "CUDA_ERROR_INVALID_VALUE"},
                 {"node-graph-results", "yes"},
                 {"node-exec-set-params", "CUDA_SUCCESS"},
                 {"node-new-params-results", "yes"},
                 {"node-update-other-shape", "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"},
                 {"node-update-result", "2"}});  // CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED
}

TEST_F(DriverSurface, WhatCaptureCannotHoldIsRefusedAndSpoilsTheCapture) {
  expectAnswers({{"capture-legacy-stream", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
                 {"capture-twice", "CUDA_ERROR_ILLEGAL_STATE"},
                 {"captured-external-record", "CUDA_SUCCESS"},
                 {"captured-external-record-node", "yes"},
                 {"capture-query", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
                 {"capture-query-status", "2"},  // CU_STREAM_CAPTURE_STATUS_INVALIDATED
                 {"capture-end-invalidated", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
                 {"capture-end-not-capturing", "CUDA_ERROR_ILLEGAL_STATE"},
                 {"captured-event-query", "CUDA_ERROR_CAPTURED_EVENT"},
                 {"captured-event-synchronize", "CUDA_ERROR_CAPTURED_EVENT"},
                 {"captured-event-query-after", "CUDA_SUCCESS"},
                 {"capture-alloc-async", "CUDA_SUCCESS"},
                 {"capture-free-ordinary", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
                 {"capture-alloc-async-end", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
                 {"capture-mode-was", "0"},  // CU_STREAM_CAPTURE_MODE_GLOBAL
                 {"capture-relaxed-context-sync", "CUDA_SUCCESS"},
                 {"capture-global-context-sync", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
                 {"capture-global-context-sync-end", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
                 {"capture-pageable-copy", "CUDA_SUCCESS"},
                 {"capture-pageable-copy-end", "CUDA_SUCCESS"},
                 {"capture-pageable-results", "yes"}});
}

TEST_F(DriverSurface, UnknownPointers) {
  expectAnswers({{"unknown-memory-type", "CUDA_ERROR_INVALID_VALUE"},
                 {"attributes-unknown", "CUDA_SUCCESS"},
                 {"attributes-unknown-type", "0"},
                 {"attributes-unknown-ordinal", "-2"},
                 {"attributes-unknown-host-null", "yes"},
                 {"attributes-unknown-managed", "0"},
                 {"unknown-address-range", "CUDA_ERROR_NOT_FOUND"}});
}

TEST_F(DriverSurface, PitchedCopiesRoundTripAndLeaveThePaddingAlone) {
  expectAnswers({{"copy2d-up", "CUDA_SUCCESS"},
                 {"copy2d-across-async", "CUDA_SUCCESS"},
                 {"copy2d-down", "CUDA_SUCCESS"},
                 {"copy2d-round-trip", "yes"},
                 {"copy2d-host-padding-untouched", "yes"},
                 {"copy2d-device-padding-untouched", "yes"},
                 {"copy2d-contiguous", "CUDA_SUCCESS"},
                 {"copy2d-contiguous-bytes", "yes"},
                 {"copy2d-width-over-pitch", "CUDA_ERROR_INVALID_VALUE"},
                 {"copy2d-x-over-pitch", "CUDA_ERROR_INVALID_VALUE"},
                 {"copy2d-past-allocation", "CUDA_ERROR_INVALID_VALUE"},
                 {"copy2d-array", "CUDA_ERROR_INVALID_HANDLE"}});  // no such array
}

TEST_F(DriverSurface, ABatchOfCopiesRunsOnItsStreamAndNamesTheCopyThatFailed) {
  expectAnswers({{"batch-up", "CUDA_SUCCESS"},
                 {"batch-across-down", "CUDA_SUCCESS"},
                 {"batch-round-trip", "yes"},
                 {"batch-legacy-stream", "CUDA_ERROR_INVALID_VALUE"},
                 {"batch-no-order", "CUDA_ERROR_INVALID_VALUE"},
                 {"batch-no-order-index", "1"},
                 {"batch-late-attributes", "CUDA_ERROR_INVALID_VALUE"},
                 {"batch-past-allocation", "CUDA_ERROR_INVALID_VALUE"},
                 {"batch-past-allocation-index", "1"}});
}

TEST_F(DriverSurface, HostFunctionsRunInStreamOrder) {
  for (std::string prefix : {"host-func", "callback"}) {
    expectAnswers({{prefix + "-queued", "CUDA_SUCCESS"},
                   {prefix + "-calls", "1"},
                   {prefix + "-after-earlier-work", "yes"},
                   {prefix + "-before-later-work", "yes"}});
  }
  expectAnswers({{"callback-status", "CUDA_SUCCESS"},
                 {"host-func-alone-synchronized", "yes"},
                 {"host-func-null", "CUDA_ERROR_INVALID_VALUE"},
                 {"callback-flags", "CUDA_ERROR_INVALID_VALUE"}});
}

// A host function may wait for the application that queued it: it runs on a thread of the
// stub's own, and the stream's later work waits until it returns. Over RPC (no asynchronous
// answers) the stub runs it on the calling thread, which such a program cannot survive.
TEST_F(DriverSurface, AHostFunctionMayWaitForTheApplicationThatQueuedIt) {
  if (rpcTransport()) GTEST_SKIP() << "over RPC the stub runs host functions on the calling thread";
  expectAnswers({{"host-wait-queued", "CUDA_SUCCESS"},
                 {"host-wait-event-before-release", "CUDA_ERROR_NOT_READY"},
                 {"host-wait-stream-before-release", "CUDA_ERROR_NOT_READY"},
                 {"host-wait-sync", "CUDA_SUCCESS"},
                 {"host-wait-saw-release", "yes"},
                 {"host-wait-returned-before-sync", "yes"},
                 {"host-wait-event-after", "CUDA_SUCCESS"}});
}

TEST_F(DriverSurface, LaunchKernelExRunsPlainCooperativeAndDependentLaunchesAndRefusesTheRest) {
  expectAnswers({{"launch-ex", "CUDA_SUCCESS"},
                 {"launch-ex-result", "yes"},
                 {"launch-ex-cooperative", "CUDA_SUCCESS"},
                 {"launch-ex-cooperative-result", "yes"},
                 {"launch-ex-cooperative-too-large", "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"},
                 {"launch-cooperative", "CUDA_SUCCESS"},
                 {"launch-cooperative-extra-free", "CUDA_ERROR_INVALID_VALUE"},
                 {"launch-ex-dependent", "CUDA_SUCCESS"},
                 {"launch-ex-dependent-event", "CUDA_SUCCESS"},
                 {"launch-ex-dependent-result", "yes"},
                 {"launch-ex-event-external", "CUDA_ERROR_INVALID_VALUE"},
                 {"launch-ex-event-bad", "CUDA_ERROR_INVALID_HANDLE"},
                 {"launch-ex-cluster", "CUDA_ERROR_NOT_SUPPORTED"},
                 {"launch-ex-too-many-threads", "CUDA_ERROR_INVALID_VALUE"},
                 {"launch-ex-null", "CUDA_ERROR_INVALID_VALUE"}});
}

TEST_F(DriverSurface, HintsAreKeptAndNoDeviceReachesAnothersMemory) {
  expectAnswers({{"ctx-cache-config-set", "CUDA_SUCCESS"},
                 {"ctx-cache-config", "2"},  // CU_FUNC_CACHE_PREFER_L1
                 {"ctx-cache-config-unknown", "CUDA_ERROR_INVALID_VALUE"},
                 {"ctx-shared-config-set", "CUDA_SUCCESS"},
                 {"ctx-shared-config", "1"},  // CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE
                 {"persisting-l2-reset", "CUDA_SUCCESS"},
                 {"profiler-start", "CUDA_SUCCESS"},
                 {"profiler-stop", "CUDA_SUCCESS"},
                 {"profiler-start-without-context", "CUDA_ERROR_INVALID_CONTEXT"},
                 {"pci-bus-id", "CUDA_SUCCESS"},
                 {"pci-bus-id-form", "yes"},
                 {"by-pci-bus-id", "CUDA_SUCCESS"},
                 {"by-pci-bus-id-same-device", "yes"},
                 {"by-pci-bus-id-short", "CUDA_SUCCESS"},
                 {"by-pci-bus-id-short-same-device", "yes"},
                 {"by-pci-bus-id-garbage", "CUDA_ERROR_INVALID_VALUE"},
                 {"by-pci-bus-id-null", "CUDA_ERROR_INVALID_VALUE"},
                 {"pci-bus-id-bad-device", "CUDA_ERROR_INVALID_DEVICE"},
                 {"can-access-peer", "CUDA_SUCCESS"},
                 {"can-access-peer-value", "0"},
                 {"can-access-peer-bad-device", "CUDA_ERROR_INVALID_DEVICE"},
                 {"p2p-attribute-same-device", "CUDA_ERROR_INVALID_DEVICE"},
                 {"enable-peer-access", "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"},
                 {"enable-peer-access-flags", "CUDA_ERROR_INVALID_VALUE"},
                 {"disable-peer-access", "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"},
                 {"peer-copy", "CUDA_SUCCESS"},
                 {"peer-copy-arrived", "yes"},
                 {"peer-copy-bad-context", "CUDA_ERROR_INVALID_CONTEXT"}});
}

// CUDA arrays are memory with bounds; texture and surface objects are checked as they are made
// (on the sim: a GPU needs the daemon to make them, which it does not).
TEST_F(DriverSurface, ArraysAndTextureObjectsCheckTheirArguments) {
  expectAnswers({{"array-three-channels", "CUDA_ERROR_INVALID_VALUE"},
                 {"array-zero-width", "CUDA_ERROR_INVALID_VALUE"},
                 {"array-depth-without-height", "CUDA_ERROR_INVALID_VALUE"},
                 {"array-descriptor", "yes"},
                 {"array-bytes-round-trip", "yes"},
                 {"array-read-past-the-end", "CUDA_ERROR_INVALID_VALUE"},
                 {"copy-past-the-array-row", "CUDA_ERROR_INVALID_VALUE"},
                 {"tex-no-resource", "CUDA_ERROR_INVALID_VALUE"},
                 {"array-destroyed", "CUDA_ERROR_INVALID_HANDLE"}});
  if (chainedCudaBackend()) {
    expectAnswers({{"tex-create", "CUDA_ERROR_NOT_SUPPORTED"}});
    return;
  }
  expectAnswers({{"tex-create", "CUDA_SUCCESS"},
                 {"tex-resource-desc", "yes"},
                 {"surf-without-the-flag", "CUDA_ERROR_INVALID_VALUE"},
                 {"tex-misaligned-pitch", "CUDA_ERROR_INVALID_VALUE"},
                 {"tex-filtered-integers", "CUDA_ERROR_INVALID_VALUE"},
                 {"tex-past-the-allocation", "CUDA_ERROR_INVALID_VALUE"}});
}

// One piece of code linked is an image that loads and runs; what gpuproxy cannot link is refused
// with the reason in the error log.
TEST_F(DriverSurface, TheLinkerGivesOnePieceOfCodeBackAsALoadableImage) {
  expectAnswers({{"link-create", "CUDA_SUCCESS"},
                 {"link-add-ptx", "CUDA_SUCCESS"},
                 {"link-complete", "CUDA_SUCCESS"},
                 {"link-wall-time", "yes"},
                 {"link-logs-terminated", "yes"},
                 {"link-image", "yes"},
                 {"link-load", "CUDA_SUCCESS"},
                 {"link-module-runs", "yes"},
                 {"link-add-file", "CUDA_SUCCESS"},
                 {"link-add-missing-file", "CUDA_ERROR_FILE_NOT_FOUND"},
                 {"link-complete-file", "CUDA_SUCCESS"},
                 {"link-file-module-runs", "yes"},
                 {"link-create-null", "CUDA_ERROR_INVALID_VALUE"},
                 {"link-complete-null-state", "CUDA_ERROR_INVALID_HANDLE"},
                 {"link-destroy-null-state", "CUDA_ERROR_INVALID_HANDLE"},
                 {"link-complete-empty", "CUDA_ERROR_INVALID_VALUE"},
                 {"link-add-unknown-kind", "CUDA_ERROR_INVALID_VALUE"},
                 {"link-add-null-data", "CUDA_ERROR_INVALID_VALUE"},
                 {"link-add-cubin-that-is-ptx", "CUDA_ERROR_INVALID_IMAGE"},
                 {"link-add-library", "CUDA_ERROR_NOT_SUPPORTED"},
                 {"link-two-pieces", "CUDA_ERROR_NOT_SUPPORTED"},
                 {"link-two-pieces-says-why", "yes"}});
}

// Streams not capturing say so, have ids, and keep the attributes set on them.
TEST_F(DriverSurface, StreamsNotCapturingSaySoAndHaveIds) {
  expectAnswers({{"is-capturing", "CUDA_SUCCESS"},
                 {"is-capturing-status", "0"},
                 {"capture-info", "CUDA_SUCCESS"},
                 {"capture-info-status", "0"},
                 {"is-capturing-bad-stream", "CUDA_ERROR_INVALID_HANDLE"},
                 {"stream-ids-differ", "yes"},
                 {"stream-device", "CUDA_SUCCESS"},
                 {"stream-device-is-the-context-device", "yes"},
                 {"stream-device-null-stream", "CUDA_SUCCESS"},
                 {"stream-device-null-stream-is-the-context-device", "yes"},
                 {"stream-device-bad-stream", "CUDA_ERROR_INVALID_HANDLE"},
                 {"stream-ctx-v2", "CUDA_SUCCESS"},
                 {"stream-ctx-v2-context", "yes"},
                 {"record-flags-default", "CUDA_SUCCESS"},
                 {"record-flags-external", "CUDA_SUCCESS"},
                 {"record-flags-unknown", "CUDA_ERROR_INVALID_VALUE"},
                 {"record-flags-synchronize", "CUDA_SUCCESS"},
                 {"context-id", "CUDA_SUCCESS"},
                 {"context-id-stable", "yes"},
                 {"attr-window-set", "CUDA_SUCCESS"},
                 {"attr-window-kept", "yes"},
                 {"attr-window-copied", "yes"},
                 {"attr-window-bad-ratio", "CUDA_ERROR_INVALID_VALUE"},
                 {"attr-sync-policy", "3"},  // CU_SYNC_POLICY_YIELD
                 {"attr-priority", "0"},
                 {"attr-priority-change", "CUDA_ERROR_NOT_SUPPORTED"},
                 {"attr-not-of-streams", "CUDA_ERROR_INVALID_VALUE"},
                 {"driver_surface", "done"}});
}

}  // namespace
}  // namespace gpuproxy::testing
