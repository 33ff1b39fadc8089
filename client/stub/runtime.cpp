#include "client/stub/runtime.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include "client/stub/data_plane.hpp"
#include "client/stub/log.hpp"
#include "client/stub/ring_sink.hpp"
#include "client/stub/rpc_sink.hpp"
#include "client/stub/stream_capture.hpp"
#include "ipc/shared_segment.hpp"
#include "ipc/unix_socket.hpp"
#include "protocol/byte_size.hpp"
#include "protocol/cuda_result.hpp"
#include "protocol/limits.hpp"

namespace gpuproxy::stub {

namespace {

// A daemon that accepts the connection but never answers attach must not hang cuInit forever.
constexpr kj::Duration kAttachTimeout = 30 * kj::SECONDS;

// Room reserved beyond the heap for the rest of the segment (rings, staging area); when the
// daemon needs more it says how much and the stub reserves again.
constexpr std::uint64_t kSegmentAllowance = std::uint64_t{64} << 20;
// Addresses tried before giving up on a pinned heap.
constexpr int kMappingAttempts = 8;

// The pinned heap to ask the daemon for: GPUPROXY_PINNED_HEAP (a size such as 512MiB; 0 for
// none), else the default. The daemon may grant less.
std::uint64_t pinnedHeapRequest() {
  const char* text = std::getenv("GPUPROXY_PINNED_HEAP");
  if (text == nullptr || *text == '\0') return protocol::kDefaultPinnedHeapBytes;
  if (auto bytes = protocol::parseByteSize(text)) return *bytes;
  GPUPROXY_STUB_LOG(kWarn, "GPUPROXY_PINNED_HEAP=%s is not a size (try 512MiB); using %llu bytes",
                    text, static_cast<unsigned long long>(protocol::kDefaultPinnedHeapBytes));
  return protocol::kDefaultPinnedHeapBytes;
}

// constinit: no constructor runs when the library loads, and nothing is torn down at exit.
constinit std::atomic<Runtime*> gInstance{nullptr};
constinit std::atomic<bool> gForkedChild{false};
constinit std::mutex gInitMutex;

std::string socketPath() {
  const char* path = std::getenv("GPUPROXY_SOCKET");
  return path != nullptr && *path != '\0' ? path : protocol::kDefaultClientSocket;
}

// The loop thread keeps running code from this library until the process ends, so the library
// must never be unmapped: an application (or a test) that dlopens the stub and later dlcloses it
// would otherwise crash in the loop thread.
void pinLibrary() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&pinLibrary), &info) != 0 && info.dli_fname != nullptr) {
    // The handle is leaked on purpose: RTLD_NODELETE is what we want from it.
    [[maybe_unused]] void* handle =
        ::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  }
}

void onForkChild() {
  gForkedChild.store(true, std::memory_order_release);
}

}  // namespace

Runtime* Runtime::instance() noexcept {
  if (gForkedChild.load(std::memory_order_acquire)) return nullptr;
  return gInstance.load(std::memory_order_acquire);
}

