// Fuzz target: command records executed by a client's session (ClientSession::execute, which hands
// each to its GPU's GpuCommandExecutor) against the sim backend, as a hostile client's ring would
// deliver them. The decoder has its own target
// (ring_record); this one goes past it, into handle and pointer checks, the dispatcher, the sim
// and reclamation.
//
// Once per process: a kj event loop, two sim GPUs of 64 MiB each in GpuShards, the daemon's state
// with its default tenant and a reaper. Per input: a fresh session, attached through
// ClientGateway as a connection would be and set up through its Cap'n Proto interface (a context,
// allocations, a module with two small kernels and a variable, streams and events, some of each
// already destroyed so that stale handles exist; and a context, a stream and an event on the
// second GPU, so that work of one GPU waits for the other's and handles of one reach the other).
// Then the input's records are decoded as the ring reader decodes them, their handles and
// pointers steered towards that table (below), and executed with a CommandPort of this file,
// which plays the ring's part: host bytes from the input, answers recorded and checked. Then the
// session's work is synchronised (or not: teardown with work in flight is exercised too), the
// session is dropped and the reaper drained.
//
// Properties (a violation aborts, so libFuzzer reports it):
//   - every answer is a record the stub can decode; a completion answers a token the client sent,
//     and after a synchronisation every token and every staging range has been answered exactly
//     once (a stub waiting for one would hang, or run out of staging space);
//   - a framing error asks for the client's connection to end (the harness, as a ring would,
//     executes nothing of the client after it);
//   - nothing logs an internal error (an exception in the executor, the dispatcher or a completion
//     callback, which client input must never cause); kernel faults are allowed;
//   - after the session is gone, the daemon holds no session and no client on the GPU, the GPU's
//     and the tenant's memory accounting and the device's free memory are what they were before
//     it, nothing its kernels printed stays behind, and a GPU a kernel fault poisoned has
//     recovered;
//   - nothing waits forever: every wait here is bounded (kBound).
//
// Input: byte 0 selects the mode (ModeBits), bytes 1-2 (little-endian) how many of the following
// bytes fill the start of the host regions, then the records back to back, split as the ring and
// Session.submit split them (each as long as its header says).
//
// GPUPROXY_WRITE_SEEDS=<dir> makes the first call write the seed corpus there (each seed is also
// run and must succeed in every command), e.g. through the replay binary with any one file.

#include "gpuproxy/protocol/gpuproxy.capnp.h"
#include "protocol/ring_format.hpp"
#include "server/backend/sim/sim_backend.hpp"
#include "server/data_plane/command_port.hpp"
#include "server/gpu/gpu_shard.hpp"
#include "server/session/client_session.hpp"
#include "server/session/session_services.hpp"
#include "server/tenant/tenant_config.hpp"
#include "server/tenant/tenant_registry.hpp"

#include <cuda.h>
#include <kj/async-io.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace gpuproxy::server {
namespace {

namespace ring = protocol::ring;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "session_executor: %s\n", what.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

unsigned long long ull(std::uint64_t value) {
  return value;
}

void require(bool condition, const char* what) {
  if (!condition) fail(what);
}

// GPUPROXY_FUZZ_LOG=1: print the daemon's log, every command as executed and every answer (to
// see what a crashing input does).
const bool kVerbose = std::getenv("GPUPROXY_FUZZ_LOG") != nullptr;

// How long any one wait may take. Every wait here ends well within it on a healthy daemon (the
// kernels are tiny, grids clamped); past it the daemon has lost track of something, which a
// client would see as a hang.
constexpr auto kBound = 5 * kj::SECONDS;

constexpr std::uint64_t kDeviceMemory = 64ull << 20;
constexpr std::uint32_t kGpus = 2;
// Host regions: small, so the fuzzer reaches both of their ends.
constexpr std::uint64_t kStagingBytes = 64 << 10;
constexpr std::uint64_t kPinnedHeapBytes = 64 << 10;
constexpr std::uint64_t kMessageBytes = 64 << 10;

// Byte 0 of an input.
enum ModeBits : std::uint8_t {
  // Drop the session with its work possibly still queued or running, instead of synchronising
  // first: the abandon path of reclamation.
  kTearDownBusy = 1 << 0,
  // The limits of a Session.submit call (host region 3, the call's payload) instead of a ring's
  // (staging area and pinned heap); with kSubmitWithSegment as well, both.
  kSubmit = 1 << 1,
  kSubmitWithSegment = 1 << 2,
};

// ---------------------------------------------------------------------------------------------
// Logging: the daemon logs its own bugs at error level (docs/architecture.md §7, "Our own bugs").
// Those are findings; a kernel fault, which a client may cause, is not.

class FindingSink final : public spdlog::sinks::base_sink<std::mutex> {
protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    const std::string_view text(message.payload.data(), message.payload.size());
    if (kVerbose) std::fprintf(stderr, "log: %.*s\n", static_cast<int>(text.size()), text.data());
    const bool internal =
        message.level >= spdlog::level::err ||
        // An exception in a ring command's continuation (GpuCommandExecutor::taskFailed).
        text.find("ring command failed") != std::string_view::npos;
    if (!internal) return;
    // The sim's and the shard's report of a kernel fault: the client's doing, and answered.
    if (text.find("faulted with") != std::string_view::npos ||
        text.find("the GPU context is poisoned") != std::string_view::npos) {
      return;
    }
    fail("the daemon logged an internal error: " + std::string(text));
  }
  void flush_() override {}
};

// ---------------------------------------------------------------------------------------------
// The kernels every session loads. fill(out, value, count): out[i] = value for each thread i <
// count. add_one(dst, src, count, print): dst[i] = src[i] + 1, counts each thread into `counter`
// with an atomic, and thread 0 prints src[0] when `print` is nonzero (device printf reaches the
// client at its next synchronisation). Neither loops on a parameter, so a launch's cost is its
// (clamped) shape.

constexpr char kModulePtx[] = R"(
.version 7.0
.target sm_70
.address_size 64

.extern .func (.param .b32 func_retval0) vprintf(.param .b64 vprintf_param_0, .param .b64 vprintf_param_1);

.global .align 1 .b8 fmt[12] = {97, 100, 100, 95, 111, 110, 101, 32, 37, 117, 10, 0};
.visible .global .align 4 .u32 counter[64];

.visible .entry fill(.param .u64 fill_out, .param .u32 fill_value, .param .u32 fill_count)
{
  .reg .pred %p<2>;
  .reg .b32 %r<7>;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [fill_out];
  ld.param.u32 %r1, [fill_value];
  ld.param.u32 %r2, [fill_count];
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mov.u32 %r5, %tid.x;
  mad.lo.s32 %r6, %r3, %r4, %r5;
  setp.ge.u32 %p1, %r6, %r2;
  @%p1 bra $L_fill_done;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r6, 4;
  add.s64 %rd4, %rd2, %rd3;
  st.global.u32 [%rd4], %r1;
$L_fill_done:
  ret;
}

