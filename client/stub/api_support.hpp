#pragma once
// What every hand-written entry point shares: the exception barrier, the calling thread's
// current-context stack, and turning a CUstream into the (context, stream) pair the daemon wants.

#include <cuda.h>

#include <kj/exception.h>

#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <vector>

#include "client/stub/log.hpp"
#include "client/stub/runtime.hpp"

namespace gpuproxy::stub {

inline CUresult toResult(std::int32_t daemonResult) {
  return static_cast<CUresult>(daemonResult);
}

// Handles cross the C ABI as pointers; the daemon's are 64-bit values.
template <typename Handle>
std::uint64_t handleValue(Handle handle) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle));
}
template <typename Handle>
Handle toHandle(std::uint64_t value) {
  return reinterpret_cast<Handle>(static_cast<std::uintptr_t>(value));
}

// Runs body(runtime) for an entry point, with CUDA's answers for "no cuInit yet" and "daemon
// gone", and lets no exception reach the application.
template <typename Body>
CUresult guarded(const char* entryPoint, Body&& body) noexcept {
  Runtime* runtime = nullptr;
  try {
    runtime = Runtime::instance();
    if (runtime == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (runtime->connectionLost()) return CUDA_ERROR_MPS_CONNECTION_FAILED;
    return body(*runtime);
  } catch (const kj::Exception& error) {
    return runtime != nullptr ? runtime->failed(entryPoint, error)
                              : CUDA_ERROR_MPS_CONNECTION_FAILED;
  } catch (const std::bad_alloc&) {
    GPUPROXY_STUB_LOG(kError, "%s: out of host memory", entryPoint);
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& error) {
    GPUPROXY_STUB_LOG(kError, "%s: internal error: %s", entryPoint, error.what());
    return CUDA_ERROR_UNKNOWN;
  } catch (...) {
    GPUPROXY_STUB_LOG(kError, "%s: internal error", entryPoint);
    return CUDA_ERROR_UNKNOWN;
  }
}

// ---- current context (per thread, as in CUDA) ------------------------------------------------

// The calling thread's context stack; the back is the current context.
std::vector<std::uint64_t>& contextStack();

// 0 when the thread has no current context.
inline std::uint64_t currentContext() {
  const auto& stack = contextStack();
  return stack.empty() ? 0 : stack.back();
}

// Forgets the calling thread's per-thread default stream of `context` (the daemon dropped it).
void forgetPerThreadStream(std::uint64_t context);

// Runs and drops the runtime's context-local storage of `context` (cuGetExportTable), when the
// context is destroyed or reset.
void releaseContextLocalStorage(std::uint64_t context);

// ---- streams ---------------------------------------------------------------------------------

// What the NULL stream means to an entry point: the context's legacy stream, or (for the _ptds
// and _ptsz variants) the calling thread's per-thread default stream.
enum class NullStream { kLegacy, kPerThread };

// CUDA_ERROR_INVALID_CONTEXT when a default stream is named without a current context,
// CUDA_ERROR_INVALID_HANDLE for a stream this process does not have.
CUresult resolveStream(Runtime& runtime, CUstream stream, NullStream nullStream,
                       StreamTarget& target);

// An event record on `target` (cuEventRecordWithFlags's checks, `flags` included), filled into
// `record` without sending it, and its sending; apart, so that a launch that records events
// (cuLaunchKernelEx's event attributes) refuses a bad event before the kernel is queued.
CUresult prepareEventRecord(Runtime& runtime, CUevent event, const StreamTarget& target,
                            unsigned flags, protocol::ring::EventRecord& record);
CUresult submitEventRecord(Runtime& runtime, const protocol::ring::EventRecord& record);

// The context of the device allocation holding `pointer`, when it is one device's memory; nullopt
// for memory every device reaches (pinned, managed) or that is not an allocation.
std::optional<std::uint64_t> allocationContext(Runtime& runtime, CUdeviceptr pointer);

// A copy or memset of memory of another device than `target`'s stream (CUDA's unified addressing
// lets any stream copy to, from or set any device's memory). No device reaches another's memory
// through gpuproxy, so it runs in the memory's own device's NULL stream, after the stream's
// earlier work, and has completed when the call returns, which an asynchronous call may also do:
// beginOnOwnDevice drains the stream and sets `where` (left empty when `pointer` is the stream's
// device's memory, or every device's: the caller queues on the stream itself), the caller queues
// the operation on `where`, and finishOnOwnDevice waits for it.
CUresult beginOnOwnDevice(Runtime& runtime, const StreamTarget& target, CUdeviceptr pointer,
                          std::optional<StreamTarget>& where);
CUresult finishOnOwnDevice(Runtime& runtime, const StreamTarget& where);

// Queues a copy of `bytes` from `source` to `destination`, both device memory, on `where`.
CUresult enqueueDeviceToDevice(Runtime& runtime, const StreamTarget& where,
                               std::uint64_t destination, std::uint64_t source,
                               std::uint64_t bytes);

}  // namespace gpuproxy::stub