CUresult Runtime::initialize() {
  if (gForkedChild.load(std::memory_order_acquire)) {
    GPUPROXY_STUB_LOG(kError, "cuInit in a child forked after cuInit: CUDA cannot be used there");
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  if (Runtime* runtime = gInstance.load(std::memory_order_acquire)) {
    return runtime->connectionLost() ? CUDA_ERROR_MPS_CONNECTION_FAILED : CUDA_SUCCESS;
  }
  // gpuproxyd marks its own environment: if the loader handed it this stub instead of NVIDIA's
  // driver (an LD_LIBRARY_PATH meant for clients), the daemon must not become a client of itself
  // or of another daemon.
  if (const char* inside = std::getenv("GPUPROXY_INSIDE_DAEMON"); inside && *inside == '1') {
    GPUPROXY_STUB_LOG(kError,
                      "gpuproxyd loaded the gpuproxy stub instead of the NVIDIA driver's "
                      "libcuda.so.1 (check LD_LIBRARY_PATH): refusing to proxy to another daemon");
    return CUDA_ERROR_NO_DEVICE;
  }
  std::lock_guard lock(gInitMutex);
  if (Runtime* runtime = gInstance.load(std::memory_order_acquire)) {
    return runtime->connectionLost() ? CUDA_ERROR_MPS_CONNECTION_FAILED : CUDA_SUCCESS;
  }
  std::unique_ptr<Runtime> runtime(new Runtime(socketPath()));
  StartOutcome outcome = runtime->start();
  if (outcome.result != CUDA_SUCCESS) {
    if (outcome.unreachable) {
      GPUPROXY_STUB_LOG(kError,
                        "cannot reach gpuproxyd at %s: %s (set GPUPROXY_SOCKET to the daemon's "
                        "client socket)",
                        runtime->socketPath_.c_str(), outcome.reason.c_str());
    } else {
      GPUPROXY_STUB_LOG(kError, "gpuproxyd at %s refused to attach: %s",
                        runtime->socketPath_.c_str(), outcome.reason.c_str());
    }
    return outcome.result;
  }
  GPUPROXY_STUB_LOG(kInfo, "attached to gpuproxyd at %s (backend %s, %zu device(s), driver %d)",
                    runtime->socketPath_.c_str(), runtime->backend_.c_str(),
                    runtime->devices_.size(), runtime->driverVersion_);
  pinLibrary();
  static std::once_flag atforkOnce;
  std::call_once(atforkOnce, [] { ::pthread_atfork(nullptr, nullptr, &onForkChild); });
  // Leaked on purpose: applications call cuMemFree and friends from static destructors and
  // atexit handlers, in an order nobody controls, so the connection must outlive all of them.
  // Tearing down the loop thread at exit could only turn those calls into errors or hangs; the
  // kernel closes the socket when the process ends and the daemon then frees the session.
  gInstance.store(runtime.release(), std::memory_order_release);
  return CUDA_SUCCESS;
}

Runtime::Runtime(std::string socketPath)
    : socketPath_(std::move(socketPath)),
      rpcSink_(std::make_unique<RpcSink>(*this)),
      transport_(rpcSink_.get()),
      capturing_(std::make_unique<CapturingSink>(transport_)) {}

PinnedHeap* Runtime::pinnedHeap() const noexcept {
  return dataPlane_ && dataPlane_->pinnedHeap().usable() ? &dataPlane_->pinnedHeap() : nullptr;
}

Runtime::~Runtime() {
  // Only reached when start() failed, after the loop thread has exited.
  if (loopThread_.joinable()) loopThread_.join();
}

Runtime::StartOutcome Runtime::start() {
  std::promise<StartOutcome> ready;
  std::future<StartOutcome> outcome = ready.get_future();
  // The loop thread is ours, not the application's: it must not run the application's signal
  // handlers, and in particular must see a write to a dead daemon fail with EPIPE instead of
  // raising SIGPIPE. It inherits the signal mask of the thread that creates it.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  try {
    loopThread_ = std::thread([this, &ready] { loopMain(ready); });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  StartOutcome result = outcome.get();
  if (result.result != CUDA_SUCCESS) loopThread_.join();
  return result;
}

void Runtime::loopMain(std::promise<StartOutcome>& ready) {
  bool reported = false;
  auto report = [&](StartOutcome outcome) {
    if (!reported) ready.set_value(std::move(outcome));
    reported = true;
  };
  try {
    // kj sets SIGPIPE to SIG_IGN process-wide when it creates an event port. The application's
    // signal dispositions are not ours to change: put it back (this thread blocks SIGPIPE).
    struct sigaction sigpipe {};
    ::sigaction(SIGPIPE, nullptr, &sigpipe);
    kj::AsyncIoContext io = kj::setupAsyncIo();
    ::sigaction(SIGPIPE, &sigpipe, nullptr);

    int fd;
    try {
      fd = ipc::connectUnixSocket(socketPath_).release();
    } catch (const std::system_error& error) {
      report({CUDA_ERROR_NO_DEVICE, true, error.code().message()});  // the kernel's words
      return;
    } catch (const std::exception& error) {
      report({CUDA_ERROR_NO_DEVICE, true, error.what()});
      return;
    }
    kj::Own<kj::AsyncCapabilityStream> stream =
        io.lowLevelProvider->wrapUnixSocketFd(fd, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP |
                                                      kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC);
    capnp::TwoPartyClient client(*stream, protocol::kMaxFdsPerMessage);
    auto gateway = client.bootstrap().castAs<protocol::Gateway>();
    auto request = gateway.attachRequest();
    request.setProtocolVersion(protocol::PROTOCOL_VERSION);
    auto response =
        io.provider->getTimer().timeoutAfter(kAttachTimeout, request.send()).wait(io.waitScope);

    const auto result = static_cast<CUresult>(response.getResult());
    if (result != CUDA_SUCCESS) {
      report({result, false,
              std::string(protocol::cudaResultNameOr(result, "unknown CUresult")) +
                  " (protocol version " + std::to_string(protocol::PROTOCOL_VERSION) + ")"});
      return;
    }
    driverVersion_ = response.getDriverVersion();
    backend_ = response.getBackend().cStr();
    for (auto device : response.getDevices()) {
      DeviceRecord record;
      record.name = device.getName().cStr();
      auto uuid = device.getUuid();
      std::memcpy(record.uuid.data(), uuid.begin(), std::min(uuid.size(), record.uuid.size()));
      record.totalMemory = device.getTotalMemory();
      if (device.hasStreamPriorities()) {
        record.leastStreamPriority = device.getStreamPriorities().getLeast();
        record.greatestStreamPriority = device.getStreamPriorities().getGreatest();
      }
      for (auto attribute : device.getAttributes()) {
        record.attributes[attribute.getAttribute()] = attribute.getValue();
      }
      devices_.push_back(std::move(record));
    }
    protocol::Session::Client session = response.getSession();
    session_ = &session;
    executor_ = kj::getCurrentThreadExecutor().addRef();
    openDataPlane(io.waitScope, session);
    fitDeviceAttributes();

    kj::Promise<void> watch =
        client.onDisconnect()
            .then([this]() { markLost("gpuproxyd closed the connection"); },
                  [this](kj::Exception&& error) { markLost(error.getDescription().cStr()); })
            .eagerlyEvaluate(nullptr);
    report({CUDA_SUCCESS, false, {}});
    // Serve executeSync calls until the process ends.
    kj::NEVER_DONE.wait(io.waitScope);
  } catch (const kj::Exception& error) {
    if (reported) markLost(error.getDescription().cStr());
    report({CUDA_ERROR_NO_DEVICE, true, error.getDescription().cStr()});
  } catch (const std::exception& error) {
    if (reported) markLost(error.what());
    report({CUDA_ERROR_NO_DEVICE, true, error.what()});
  }
}

void Runtime::fitDeviceAttributes() {
  for (DeviceRecord& device : devices_) {
    for (CUdevice_attribute unreachable :
         {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
          CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES}) {
      auto found = device.attributes.find(static_cast<int>(unreachable));
      if (found != device.attributes.end()) found->second = 0;
    }
    if (pinnedHeap() == nullptr) device.attributes[CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY] = 0;
    device.attributes[CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES] =
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    device.attributes[CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED] = 1;
    // Virtual memory (virtual_memory.cpp) is shared with other processes of the tenant through a
    // file descriptor, never a fabric handle; not compressed, not for RDMA.
    device.attributes[CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED] = 1;
    for (CUdevice_attribute unserved :
         {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
          CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED,
          CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED}) {
      device.attributes[static_cast<int>(unserved)] = 0;
    }
  }
}

void Runtime::openDataPlane(kj::WaitScope& waitScope, protocol::Session::Client& session) {
  const char* transport = std::getenv("GPUPROXY_TRANSPORT");
  const std::string_view choice = transport != nullptr ? transport : "";
  if (choice == "rpc") {
    GPUPROXY_STUB_LOG(kInfo, "GPUPROXY_TRANSPORT=rpc: every call goes over the control socket");
    return;
  }
  if (!choice.empty() && choice != "ring") {
    GPUPROXY_STUB_LOG(kWarn, "GPUPROXY_TRANSPORT=%s is neither 'ring' nor 'rpc'; using the ring",
                      transport);
  }
  try {
    // The pinned heap needs the segment at one address in both processes: reserve room here,
    // let the daemon map it at the same address, then map it over the reservation. A few tries
    // at other addresses when the daemon has that one in use; then no pinned heap.
    const std::uint64_t heapBytes = pinnedHeapRequest();
    std::optional<ipc::AddressReservation> reservation;
    std::optional<capnp::Response<protocol::Session::OpenDataPlaneResults>> answer;
    std::uint64_t reserveBytes = heapBytes + kSegmentAllowance;
    std::uintptr_t hint = ipc::AddressReservation::randomHint();
    for (int attempt = 0; heapBytes > 0 && attempt < kMappingAttempts && !answer; ++attempt) {
      try {
        reservation = ipc::AddressReservation::reserve(reserveBytes, hint);
      } catch (const std::system_error& error) {
        GPUPROXY_STUB_LOG(kWarn, "no room for a pinned heap in this process (%s)", error.what());
        reservation.reset();
        break;
      }
      auto request = session.openDataPlaneRequest();
      request.setPinnedHeapBytes(heapBytes);
      request.setAddress(reinterpret_cast<std::uintptr_t>(reservation->address()));
      request.setReservedBytes(reservation->size());
      auto response = request.send().wait(waitScope);
      const auto result = static_cast<CUresult>(response.getResult());
      if (result == CUDA_SUCCESS) {
        answer = std::move(response);
      } else if (result == CUDA_ERROR_INVALID_VALUE &&
                 response.getSegmentBytes() > reservation->size()) {
        reserveBytes = response.getSegmentBytes();  // the same place, bigger
      } else if (result == CUDA_ERROR_ALREADY_MAPPED) {
        hint = ipc::AddressReservation::randomHint();
      } else {
        throw std::runtime_error("gpuproxyd answered " + std::string(protocol::cudaResultNameOr(
                                                             result, "unknown CUresult")));
      }
    }
    if (!answer) {
      if (heapBytes > 0) {
        GPUPROXY_STUB_LOG(kWarn,
                          "no address for the pinned heap suits both this process and gpuproxyd; "
                          "pinned memory stays local to this process");
      }
      reservation.reset();
      auto response = session.openDataPlaneRequest().send().wait(waitScope);
      const auto result = static_cast<CUresult>(response.getResult());
      if (result != CUDA_SUCCESS) {
        throw std::runtime_error("gpuproxyd answered " + std::string(protocol::cudaResultNameOr(
                                                             result, "unknown CUresult")));
      }
      answer = std::move(response);
    }
    auto& response = *answer;
    // The descriptor belongs to the capability (and goes when it does): keep a copy of our own.
    auto takeFd = [&](protocol::SharedFile::Client file, const char* what) {
      kj::Maybe<int> received = file.getFd().wait(waitScope);
      KJ_IF_MAYBE (fd, received) {
        const int copy = ::fcntl(*fd, F_DUPFD_CLOEXEC, 0);
        if (copy < 0) throw std::system_error(errno, std::generic_category(), "dup");
        return ipc::UniqueFd(copy);
      }
      throw std::runtime_error(std::string("the ") + what + " arrived without a descriptor");
    };
    ipc::UniqueFd segmentFd = takeFd(response.getSegment(), "segment");
    std::vector<ipc::UniqueFd> doorbells;
    for (protocol::SharedFile::Client doorbell : response.getDoorbells()) {
      doorbells.push_back(takeFd(doorbell, "doorbell"));
    }
    ipc::SharedSegment segment =
        reservation ? ipc::SharedSegment::map(std::move(segmentFd), response.getSegmentBytes(),
                                              *reservation)
                    : ipc::SharedSegment::map(std::move(segmentFd), response.getSegmentBytes());
    dataPlane_ = std::make_unique<DataPlane>(std::move(segment), std::move(doorbells), lost_);
    ringSink_ = std::make_unique<RingSink>(*dataPlane_, *rpcSink_);
    transport_ = ringSink_.get();
    GPUPROXY_STUB_LOG(kDebug, "asynchronous calls go through the shared-memory ring");
  } catch (const kj::Exception& error) {
    GPUPROXY_STUB_LOG(kWarn, "no shared-memory data plane (%s); every call goes over RPC",
                      error.getDescription().cStr());
  } catch (const std::exception& error) {
    GPUPROXY_STUB_LOG(kWarn, "no shared-memory data plane (%s); every call goes over RPC",
                      error.what());
  }
}

void Runtime::markLost(const std::string& reason) noexcept {
  if (lost_.exchange(true, std::memory_order_acq_rel)) return;
  GPUPROXY_STUB_LOG(kError,
                    "lost the connection to gpuproxyd at %s: %s; CUDA calls now fail with "
                    "CUDA_ERROR_MPS_CONNECTION_FAILED",
                    socketPath_.c_str(), reason.c_str());
}

CUresult Runtime::failed(const char* entryPoint, const kj::Exception& exception) noexcept {
  try {
    switch (exception.getType()) {
      case kj::Exception::Type::UNIMPLEMENTED:
        GPUPROXY_STUB_LOG(kWarn, "%s: gpuproxyd does not implement this call: %s", entryPoint,
                          exception.getDescription().cStr());
        return CUDA_ERROR_NOT_SUPPORTED;
      case kj::Exception::Type::DISCONNECTED:
        markLost(exception.getDescription().cStr());
        return CUDA_ERROR_MPS_CONNECTION_FAILED;
      default:
        // The schema's convention: the daemon answers a client's mistakes with a CUresult, so an
        // exception is a broken transport (or a daemon bug). Either way the call did not happen.
        GPUPROXY_STUB_LOG(kError, "%s: call to gpuproxyd failed: %s", entryPoint,
                          exception.getDescription().cStr());
        return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
  } catch (...) {
    return CUDA_ERROR_MPS_CONNECTION_FAILED;
  }
}

// ---- handle tables -------------------------------------------------------------------------

void Runtime::addContext(std::uint64_t context, ContextRecord record) {
  // Before anyone can name it: its records go into its device's command ring.
  if (dataPlane_) dataPlane_->noteContext(context, record.device);
  std::lock_guard lock(tablesMutex_);
  contexts_[context] = record;
}

std::optional<ContextRecord> Runtime::context(std::uint64_t context) const {
  std::shared_lock lock(tablesMutex_);
  auto found = contexts_.find(context);
  if (found == contexts_.end()) return std::nullopt;
  return found->second;
}

std::optional<std::uint64_t> Runtime::primaryContext(std::uint32_t device) const {
  std::shared_lock lock(tablesMutex_);
  for (const auto& [handle, record] : contexts_) {
    if (record.primary && record.device == device) return handle;
  }
  return std::nullopt;
}

void Runtime::forgetContextResources(std::uint64_t context, bool destroyed) {
  // Before tablesMutex_ is taken: the data plane's lock is never taken inside it.
  if (destroyed && dataPlane_) dataPlane_->forgetContextRing(context);
  tablesEpoch_.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard lock(tablesMutex_);
  auto dropOwnedBy = [context](auto& table, auto ownerOf) {
    for (auto it = table.begin(); it != table.end();) {
      it = ownerOf(it->second) == context ? table.erase(it) : std::next(it);
    }
  };
  auto plain = [](std::uint64_t owner) { return owner; };
  dropOwnedBy(streams_, [](const StreamRecord& record) { return record.context; });
  dropOwnedBy(events_, plain);
  dropOwnedBy(modules_, plain);
  dropOwnedBy(functions_,
              [](const std::shared_ptr<const KernelRecord>& record) { return record->context; });
  {
    std::lock_guard allocationsLock(allocationsMutex_);
    // Managed memory is the process's pinned heap's, and virtual memory mapped with access is the
    // process's too (cuCtxDestroy leaves cuMemCreate's memory alone): neither goes with a context.
    std::erase_if(allocations_, [&](const auto& entry) {
      return entry.second.context == context && !entry.second.managed &&
             !virtualMemory_.mappingAt(entry.first);
    });
  }
  if (destroyed) {
    contexts_.erase(context);
  } else if (auto found = contexts_.find(context); found != contexts_.end()) {
    found->second.generation = newGeneration();
    found->second.limits.clear();
  }
}

void Runtime::addStream(std::uint64_t stream, StreamRecord record) {
  std::lock_guard lock(tablesMutex_);
  streams_[stream] = record;
}

std::optional<StreamRecord> Runtime::stream(std::uint64_t stream) const {
  std::shared_lock lock(tablesMutex_);
  auto found = streams_.find(stream);
  if (found == streams_.end()) return std::nullopt;
  return found->second;
}

std::optional<std::uint64_t> Runtime::streamContext(std::uint64_t stream) const {
  std::optional<StreamRecord> record = this->stream(stream);
  if (!record) return std::nullopt;
  return record->context;
}

void Runtime::forgetStream(std::uint64_t stream) {
  std::lock_guard lock(tablesMutex_);
  streams_.erase(stream);
}

void Runtime::addEvent(std::uint64_t event, std::uint64_t context) {
  std::lock_guard lock(tablesMutex_);
  events_[event] = context;
}

std::optional<std::uint64_t> Runtime::eventContext(std::uint64_t event) const {
  std::shared_lock lock(tablesMutex_);
  auto found = events_.find(event);
  if (found == events_.end()) return std::nullopt;
  return found->second;
}

void Runtime::forgetEvent(std::uint64_t event) {
  std::lock_guard lock(tablesMutex_);
  events_.erase(event);
}

void Runtime::addModule(std::uint64_t module, std::uint64_t context) {
  std::lock_guard lock(tablesMutex_);
  modules_[module] = context;
}

std::optional<std::uint64_t> Runtime::moduleContext(std::uint64_t module) const {
  std::shared_lock lock(tablesMutex_);
  auto found = modules_.find(module);
  if (found == modules_.end()) return std::nullopt;
  return found->second;
}

void Runtime::forgetModule(std::uint64_t module) {
  tablesEpoch_.fetch_add(1, std::memory_order_acq_rel);
  {
    std::lock_guard lock(tablesMutex_);
    modules_.erase(module);
    for (auto it = functions_.begin(); it != functions_.end();) {
      it = it->second->module == module ? functions_.erase(it) : std::next(it);
    }
  }
  std::lock_guard lock(allocationsMutex_);
  std::erase_if(allocations_,
                [module](const auto& entry) { return entry.second.module == module; });
}

void Runtime::addFunction(std::uint64_t function, std::shared_ptr<const KernelRecord> record) {
  std::lock_guard lock(tablesMutex_);
  functions_[function] = std::move(record);
}

std::shared_ptr<const KernelRecord> Runtime::function(std::uint64_t function) const {
  std::shared_lock lock(tablesMutex_);
  auto found = functions_.find(function);
  if (found == functions_.end()) return nullptr;
  return found->second;
}

// ---- device allocations ----------------------------------------------------------------------

void Runtime::addAllocation(std::uint64_t pointer, std::uint64_t bytes, std::uint64_t context,
                            bool managed) {
  std::lock_guard lock(allocationsMutex_);
  allocations_[pointer] = Allocation{bytes, context, 0, newBufferId(), managed};
}

void Runtime::addModuleVariable(std::uint64_t pointer, std::uint64_t bytes, std::uint64_t context,
                                std::uint64_t module) {
  std::lock_guard lock(allocationsMutex_);
  // Asked for again, a variable keeps its buffer id.
  auto known = allocations_.find(pointer);
  const std::uint64_t id = known != allocations_.end() && known->second.module == module
                               ? known->second.bufferId
                               : newBufferId();
  allocations_[pointer] = Allocation{bytes, context, module, id};
}

void Runtime::forgetAllocation(std::uint64_t pointer) {
  std::lock_guard lock(allocationsMutex_);
  allocations_.erase(pointer);
}

bool Runtime::ownsRange(std::uint64_t pointer, std::uint64_t bytes) const {
  std::shared_lock lock(allocationsMutex_);
  auto after = allocations_.upper_bound(pointer);
  if (after == allocations_.begin()) return false;
  const auto& [start, allocation] = *std::prev(after);
  const std::uint64_t offset = pointer - start;
  return offset < allocation.bytes && bytes <= allocation.bytes - offset;
}

std::optional<AllocationRange> Runtime::allocationContaining(std::uint64_t pointer) const {
  std::shared_lock lock(allocationsMutex_);
  auto after = allocations_.upper_bound(pointer);
  if (after == allocations_.begin()) return std::nullopt;
  const auto& [start, allocation] = *std::prev(after);
  if (pointer - start >= allocation.bytes) return std::nullopt;
  return AllocationRange{start, allocation.bytes, allocation.context, allocation.bufferId,
                         allocation.managed};
}

}  // namespace gpuproxy::stub