.visible .entry add_one(.param .u64 add_one_dst, .param .u64 add_one_src,
                        .param .u32 add_one_count, .param .u32 add_one_print)
{
  .local .align 8 .b8 __local_depot1[8];
  .reg .b64 %SP;
  .reg .b64 %SPL;
  .reg .pred %p<4>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<16>;
  mov.u64 %SPL, __local_depot1;
  cvta.local.u64 %SP, %SPL;
  ld.param.u64 %rd1, [add_one_dst];
  ld.param.u64 %rd2, [add_one_src];
  ld.param.u32 %r1, [add_one_count];
  ld.param.u32 %r2, [add_one_print];
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mov.u32 %r5, %tid.x;
  mad.lo.s32 %r6, %r3, %r4, %r5;
  setp.ge.u32 %p1, %r6, %r1;
  @%p1 bra $L_add_done;
  cvta.to.global.u64 %rd3, %rd2;
  mul.wide.u32 %rd4, %r6, 4;
  add.s64 %rd5, %rd3, %rd4;
  ld.global.u32 %r7, [%rd5];
  add.s32 %r8, %r7, 1;
  cvta.to.global.u64 %rd6, %rd1;
  add.s64 %rd7, %rd6, %rd4;
  st.global.u32 [%rd7], %r8;
  and.b32 %r9, %r6, 63;
  mov.u64 %rd8, counter;
  mul.wide.u32 %rd9, %r9, 4;
  add.s64 %rd10, %rd8, %rd9;
  atom.global.add.u32 %r10, [%rd10], 1;
  setp.ne.u32 %p2, %r6, 0;
  setp.eq.u32 %p3, %r2, 0;
  or.pred %p2, %p2, %p3;
  @%p2 bra $L_add_done;
  add.u64 %rd11, %SPL, 0;
  st.local.u32 [%rd11], %r7;
  mov.u64 %rd12, fmt;
  cvta.global.u64 %rd13, %rd12;
  add.u64 %rd14, %SP, 0;
  {
    .param .b64 param0;
    st.param.b64 [param0+0], %rd13;
    .param .b64 param1;
    st.param.b64 [param1+0], %rd14;
    .param .b32 retval0;
    call.uni (retval0), vprintf, (param0, param1);
  }
$L_add_done:
  ret;
}
)";

// Where each kernel's pointer parameters are in its packed parameter buffer, and its size.
struct KernelShape {
  std::uint32_t parameterBytes;
  std::vector<std::uint32_t> pointerOffsets;
};
const KernelShape kFillShape{16, {0}};
const KernelShape kAddOneShape{24, {0, 8}};

// ---------------------------------------------------------------------------------------------
// Steering fuzzed values towards the session's objects. A handle field holding a value below
// 2^32 selects entry value % (n + 1) of the table of its kind; slot n leaves the value as it was
// (an unknown handle, or 0: the NULL stream where a stream is meant). Larger values are left
// alone, so real handles of any kind (the same in every fresh session) reach the executor too.
// A pointer below 2^32 selects an allocation by its top byte and an offset from 256 bytes before
// its start by the low 24 bits, so both edges of every allocation are near.

constexpr std::uint64_t kSteerLimit = 1ull << 32;
constexpr std::uint64_t kPointerBias = 256;

std::uint64_t steer(std::uint64_t value, std::span<const std::uint64_t> table) {
  if (value >= kSteerLimit) return value;
  const std::uint64_t slot = value % (table.size() + 1);
  return slot < table.size() ? table[slot] : value;
}

struct PointerTarget {
  std::uint64_t base;
  std::uint64_t bytes;
};

