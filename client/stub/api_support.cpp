#include "client/stub/api_support.hpp"

#include <unordered_map>
#include <variant>

namespace gpuproxy::stub {

namespace {

struct PerThreadStream {
  std::uint64_t stream = 0;
  std::uint64_t generation = 0;  // the context's generation when the stream was made
};

// Everything CUDA keeps per host thread. A function-local thread_local: built on the thread's
// first CUDA call, destroyed when the thread exits.
struct ThreadState {
  std::vector<std::uint64_t> contextStack;
  std::unordered_map<std::uint64_t, PerThreadStream> perThreadStreams;  // context -> stream

  ThreadState() = default;
  ThreadState(const ThreadState&) = delete;
  ThreadState& operator=(const ThreadState&) = delete;

  // A thread's default streams die with it, as in CUDA; otherwise a program that runs many
  // short-lived threads would pile up streams in the daemon until it exits.
  ~ThreadState() {
    if (perThreadStreams.empty()) return;
    Runtime* runtime = Runtime::instance();
    if (runtime == nullptr || runtime->connectionLost()) return;
    for (const auto& [context, entry] : perThreadStreams) {
      try {
        const std::uint64_t stream = entry.stream;
        runtime->post([stream](protocol::Session::Client& session) {
          auto request = session.destroyStreamRequest();
          request.setStream(stream);
          return request.send().ignoreResult();
        });
      } catch (...) {
        // Best effort: the daemon frees the stream with the session anyway.
      }
    }
  }
};

ThreadState& threadState() {
  thread_local ThreadState state;
  return state;
}

CUresult perThreadStream(Runtime& runtime, std::uint64_t context, std::uint64_t& stream) {
  std::optional<ContextRecord> record = runtime.context(context);
  if (!record) return CUDA_ERROR_INVALID_CONTEXT;
  auto& streams = threadState().perThreadStreams;
  if (auto found = streams.find(context);
      found != streams.end() && found->second.generation == record->generation) {
    stream = found->second.stream;
    return CUDA_SUCCESS;
  }
  struct Created {
    CUresult result;
    std::uint64_t stream;
  };
  Created created = runtime.call([&](protocol::Session::Client& session) {
    auto request = session.createStreamRequest();
    request.setContext(context);
    request.setFlags(0);
    request.setPriority(0);
    return request.send().then([](auto response) {
      return Created{toResult(response.getResult()), response.getStream()};
    });
  });
  if (created.result != CUDA_SUCCESS) return created.result;
  streams[context] = PerThreadStream{created.stream, record->generation};
  GPUPROXY_STUB_LOG(kDebug, "per-thread default stream %#llx for context %#llx",
                    static_cast<unsigned long long>(created.stream),
                    static_cast<unsigned long long>(context));
  stream = created.stream;
  return CUDA_SUCCESS;
}

}  // namespace

std::vector<std::uint64_t>& contextStack() {
  return threadState().contextStack;
}

void forgetPerThreadStream(std::uint64_t context) {
  threadState().perThreadStreams.erase(context);
}

CUresult resolveStream(Runtime& runtime, CUstream stream, NullStream nullStream,
                       StreamTarget& target) {
  const std::uint64_t value = handleValue(stream);
  const bool perThread = value == handleValue(CU_STREAM_PER_THREAD) ||
                         (value == 0 && nullStream == NullStream::kPerThread);
  const bool legacy = value == handleValue(CU_STREAM_LEGACY) || (value == 0 && !perThread);
  if (legacy || perThread) {
    target.context = currentContext();
    if (target.context == 0) return CUDA_ERROR_INVALID_CONTEXT;
    target.stream = 0;
    return perThread ? perThreadStream(runtime, target.context, target.stream) : CUDA_SUCCESS;
  }
  std::optional<std::uint64_t> context = runtime.streamContext(value);
  if (!context) return CUDA_ERROR_INVALID_HANDLE;
  target.context = *context;
  target.stream = value;
  return CUDA_SUCCESS;
}

std::optional<std::uint64_t> allocationContext(Runtime& runtime, CUdeviceptr pointer) {
  std::optional<AllocationRange> range = runtime.allocationContaining(pointer);
  if (!range || range->managed) return std::nullopt;
  return range->context;
}

CUresult beginOnOwnDevice(Runtime& runtime, const StreamTarget& target, CUdeviceptr pointer,
                          std::optional<StreamTarget>& where) {
  where.reset();
  const std::optional<std::uint64_t> owner = allocationContext(runtime, pointer);
  if (!owner || *owner == target.context) return CUDA_SUCCESS;
  const std::optional<ContextRecord> ownerRecord = runtime.context(*owner);
  const std::optional<ContextRecord> targetRecord = runtime.context(target.context);
  if (!ownerRecord || !targetRecord || ownerRecord->device == targetRecord->device) {
    return CUDA_SUCCESS;
  }
  if (std::optional<CUresult> refused = runtime.capturing().captures().unsupported(target.stream)) {
    return *refused;  // a graph has no node for it
  }
  if (CUresult drained = runtime.commands().synchronize(
          target.context, protocol::ring::SynchronizeKind::kStream, target.stream,
          /*query=*/false);
      drained != CUDA_SUCCESS) {
    return drained;
  }
  where = StreamTarget{*owner, 0};
  return CUDA_SUCCESS;
}

CUresult finishOnOwnDevice(Runtime& runtime, const StreamTarget& where) {
  return runtime.commands().synchronize(where.context, protocol::ring::SynchronizeKind::kStream,
                                        where.stream, /*query=*/false);
}

CUresult enqueueDeviceToDevice(Runtime& runtime, const StreamTarget& where,
                               std::uint64_t destination, std::uint64_t source,
                               std::uint64_t bytes) {
  protocol::ring::Command command{protocol::ring::CopyDeviceToDevice{}};
  auto& copy = std::get<protocol::ring::CopyDeviceToDevice>(command);
  copy.context = where.context;
  copy.stream = where.stream;
  copy.destination = destination;
  copy.source = source;
  copy.bytes = bytes;
  return runtime.commands().enqueue(command);
}

}  // namespace gpuproxy::stub