std::uint64_t steerPointer(std::uint64_t value, std::span<const PointerTarget> targets) {
  if (value >= kSteerLimit) return value;
  const std::uint64_t slot = (value >> 24) % (targets.size() + 1);
  if (slot == targets.size()) return value;
  return targets[slot].base + (value & 0xff'ffff) - kPointerBias;
}

// What seeds write to select table entries (the inverse of the above).
constexpr std::uint64_t pointerSelector(std::uint64_t slot, std::uint64_t offset) {
  return (slot << 24) | (offset + kPointerBias);
}

// Launch shapes: CUDA allows grids of 2^31 - 1 blocks, and each block 1024 threads, all legal
// input the sim would interpret thread by thread; one such launch would make every input a
// timeout. A grid is clamped to at most 4 x 2 x 2 blocks and a block the device accepts to at
// most 32 x 2 x 2 threads. A block the device must refuse is left as it is, so that refusal is
// still exercised.
ring::Dim3 clampGrid(ring::Dim3 grid) {
  return {std::min(grid.x, 4u), std::min(grid.y, 2u), std::min(grid.z, 2u)};
}

ring::Dim3 clampBlock(ring::Dim3 block) {
  const std::uint64_t threads = std::uint64_t{block.x} * block.y * block.z;
  const bool legal = block.x <= 1024 && block.y <= 1024 && block.z <= 64 && threads <= 1024;
  if (!legal) return block;
  return {std::min(block.x, 32u), std::min(block.y, 2u), std::min(block.z, 2u)};
}

// ---------------------------------------------------------------------------------------------
// The port: the ring's part. Host regions are buffers of the harness, as large as the limits the
// records were decoded with; answers are checked as the stub would read them and counted.

class FuzzPort final : public CommandPort {
public:
  FuzzPort(const ring::SegmentLimits& limits, std::span<const std::byte> hostData)
      : staging_(limits.stagingBytes),
        pinnedHeap_(limits.pinnedHeapBytes),
        message_(limits.messageBytes.value_or(0)) {
    for (auto* region : {&staging_, &message_}) {
      const std::size_t bytes = std::min(region->size(), hostData.size());
      if (bytes != 0) std::memcpy(region->data(), hostData.data(), bytes);
    }
  }

  // kj::Own is declared noexcept(false); dropping an unfulfilled fulfiller only rejects a wait.
  ~FuzzPort() noexcept override {}
  FuzzPort(const FuzzPort&) = delete;
  FuzzPort& operator=(const FuzzPort&) = delete;

  // Bounds as ClientChannel and SubmitPort check them: the decoder has checked the range, so one
  // outside its region here is an internal error (thrown, as they throw).
  std::span<std::byte> hostBytes(const ring::HostLocation& location, std::uint64_t bytes) override {
    std::vector<std::byte>* region = nullptr;
    switch (location.region) {
      case ring::HostRegion::kStaging:
        region = &staging_;
        break;
      case ring::HostRegion::kPinnedHeap:
        region = &pinnedHeap_;
        break;
      case ring::HostRegion::kMessage:
        region = &message_;
        break;
    }
    if (region == nullptr || location.offset > region->size() ||
        bytes > region->size() - location.offset) {
      throw std::logic_error("host range outside its region reached the executor");
    }
    return {region->data() + location.offset, static_cast<std::size_t>(bytes)};
  }

  std::shared_ptr<const void> keepAlive() override { return shared_from_this(); }

  void postCompletion(std::uint64_t token, CUresult result) override {
    if (kVerbose) std::fprintf(stderr, "  completion %#llx: %d\n", ull(token), result);
    checkDecodes(ring::Completion{token, result});
    auto expected = expectedTokens_.find(token);
    if (expected == expectedTokens_.end() || answeredTokens_[token] >= expected->second) {
      fail("a completion for token " + std::to_string(token) + " nobody waits for (any more)");
    }
    ++answeredTokens_[token];
    ++answered_;
    // A host function is due: the harness, as the stub, runs it (there is nothing to run) and
    // says it returned.
    if (auto host = hostFunctions_.find(token); host != hostFunctions_.end()) {
      const ring::HostFunctionReturned returned = host->second;
      hostFunctions_.erase(host);
      if (onHostFunctionDue) onHostFunctionDue(returned);
    }
    // A query of work still running is answered "not ready", which is no failure.
    if (result != CUDA_SUCCESS && result != CUDA_ERROR_NOT_READY) ++failures_;
    settleIfDone();
  }

  void postAsyncError(const ring::AsyncError& error) override {
    if (kVerbose) {
      std::fprintf(stderr, "  async error of #%llu (opcode %u): %d\n", ull(error.sequence),
                   error.opcode, error.result);
    }
    checkDecodes(error);
    ++failures_;
  }

  void postStagingRelease(std::uint64_t offset, std::uint64_t bytes) override {
    if (kVerbose) std::fprintf(stderr, "  staging release %llu+%llu\n", ull(offset), ull(bytes));
    checkDecodes(ring::StagingRelease{offset, bytes});
    auto expected = expectedReleases_.find({offset, bytes});
    if (expected == expectedReleases_.end() ||
        releasedRanges_[{offset, bytes}] >= expected->second) {
      fail("a staging release of a range the daemon was not given");
    }
    ++releasedRanges_[{offset, bytes}];
    ++released_;
    settleIfDone();
  }

  void postDeviceOutput(std::uint64_t bytes) override {
    if (kVerbose) std::fprintf(stderr, "  device output %llu\n", ull(bytes));
    checkDecodes(ring::DeviceOutput{bytes});
    require(bytes != 0, "a DeviceOutput notice of no output");
  }

  // What the command about to be executed will be answered with.
  void expect(const ring::DecodedCommand& command) {
    std::visit(
        [&](const auto& decoded) {
          using T = std::decay_t<decltype(decoded)>;
          if constexpr (std::is_same_v<T, ring::DecodeError>) {
            if (!decoded.disconnect) expectToken(decoded.completionToken);
          } else {
            if constexpr (requires { decoded.completionToken; }) {
              expectToken(decoded.completionToken);
            }
            if constexpr (std::is_same_v<T, ring::HostFunction>) {
              hostFunctions_[decoded.completionToken] = ring::HostFunctionReturned{
                  0, decoded.context, decoded.stream, decoded.completionToken};
            }
            if constexpr (std::is_same_v<T, ring::CopyHostToDevice>) {
              if (decoded.source.region == ring::HostRegion::kStaging) {
                expectRelease(decoded.source.offset, decoded.bytes);
              }
            }
            if constexpr (std::is_same_v<T, ring::LaunchKernel>) {
              if (decoded.parameterReference &&
                  decoded.parameterReference->region == ring::HostRegion::kStaging) {
                expectRelease(decoded.parameterReference->offset, decoded.parameterBytes);
              }
            }
          }
        },
        command);
  }

  // Resolves once every expected answer has come.
  kj::Promise<void> settled() {
    if (done()) return kj::READY_NOW;
    auto paf = kj::newPromiseAndFulfiller<void>();
    settled_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }

  std::uint64_t failures() const { return failures_; }

  // Set by the harness: says a due host function returned (later, on the loop).
  std::function<void(const ring::HostFunctionReturned&)> onHostFunctionDue;

private:
  std::map<std::uint64_t, ring::HostFunctionReturned> hostFunctions_;  // by token, not yet due
  template <typename Answer>
  static void checkDecodes(const Answer& answer) {
    std::array<std::byte, ring::kMaxCompletionRecordBytes> record{};
    const std::size_t bytes = ring::encode(answer, record);
    require(bytes != 0, "an answer that cannot be encoded");
    const ring::SegmentLimits limits{kStagingBytes, kPinnedHeapBytes, kMessageBytes};
    const auto decoded = ring::decodeCompletion(std::span(record).first(bytes), limits);
    if (const auto* error = std::get_if<ring::DecodeError>(&decoded)) {
      fail("an answer the stub cannot read: " + std::string(ring::describe(error->failure)));
    }
  }

  void expectToken(std::uint64_t token) {
    if (token == 0) return;
    ++expectedTokens_[token];
    ++expected_;
  }

  void expectRelease(std::uint64_t offset, std::uint64_t bytes) {
    ++expectedReleases_[{offset, bytes}];
    ++expected_;
  }

  bool done() const { return answered_ + released_ == expected_; }

  void settleIfDone() {
    if (done() && settled_) {
      settled_->fulfill();
      settled_ = nullptr;
    }
  }

  std::vector<std::byte> staging_;
  std::vector<std::byte> pinnedHeap_;
  std::vector<std::byte> message_;
  std::map<std::uint64_t, std::uint64_t> expectedTokens_;
  std::map<std::uint64_t, std::uint64_t> answeredTokens_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> expectedReleases_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> releasedRanges_;
  std::uint64_t expected_ = 0;
  std::uint64_t answered_ = 0;
  std::uint64_t released_ = 0;
  std::uint64_t failures_ = 0;
  kj::Own<kj::PromiseFulfiller<void>> settled_;
};

// ---------------------------------------------------------------------------------------------
// The daemon's side, once per process.

class ReaperErrors final : public kj::TaskSet::ErrorHandler {
public:
  void taskFailed(kj::Exception&& exception) override {
    fail("reclaiming a session failed: " + std::string(exception.getDescription().cStr()));
  }
};

struct Daemon {
  Daemon() : io(kj::setupAsyncIo()) {
    auto logger = std::make_shared<spdlog::logger>("gpuproxyd", std::make_shared<FindingSink>());
    // Below warnings nothing is a finding; formatting every attach and detach line would cost
    // more than some inputs do.
    logger->set_level(kVerbose ? spdlog::level::debug : spdlog::level::warn);
    spdlog::set_default_logger(logger);

    facts.backendName = "sim";
    facts.schedulerName = "fair";
    facts.driverVersion = backend->driverVersion();
    for (std::uint32_t index = 0; index < kGpus; ++index) {
      auto device = backend->openDevice(static_cast<int>(index));
      require(device.ok(), "cannot open a sim device");
      shards.push_back(
          std::make_unique<GpuShard>(index, std::move(device).value(), io.provider->getTimer()));
      gpus.push_back(shards.back().get());
    }
    // The daemon's tenants without a tenants file: the unlimited default tenant.
    // (The socket is never opened: sessions are attached here, not through it.)
    TenantConfig config = defaultTenantConfig("gpuproxy.sock");
    for (TenantDefinition& definition : config.tenants) {
      definition.origin = TenantOrigin::kConfig;
      tenants.add(std::move(definition));
    }
  }

  std::shared_ptr<Tenant> tenant() { return tenants.find(kDefaultTenantName); }
  // What the daemon lends each session; no data plane (records come through the fake port).
  SessionServices services() {
    return SessionServices{facts, gpus, sessions, connections, reaper, nullptr};
  }
  kj::Timer& timer() { return io.provider->getTimer(); }

  // Waits for `promise`, at most kBound; `what` names it when it does not come.
  template <typename T>
  T waitBounded(kj::Promise<T> promise, const char* what) {
    return promise
        .exclusiveJoin(timer().afterDelay(kBound).then(
            [what]() -> T { fail(std::string("still waiting after 5 s: ") + what); }))
        .wait(io.waitScope);
  }

  // Resolves once `gpu`'s blocking-call thread has nothing left to do (what clients left behind
  // is freed there: GpuShard::release).
  kj::Promise<void> blockingCallsEnded(GpuShard& gpu) {
    if (gpu.blockingCalls().pending == 0) return kj::READY_NOW;
    return timer().afterDelay(kj::MILLISECONDS).then([this, &gpu] {
      return blockingCallsEnded(gpu);
    });
  }

  kj::AsyncIoContext io;
  // The engine thread runs every block itself (no interpreter workers): fewer threads, so an
  // input runs the same way more often.
  std::unique_ptr<backend::Backend> backend = sim::newSimBackend([] {
    sim::SimOptions options;
    options.devices = kGpus;
    options.memoryBytes = kDeviceMemory;
    options.workerThreads = 0;
    return options;
  }());
  ReaperErrors reaperErrors;
  kj::TaskSet reaper{reaperErrors};
  DaemonFacts facts;
  // Every GPU on this thread (a message to one is a later turn of this loop), so that an input
  // runs the same way every time.
  std::vector<std::unique_ptr<GpuShard>> shards;
  Gpus gpus;
  std::set<ClientSession*> sessions;
  TenantRegistry tenants;
  ConnectionRegistry connections;
};

Daemon& daemon() {
  // Never destroyed: the sim's threads must not outlive what they report to at exit.
  static Daemon* daemon = new Daemon();
  return *daemon;
}

// ---------------------------------------------------------------------------------------------
// One client.

// What a session is set up with; handles and pointers the records are steered to.
struct Objects {
  std::uint64_t context = 0;
  std::vector<std::uint64_t> contexts;   // the live context, a destroyed one, the second GPU's
  std::vector<std::uint64_t> streams;    // NULL, blocking, non-blocking, destroyed, second GPU's
  std::vector<std::uint64_t> events;     // timing, no timing, destroyed, second GPU's
  std::vector<std::uint64_t> functions;  // fill, add_one
  std::vector<PointerTarget> pointers;   // 4 KiB, 64 KiB, the module's `counter`, freed
};

void requireOk(std::int32_t result, const char* what) {
  if (result != CUDA_SUCCESS) {
    fail(std::string("setting up the session: ") + what + " answered " + std::to_string(result));
  }
}

Objects setUp(Daemon& daemon, protocol::Session::Client& session) {
  kj::WaitScope& waitScope = daemon.io.waitScope;
  Objects objects;
  auto newContext = [&](std::uint32_t device = 0) {
    auto request = session.createContextRequest();
    request.setDevice(device);
    auto answer = request.send().wait(waitScope);
    requireOk(answer.getResult(), "createContext");
    return answer.getContext();
  };
  objects.context = newContext();
  const std::uint64_t context = objects.context;
  const std::uint64_t gone = newContext();
  {
    auto request = session.destroyContextRequest();
    request.setContext(gone);
    requireOk(request.send().wait(waitScope).getResult(), "destroyContext");
  }
  const std::uint64_t onSecondGpu = newContext(1);
  objects.contexts = {context, gone, onSecondGpu};

  auto allocate = [&](std::uint64_t bytes) {
    auto request = session.memAllocRequest();
    request.setContext(context);
    request.setBytes(bytes);
    auto answer = request.send().wait(waitScope);
    requireOk(answer.getResult(), "memAlloc");
    return PointerTarget{answer.getPointer(), bytes};
  };
  objects.pointers.push_back(allocate(4096));
  objects.pointers.push_back(allocate(64 << 10));

  std::uint64_t module = 0;
  {
    auto request = session.loadModuleRequest();
    request.setContext(context);
    request.setImage(
        kj::arrayPtr(reinterpret_cast<const capnp::byte*>(kModulePtx), sizeof(kModulePtx)));
    auto answer = request.send().wait(waitScope);
    requireOk(answer.getResult(), "loadModule");
    module = answer.getModule();
  }
  for (const char* name : {"fill", "add_one"}) {
    auto request = session.getFunctionRequest();
    request.setModule(module);
    request.setName(name);
    auto answer = request.send().wait(waitScope);
    requireOk(answer.getResult(), "getFunction");
    objects.functions.push_back(answer.getFunction());
  }
  {
    auto request = session.getGlobalRequest();
    request.setModule(module);
    request.setName("counter");
    auto answer = request.send().wait(waitScope);
    requireOk(answer.getResult(), "getGlobal");
    objects.pointers.push_back({answer.getPointer(), answer.getBytes()});
  }
  {
    const PointerTarget freed = allocate(1024);
    auto request = session.memFreeRequest();
    request.setPointer(freed.base);
    requireOk(request.send().wait(waitScope).getResult(), "memFree");
    objects.pointers.push_back(freed);
  }

  auto newStream = [&](std::uint64_t owner, unsigned flags) {
    auto request = session.createStreamRequest();
    request.setContext(owner);
    request.setFlags(flags);
    auto answer = request.send().wait(waitScope);
    requireOk(answer.getResult(), "createStream");
    objects.streams.push_back(answer.getStream());
  };
  auto newEvent = [&](std::uint64_t owner, unsigned flags) {
    auto request = session.createEventRequest();
    request.setContext(owner);
    request.setFlags(flags);
    auto answer = request.send().wait(waitScope);
    requireOk(answer.getResult(), "createEvent");
    objects.events.push_back(answer.getEvent());
  };
  objects.streams.push_back(0);
  for (unsigned flags : {unsigned{CU_STREAM_DEFAULT}, unsigned{CU_STREAM_NON_BLOCKING},
                         unsigned{CU_STREAM_DEFAULT}}) {
    newStream(context, flags);
  }
  {
    auto request = session.destroyStreamRequest();
    request.setStream(objects.streams.back());
    requireOk(request.send().wait(waitScope).getResult(), "destroyStream");
  }
  for (unsigned flags : {unsigned{CU_EVENT_DEFAULT}, unsigned{CU_EVENT_DISABLE_TIMING},
                         unsigned{CU_EVENT_DEFAULT}}) {
    newEvent(context, flags);
  }
  {
    auto request = session.destroyEventRequest();
    request.setEvent(objects.events.back());
    requireOk(request.send().wait(waitScope).getResult(), "destroyEvent");
  }
  newStream(onSecondGpu, CU_STREAM_NON_BLOCKING);
  newEvent(onSecondGpu, CU_EVENT_DISABLE_TIMING);
  return objects;
}

// Rewrites the handle and pointer fields of `command` (see steer); a launch's parameters are
// rewritten into `parameters`, which must outlive the command.
void steerCommand(ring::DecodedCommand& command, const Objects& objects,
                  std::vector<std::byte>& parameters) {
  auto context = [&](std::uint64_t& handle) { handle = steer(handle, objects.contexts); };
  auto stream = [&](std::uint64_t& handle) { handle = steer(handle, objects.streams); };
  auto event = [&](std::uint64_t& handle) { handle = steer(handle, objects.events); };
  auto pointer = [&](std::uint64_t& value) { value = steerPointer(value, objects.pointers); };
  std::visit(
      [&](auto& decoded) {
        using T = std::decay_t<decltype(decoded)>;
        if constexpr (std::is_same_v<T, ring::LaunchKernel>) {
          context(decoded.context);
          stream(decoded.stream);
          const std::uint64_t selected = steer(decoded.function, objects.functions);
          const KernelShape* shape = selected == objects.functions[0]   ? &kFillShape
                                     : selected == objects.functions[1] ? &kAddOneShape
                                                                        : nullptr;
          decoded.function = selected;
          decoded.grid = clampGrid(decoded.grid);
          decoded.block = clampBlock(decoded.block);
          if (shape != nullptr && !decoded.parameterReference &&
              decoded.inlineParameters.size() == shape->parameterBytes) {
            parameters.assign(decoded.inlineParameters.begin(), decoded.inlineParameters.end());
            for (std::uint32_t offset : shape->pointerOffsets) {
              std::uint64_t value;
              std::memcpy(&value, parameters.data() + offset, sizeof value);
              pointer(value);
              std::memcpy(parameters.data() + offset, &value, sizeof value);
            }
            decoded.inlineParameters = parameters;
          }
        } else if constexpr (std::is_same_v<T, ring::CopyHostToDevice>) {
          context(decoded.context);
          stream(decoded.stream);
          pointer(decoded.destination);
        } else if constexpr (std::is_same_v<T, ring::CopyDeviceToHost>) {
          context(decoded.context);
          stream(decoded.stream);
          pointer(decoded.source);
        } else if constexpr (std::is_same_v<T, ring::CopyDeviceToDevice>) {
          context(decoded.context);
          stream(decoded.stream);
          pointer(decoded.destination);
          pointer(decoded.source);
        } else if constexpr (std::is_same_v<T, ring::Memset> || std::is_same_v<T, ring::Memset2D>) {
          context(decoded.context);
          stream(decoded.stream);
          pointer(decoded.destination);
        } else if constexpr (std::is_same_v<T, ring::EventRecord> ||
                             std::is_same_v<T, ring::StreamWaitEvent>) {
          context(decoded.context);
          stream(decoded.stream);
          event(decoded.event);
        } else if constexpr (std::is_same_v<T, ring::Synchronize>) {
          context(decoded.context);
          if (decoded.kind == ring::SynchronizeKind::kStream) stream(decoded.handle);
          if (decoded.kind == ring::SynchronizeKind::kEvent) event(decoded.handle);
        } else if constexpr (std::is_same_v<T, ring::HostFunction> ||
                             std::is_same_v<T, ring::HostFunctionReturned> ||
                             std::is_same_v<T, ring::HoldForEvent>) {
          context(decoded.context);
          stream(decoded.stream);
        } else if constexpr (std::is_same_v<T, ring::LetGoAfterEvent>) {
          context(decoded.context);
          event(decoded.event);
          context(decoded.waiterContext);
          stream(decoded.waiterStream);
        }
        // A DecodeError is answered from its own fields; nothing of it reaches the GPU.
      },
      command);
}

// One line per command, its fields as executed (for GPUPROXY_FUZZ_LOG).
void describe(const ring::DecodedCommand& command) {
  std::visit(
      [](const auto& decoded) {
        using T = std::decay_t<decltype(decoded)>;
        if constexpr (std::is_same_v<T, ring::DecodeError>) {
          std::fprintf(stderr, "#%llu decode error: %s%s\n", ull(decoded.sequence),
                       std::string(ring::describe(decoded.failure)).c_str(),
                       decoded.disconnect ? " (disconnect)" : "");
        } else {
          std::fprintf(stderr, "#%llu opcode %u context %#llx", ull(decoded.sequence),
                       static_cast<unsigned>(T::kOpcode), ull(decoded.context));
          if constexpr (requires { decoded.stream; }) {
            std::fprintf(stderr, " stream %#llx", ull(decoded.stream));
          }
          if constexpr (requires { decoded.event; }) {
            std::fprintf(stderr, " event %#llx", ull(decoded.event));
          }
          if constexpr (std::is_same_v<T, ring::LaunchKernel>) {
            std::fprintf(stderr, " function %#llx grid %ux%ux%u block %ux%ux%u shared %u params %u",
                         ull(decoded.function), decoded.grid.x, decoded.grid.y, decoded.grid.z,
                         decoded.block.x, decoded.block.y, decoded.block.z, decoded.sharedMemBytes,
                         decoded.parameterBytes);
          }
          if constexpr (requires { decoded.destination; }) {
            if constexpr (std::is_same_v<decltype(decoded.destination), std::uint64_t>) {
              std::fprintf(stderr, " destination %#llx", ull(decoded.destination));
            }
          }
          if constexpr (requires { decoded.source; }) {
            if constexpr (std::is_same_v<decltype(decoded.source), std::uint64_t>) {
              std::fprintf(stderr, " source %#llx", ull(decoded.source));
            }
          }
          if constexpr (requires { decoded.bytes; }) {
            std::fprintf(stderr, " bytes %llu", ull(decoded.bytes));
          }
          if constexpr (requires { decoded.count; }) {
            std::fprintf(stderr, " count %llu", ull(decoded.count));
          }
          if constexpr (std::is_same_v<T, ring::Synchronize>) {
            std::fprintf(stderr, " kind %u handle %#llx%s", static_cast<unsigned>(decoded.kind),
                         ull(decoded.handle), decoded.query ? " query" : "");
          }
          if constexpr (requires { decoded.completionToken; }) {
            std::fprintf(stderr, " token %#llx", ull(decoded.completionToken));
          }
          if constexpr (requires { decoded.token; }) {
            std::fprintf(stderr, " token %#llx", ull(decoded.token));
          }
          if constexpr (std::is_same_v<T, ring::LetGoAfterEvent>) {
            std::fprintf(stderr, " waiter context %#llx stream %#llx", ull(decoded.waiterContext),
                         ull(decoded.waiterStream));
          }
          std::fprintf(stderr, "\n");
        }
      },
      command);
}

// The next record of `rest`, as ClientSession::nextSubmitted splits a call's records: as long as
// its header says, or, when that cannot be right, all that is left (a framing error).
std::span<const std::byte> nextRecord(std::span<const std::byte>& rest) {
  std::size_t length = rest.size();
  if (const auto header = ring::peekCommandHeader(rest);
      header && header->length >= ring::kCommandHeaderBytes && header->length <= rest.size()) {
    length = header->length;
  }
  const std::span<const std::byte> record = rest.first(length);
  rest = rest.subspan(length);
  return record;
}

ring::SegmentLimits limitsFor(std::uint8_t mode) {
  if ((mode & kSubmit) == 0) return {kStagingBytes, kPinnedHeapBytes, std::nullopt};
  if ((mode & kSubmitWithSegment) == 0) return {0, 0, kMessageBytes};
  return {kStagingBytes, kPinnedHeapBytes, kMessageBytes};
}

struct RunResult {
  std::uint64_t failures = 0;  // commands answered with an error
  bool evicted = false;
};

RunResult runOne(std::span<const std::byte> input) {
  Daemon& daemon = ::gpuproxy::server::daemon();
  kj::WaitScope& waitScope = daemon.io.waitScope;
  const std::shared_ptr<Tenant> tenant = daemon.tenant();
  std::vector<std::uint64_t> memoryBefore;
  std::vector<std::uint64_t> freeBefore;
  for (const auto& gpu : daemon.gpus) {
    memoryBefore.push_back(gpu->memoryUsed());
    freeBefore.push_back(gpu->memoryInfo().free);
  }
  const std::uint64_t tenantMemoryBefore = tenant->memoryUsed();

  const std::uint8_t mode = input.empty() ? 0 : std::to_integer<std::uint8_t>(input[0]);
  std::size_t hostBytes = 0;
  if (input.size() >= 3) {
    hostBytes = std::to_integer<std::size_t>(input[1]) | std::to_integer<std::size_t>(input[2])
                                                             << 8;
  }
  std::span<const std::byte> rest = input.subspan(std::min<std::size_t>(3, input.size()));
  const std::span<const std::byte> hostData = rest.first(std::min(hostBytes, rest.size()));
  rest = rest.subspan(hostData.size());
  const ring::SegmentLimits limits = limitsFor(mode);

  // A connection as TenantSockets::serve registers it, from this process.
  const ipc::PeerCredentials peer{::getpid(), ::getuid(), ::getgid()};
  auto registration = daemon.connections.add(peer.pid, tenant->id());
  RunResult outcome;
  {
    protocol::Gateway::Client gateway =
        kj::heap<ClientGateway>(daemon.services(), peer, tenant, registration.id);
    auto attach = gateway.attachRequest();
    attach.setProtocolVersion(protocol::PROTOCOL_VERSION);
    protocol::Session::Client session = [&]() {
      auto answer = attach.send().wait(waitScope);
      requireOk(answer.getResult(), "attach");
      return answer.getSession();
    }();
    require(daemon.sessions.size() == 1, "attach made no session");
    ClientSession& attached = **daemon.sessions.begin();
    // The executor the ring and Session.submit reach. ClientSession implements CommandExecutor
    // privately, for its channel; a C-style cast is the conversion C++ allows to an inaccessible
    // (unambiguous) base, and it is well-defined.
    CommandExecutor& executor = (CommandExecutor&)attached;

    const Objects objects = setUp(daemon, session);
    auto port = std::make_shared<FuzzPort>(limits, hostData);
    // Host functions that became due return on a later turn of the loop, as the stub's
    // host-function thread answers.
    struct FailOnError final : kj::TaskSet::ErrorHandler {
      void taskFailed(kj::Exception&& exception) override {
        fail("returning a host function threw: " + std::string(exception.getDescription().cStr()));
      }
    } failOnError;
    kj::TaskSet returns(failOnError);
    port->onHostFunctionDue = [&returns, &executor,
                               port = port.get()](const ring::HostFunctionReturned& returned) {
      returns.add(kj::evalLater([&executor, port, returned] {
        executor.execute(ring::DecodedCommand{returned}, *port);
      }));
    };
    std::vector<std::byte> parameters;
    // Streams held for another GPU's event: as the stub always sends a hold's let-go, the harness
    // sends one before it synchronises for each hold no let-go of the input matched (its token,
    // naming the hold's context as the waiter's). By (token, context): holds minus let-gos, and
    // the stream of the last hold.
    std::map<std::pair<std::uint64_t, std::uint64_t>, std::pair<int, std::uint64_t>> unmatched;
    while (!rest.empty()) {
      // A ring leaves the client's records where they are while it is at its bound on queued
      // work and looks again every millisecond (DataPlane's throttled recheck).
      for (int turns = 0; !executor.readyForCommands(); ++turns) {
        require(turns < 5000, "a client at its bound on queued work never got below it");
        daemon.timer().afterDelay(kj::MILLISECONDS).wait(waitScope);
      }
      ring::DecodedCommand command = ring::decodeCommand(nextRecord(rest), limits);
      steerCommand(command, objects, parameters);
      if (const auto* hold = std::get_if<ring::HoldForEvent>(&command)) {
        auto& entry = unmatched[{hold->token, hold->context}];
        ++entry.first;
        entry.second = hold->stream;
      }
      if (const auto* letGo = std::get_if<ring::LetGoAfterEvent>(&command)) {
        --unmatched[{letGo->token, letGo->waiterContext}].first;
      }
      if (kVerbose) describe(command);
      port->expect(command);
      executor.execute(command, *port);
      if (ring::breaksFraming(command)) {
        // The channel stops reading (nothing more of this client executes) and the connection
        // is asked to end.
        require(registration.endRequested.poll(waitScope),
                "a framing error did not end the client's connection");
        outcome.evicted = true;
        break;
      }
      // A turn of the loop between records, as the data plane gives one every so many records:
      // completions arrive between commands.
      waitScope.poll();
    }

    if ((mode & kTearDownBusy) == 0 && !outcome.evicted) {
      for (const auto& [key, entry] : unmatched) {
        for (int missing = 0; missing < entry.first; ++missing) {
          // Naming no event: nothing to wait for, so the stream goes on at once.
          const ring::DecodedCommand letGo =
              ring::LetGoAfterEvent{0, 0, 0, key.first, key.second, entry.second};
          port->expect(letGo);
          executor.execute(letGo, *port);
        }
      }
      // cuCtxSynchronize, then every answer the client waits for.
      ring::Synchronize sync;
      sync.context = objects.context;
      sync.kind = ring::SynchronizeKind::kContext;
      sync.completionToken = ~std::uint64_t{0};
      const ring::DecodedCommand command = sync;
      port->expect(command);
      executor.execute(command, *port);
      daemon.waitBounded(port->settled(), "answers the client waits for (tokens, staging ranges)");
    }
    outcome.failures = port->failures();
    port->onHostFunctionDue = nullptr;
    // The client goes away: its capability, and with it the session, is dropped.
  }
  daemon.waitBounded(daemon.reaper.onEmpty(), "the reaper to reclaim the session");
  // A context the client poisoned is reset on the GPU's blocking-call thread once it has gone.
  for (const auto& gpu : daemon.gpus) {
    daemon.waitBounded(gpu->whenServing(), "the poisoned GPU's context to be reset");
    daemon.waitBounded(daemon.blockingCallsEnded(*gpu), "the GPU to free what the client left");
  }
  daemon.connections.forget(registration.id);

  require(daemon.sessions.empty(), "a session outlived its client");
  require(tenant->memoryUsed() == tenantMemoryBefore, "the tenant's memory was not credited");
  require(tenant->clients == 0, "the tenant still counts the client");
  for (std::size_t index = 0; index < daemon.gpus.size(); ++index) {
    GpuShard& gpu = *daemon.gpus[index];
    require(gpu.clientCount() == 0, "a GpuClient outlived its session");
    require(gpu.memoryUsed() == memoryBefore[index], "the GPU's memory accounting did not return");
    require(gpu.stickyError() == CUDA_SUCCESS, "the GPU stayed poisoned after its clients left");
    require(gpu.memoryInfo().free == freeBefore[index], "the device did not get its memory back");
    // The client's address space is its connection's id, never reused: whatever its kernels
    // printed that nobody took would stay in the daemon for good.
    require(gpu.device().takeDeviceOutput(registration.id).empty(),
            "the daemon kept what a gone client's kernels printed");
  }
  return outcome;
}

// ---------------------------------------------------------------------------------------------
// Seeds: sensible sequences, as the stub would send them, encoded with the protocol's encoders.
// Handles are selectors (see steer): context 0, 2 = the second GPU's; stream 0 = NULL,
// 1 = blocking, 2 = non-blocking, 4 = the second GPU's; event 0, 1, 3 = the second GPU's; function
// 0 = fill, 1 = add_one; pointers by pointerSelector(slot, offset) with slot 0 = 4 KiB, 1 = 64 KiB,
// 2 = `counter`.

class SeedWriter {
public:
  explicit SeedWriter(std::uint8_t mode, std::vector<std::byte> host = {}) {
    bytes_.push_back(std::byte{mode});
    bytes_.push_back(std::byte(host.size() & 0xff));
    bytes_.push_back(std::byte(host.size() >> 8));
    bytes_.insert(bytes_.end(), host.begin(), host.end());
  }

  template <typename Command>
  SeedWriter& add(Command command) {
    command.sequence = ++sequence_;
    std::vector<std::byte> record(ring::kMaxCommandRecordBytes);
    const std::size_t bytes = ring::encode(command, record);
    require(bytes != 0, "a seed record does not encode");
    bytes_.insert(bytes_.end(), record.begin(), record.begin() + bytes);
    return *this;
  }

  const std::vector<std::byte>& bytes() const { return bytes_; }

private:
  std::vector<std::byte> bytes_;
  std::uint64_t sequence_ = 0;
};

template <typename... Words>
std::vector<std::byte> packed(Words... words) {
  std::vector<std::byte> out;
  auto append = [&](auto word) {
    const auto* raw = reinterpret_cast<const std::byte*>(&word);
    out.insert(out.end(), raw, raw + sizeof word);
  };
  (append(words), ...);
  return out;
}

ring::LaunchKernel launch(std::uint64_t function, std::uint64_t stream,
                          const std::vector<std::byte>& parameters, std::uint32_t blocks,
                          std::uint32_t threads) {
  ring::LaunchKernel command;
  command.function = function;
  command.stream = stream;
  command.grid = {blocks, 1, 1};
  command.block = {threads, 1, 1};
  command.parameterBytes = static_cast<std::uint32_t>(parameters.size());
  command.inlineParameters = parameters;
  return command;
}

ring::CopyHostToDevice toDevice(std::uint64_t stream, std::uint64_t destination,
                                std::uint64_t hostOffset, std::uint64_t bytes,
                                std::uint64_t token = 0,
                                ring::HostRegion region = ring::HostRegion::kStaging) {
  ring::CopyHostToDevice command;
  command.stream = stream;
  command.destination = destination;
  command.source = {region, hostOffset};
  command.bytes = bytes;
  command.completionToken = token;
  return command;
}

ring::CopyDeviceToHost toHost(std::uint64_t stream, std::uint64_t source, std::uint64_t hostOffset,
                              std::uint64_t bytes, std::uint64_t token,
                              ring::HostRegion region = ring::HostRegion::kStaging) {
  ring::CopyDeviceToHost command;
  command.stream = stream;
  command.source = source;
  command.destination = {region, hostOffset};
  command.bytes = bytes;
  command.completionToken = token;
  return command;
}

ring::Synchronize synchronize(ring::SynchronizeKind kind, std::uint64_t handle, std::uint64_t token,
                              bool query = false) {
  ring::Synchronize command;
  command.kind = kind;
  command.handle = handle;
  command.completionToken = token;
  command.query = query;
  return command;
}

std::vector<std::pair<std::string, std::vector<std::byte>>> seeds() {
  const auto a = [](std::uint64_t offset) { return pointerSelector(0, offset); };
  const auto b = [](std::uint64_t offset) { return pointerSelector(1, offset); };
  const auto counter = pointerSelector(2, 0);
  const auto fillArgs = packed(a(0), std::uint32_t{7}, std::uint32_t{64});
  const auto addArgs = packed(b(0), a(0), std::uint32_t{64}, std::uint32_t{0});
  const auto addPrintArgs = packed(b(0), a(0), std::uint32_t{64}, std::uint32_t{1});
  std::vector<std::byte> host(4096);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = std::byte(i * 7);

  std::vector<std::pair<std::string, std::vector<std::byte>>> out;
  auto seed = [&](std::string name, const SeedWriter& writer) {
    out.emplace_back(std::move(name), writer.bytes());
  };
  seed("launch_fill_then_read", SeedWriter(0)
                                    .add(launch(0, 1, fillArgs, 2, 32))
                                    .add(toHost(1, a(0), 0, 256, 1))
                                    .add(synchronize(ring::SynchronizeKind::kStream, 1, 2)));
  seed("copy_in_add_one_copy_out", SeedWriter(0, host)
                                       .add(toDevice(0, a(0), 0, 4096))
                                       .add(launch(1, 0, addArgs, 2, 32))
                                       .add(toHost(0, b(0), 4096, 256, 1))
                                       .add(synchronize(ring::SynchronizeKind::kContext, 0, 2)));
  ring::Memset memset;
  memset.destination = b(128);
  memset.count = 1000;
  memset.value = 0xabcd;
  memset.elementSize = 2;
  ring::Memset2D memset2d;
  memset2d.stream = 2;
  memset2d.destination = b(0);
  memset2d.pitch = 256;
  memset2d.width = 64;
  memset2d.height = 16;
  memset2d.value = 0x01020304;
  memset2d.elementSize = 4;
  seed("memsets_and_read_back", SeedWriter(0)
                                    .add(memset)
                                    .add(memset2d)
                                    .add(toHost(2, b(0), 0, 4096, 1))
                                    .add(synchronize(ring::SynchronizeKind::kStream, 2, 2)));
  ring::CopyDeviceToDevice copy;
  copy.stream = 1;
  copy.destination = b(4096);
  copy.source = a(0);
  copy.bytes = 4096;
  ring::EventRecord record;
  record.stream = 1;
  record.event = 0;
  ring::StreamWaitEvent wait;
  wait.stream = 2;
  wait.event = 0;
  seed("event_orders_two_streams", SeedWriter(0)
                                       .add(launch(0, 1, fillArgs, 1, 64))
                                       .add(copy)
                                       .add(record)
                                       .add(wait)
                                       .add(toHost(2, b(4096), 0, 1024, 1))
                                       .add(synchronize(ring::SynchronizeKind::kEvent, 0, 2))
                                       .add(synchronize(ring::SynchronizeKind::kStream, 2, 3)));
  // The same event recorded twice on a stream whose kernels the dispatcher still holds, and a
  // wait for the later record (an application recording one event per iteration): the waiting
  // stream was once forgotten when the earlier record was released, and never ran again.
  ring::LaunchKernel fillAgain = launch(0, 1, fillArgs, 1, 32);
  seed("event_recorded_twice_while_held",
       SeedWriter(0)
           .add(launch(1, 0, addArgs, 1, 32))
           .add(launch(1, 1, addArgs, 1, 32))
           .add(record)
           .add(fillAgain)
           .add(record)
           .add(wait)
           .add(toHost(2, a(0), 0, 256, 1))
           .add(synchronize(ring::SynchronizeKind::kStream, 2, 2)));
  ring::EventRecord second = record;
  second.event = 1;
  second.stream = 0;
  seed("queries", SeedWriter(0)
                      .add(launch(1, 1, addArgs, 1, 32))
                      .add(record)
                      .add(second)
                      .add(synchronize(ring::SynchronizeKind::kStream, 1, 1, true))
                      .add(synchronize(ring::SynchronizeKind::kEvent, 1, 2, true))
                      .add(synchronize(ring::SynchronizeKind::kEvent, 0, 3))
                      .add(synchronize(ring::SynchronizeKind::kContext, 0, 4)));
  seed("device_printf", SeedWriter(0)
                            .add(launch(1, 0, addPrintArgs, 1, 32))
                            .add(synchronize(ring::SynchronizeKind::kStream, 0, 1)));
  seed("module_variable", SeedWriter(0, host)
                              .add(toDevice(1, counter, 0, 256))
                              .add(launch(1, 1, addArgs, 2, 32))
                              .add(toHost(1, counter, 256, 256, 1))
                              .add(synchronize(ring::SynchronizeKind::kContext, 0, 2)));
  ring::LaunchKernel byReference = launch(0, 2, {}, 1, 32);
  byReference.parameterBytes = 16;
  byReference.parameterReference = ring::HostLocation{ring::HostRegion::kStaging, 512};
  std::vector<std::byte> referenced(1024);
  const auto realPointerless = packed(std::uint64_t{0}, std::uint32_t{5}, std::uint32_t{0});
  std::copy(realPointerless.begin(), realPointerless.end(), referenced.begin() + 512);
  seed("launch_by_reference", SeedWriter(0, referenced)
                                  .add(byReference)
                                  .add(synchronize(ring::SynchronizeKind::kStream, 2, 1)));
  seed("submit_message_region", SeedWriter(kSubmit, host)
                                    .add(toDevice(1, b(0), 0, 4096, 1, ring::HostRegion::kMessage))
                                    .add(launch(0, 1, fillArgs, 1, 32))
                                    .add(toHost(1, b(0), 0, 4096, 2, ring::HostRegion::kMessage))
                                    .add(synchronize(ring::SynchronizeKind::kStream, 1, 3)));
  // Host functions: one behind a kernel on stream 1, one on the NULL stream, and a copy behind the
  // first that must wait for it; the harness returns each once it is due.
  ring::HostFunction hostFunction;
  hostFunction.stream = 1;
  hostFunction.completionToken = 7;
  ring::HostFunction onNullStream;
  onNullStream.completionToken = 8;
  seed("host_functions", SeedWriter(0)
                             .add(launch(0, 1, fillArgs, 1, 32))
                             .add(hostFunction)
                             .add(onNullStream)
                             .add(toHost(1, a(0), 0, 256, 1))
                             .add(synchronize(ring::SynchronizeKind::kStream, 1, 2)));
  // Each GPU's stream waits for an event of the other's: the second GPU's stream for a record
  // behind a kernel on the first, and the first's non-blocking stream for a record on the second.
  // As the stub sends such a wait: a hold for the stream's GPU and a let-go for the event's.
  const ring::HoldForEvent holdOnSecondGpu{0, 2, 4, 1};
  const ring::LetGoAfterEvent afterFirstGpusEvent{0, 0, 0, 1, 2, 4};
  ring::EventRecord recordOnSecond;
  recordOnSecond.context = 2;
  recordOnSecond.stream = 4;
  recordOnSecond.event = 3;
  const ring::HoldForEvent holdOnFirstGpu{0, 0, 2, 2};
  const ring::LetGoAfterEvent afterSecondGpusEvent{0, 2, 3, 2, 0, 2};
  ring::Synchronize secondStream = synchronize(ring::SynchronizeKind::kStream, 4, 2);
  secondStream.context = 2;
  seed("waits_for_another_gpus_event", SeedWriter(0)
                                           .add(launch(0, 1, fillArgs, 2, 32))
                                           .add(record)
                                           .add(holdOnSecondGpu)
                                           .add(afterFirstGpusEvent)
                                           .add(recordOnSecond)
                                           .add(holdOnFirstGpu)
                                           .add(afterSecondGpusEvent)
                                           .add(toHost(2, a(0), 0, 256, 1))
                                           .add(secondStream)
                                           .add(synchronize(ring::SynchronizeKind::kStream, 2, 3)));
  // A client that exits without synchronising after its kernels printed.
  seed("device_printf_then_exit", SeedWriter(kTearDownBusy).add(launch(1, 1, addPrintArgs, 1, 32)));
  seed("teardown_with_work_queued", SeedWriter(kTearDownBusy, host)
                                        .add(toDevice(1, b(0), 0, 4096))
                                        .add(launch(1, 1, addArgs, 4, 32))
                                        .add(launch(0, 2, fillArgs, 4, 32))
                                        .add(toHost(2, a(0), 0, 4096, 1)));
  return out;
}

void writeSeeds(const char* directory) {
  std::filesystem::create_directories(directory);
  for (const auto& [name, bytes] : seeds()) {
    // A seed is a sequence the stub could send: every command of it must succeed.
    const RunResult result = runOne(bytes);
    if (result.failures != 0 || result.evicted) fail("seed " + name + " does not run cleanly");
    std::ofstream out(std::filesystem::path(directory) / (name + ".bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    require(out.good(), "cannot write a seed");
  }
  std::fprintf(stderr, "session_executor: wrote %zu seeds to %s\n", seeds().size(), directory);
}

}  // namespace
}  // namespace gpuproxy::server

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool seedsWritten = [] {
    if (const char* directory = std::getenv("GPUPROXY_WRITE_SEEDS")) {
      gpuproxy::server::writeSeeds(directory);
    }
    return true;
  }();
  (void)seedsWritten;
  gpuproxy::server::runOne(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size));
  return 0;
}
