#include "server/backend/cuda/cuda_backend.hpp"

#include "protocol/overloaded.hpp"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "server/backend/cuda/completion_thread.hpp"
#include "server/backend/cuda/driver_api.hpp"
#include "server/backend/ptx/ptx_parser.hpp"

namespace gpuproxy::server::cuda {
namespace {

using backend::CompletionCallback;
using backend::DeviceProperties;
using backend::FunctionInfo;
using backend::KernelCallback;
using backend::KernelParameter;
using backend::LaunchConfig;
using backend::MemoryInfo;
using backend::Result;

// How long destroying a Device waits for queued work that still owes a callback.
constexpr std::chrono::seconds kShutdownGrace{10};
// Notifier streams per device (see DeviceCore::pickNotifier).
constexpr std::size_t kMaxNotifiers = 4;
// Bounds the cuFuncGetParamInfo loop: the driver refuses kernels with more parameter space.
constexpr std::size_t kMaxKernelParameters = ptx::kMaxParameterBytes;
// Packed kernel parameters up to this size are staged on the stack.
constexpr std::size_t kInlineParameterBytes = 4096;

// Makes a context current on the calling thread for one call and restores the previous one, so
// one owner thread can serve several devices.
class ContextGuard {
public:
  ContextGuard(const DriverApi& api, CUcontext context)
      : api_(api), status_(api.ctxPushCurrent(context)) {}
  ~ContextGuard() {
    if (status_ == CUDA_SUCCESS) {
      CUcontext popped = nullptr;
      api_.ctxPopCurrent(&popped);
    }
  }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

  bool ok() const { return status_ == CUDA_SUCCESS; }
  CUresult status() const { return status_; }

private:
  const DriverApi& api_;
  CUresult status_;
};

// Where a stream runs. Without an SM partition everything is in the primary context. With one,
// best-effort and latency-critical streams are each in a green context of their own (the
// primary context's work is not confined to any partition, so keeping either class there would
// let it spill onto the other's SMs); the primary context keeps only the daemon's notifier
// streams, which run no kernels.
enum class Lane : std::uint8_t { kPrimary = 0, kBestEffort = 1, kLatencyCritical = 2 };
constexpr std::size_t kLanes = 3;

std::size_t laneIndex(Lane lane) {
  return static_cast<std::size_t>(lane);
}

// Two timing-enabled events recorded around a kernel. Pooled: creating events per launch would
// cost more than the launch.
struct TimingPair {
  CUevent start = nullptr;
  CUevent end = nullptr;
  std::uint64_t generation = 0;  // of the context they belong to
  Lane lane = Lane::kPrimary;    // whose context made them
};

// A green context of the partition.
struct GreenLane {
  CUgreenCtx green = nullptr;
  CUcontext context = nullptr;  // cuCtxFromGreenCtx's: what is made current to use it
  CUstream probe = nullptr;     // queried for a sticky error (see DeviceCore::probe)
  unsigned sms = 0;
};

// What a device's objects share: the driver, the primary context, the green contexts of an SM
// partition, the sticky error, the completion thread, pooled timing events and the notifier
// streams. Streams, events and modules hold it by shared_ptr so that one outliving its Device (a
// caller bug) cannot reach freed memory. Work queued on the completion thread refers to it by
// plain pointer: the completion thread is stopped before any member goes.
class DeviceCore {
public:
  DeviceCore(std::shared_ptr<const DriverApi> api, int index, CUdevice device,
             backend::DeviceOptions options)
      : api_(std::move(api)),
        index_(index),
        device_(device),
        options_(options),
        completion_("gpuproxy-cu" + std::to_string(index),
                    [this] { probeFromCompletionThread(); }) {}

  ~DeviceCore() {
    // Queued work still completes (backend.hpp), and its callbacks must still run: wait for it.
    // A poisoned context never calls its host functions; the completion thread's probe notices
    // that and fails them, which ends this wait early.
    if (retained_ && !completion_.waitUntilNothingExpected(kShutdownGrace)) {
      spdlog::warn("cuda device {}: closing with GPU work still running after {} s", index_,
                   kShutdownGrace.count());
    }
    completion_.stop();
    if (!retained_) {
      return;
    }
    if (sticky_.load() == CUDA_SUCCESS) {
      for (std::size_t lane = 0; lane < kLanes; ++lane) {
        ContextGuard guard(*api_, context(static_cast<Lane>(lane)));
        if (!guard.ok()) {
          continue;
        }
        for (const TimingPair& pair : timingPools_[lane]) {
          api_->eventDestroy(pair.start);
          api_->eventDestroy(pair.end);
        }
      }
      ContextGuard guard(*api_, context_);
      if (guard.ok()) {
        for (Notifier& notifier : notifiers_) {
          if (notifier.stream != nullptr) {
            api_->streamDestroy(notifier.stream);
          }
        }
      }
    }
    destroyPartition();
    api_->primaryCtxRelease(device_);
  }

  DeviceCore(const DeviceCore&) = delete;
  DeviceCore& operator=(const DeviceCore&) = delete;

  CUresult open() {
    CUresult result = api_->primaryCtxRetain(&context_, device_);
    if (result != CUDA_SUCCESS) {
      return result;
    }
    retained_ = true;
    {
      ContextGuard guard(*api_, context_);
      if (!guard.ok()) {
        return guard.status();
      }
      if (result = createNotifier(0); result != CUDA_SUCCESS) {
        return result;
      }
      if (result = api_->ctxGetStreamPriorityRange(&priorities_.least, &priorities_.greatest);
          result != CUDA_SUCCESS) {
        return result;
      }
      if (result = readProperties(); result != CUDA_SUCCESS) {
        return result;
      }
    }
    if (options_.wantsSmPartition()) {
      return createPartition();
    }
    return CUDA_SUCCESS;
  }

  const DriverApi& api() const { return *api_; }
  CUcontext context() const { return context_; }
  // The context to make current for work in `lane`.
  CUcontext context(Lane lane) const {
    if (lane == Lane::kPrimary || !partition_.enabled) {
      return context_;
    }
    return green_[laneIndex(lane) - 1].context;
  }
  Lane laneFor(backend::TenantClass workClass) const {
    if (!partition_.enabled) {
      return Lane::kPrimary;
    }
    return workClass == backend::TenantClass::kLatencyCritical ? Lane::kLatencyCritical
                                                               : Lane::kBestEffort;
  }
  CUgreenCtx green(Lane lane) const {
    return lane == Lane::kPrimary || !partition_.enabled ? nullptr
                                                         : green_[laneIndex(lane) - 1].green;
  }
  // A green context may be current to one thread at a time (cuGreenCtxCreate): the owner thread
  // and the completion thread take this around every use. Never held across another lane's.
  std::mutex& laneMutex(Lane lane) { return laneMutexes_[laneIndex(lane)]; }
  bool partitioned() const { return partition_.enabled; }
  const backend::SmPartition& partition() const { return partition_; }
  const backend::StreamPriorityRange& priorities() const { return priorities_; }

  int index() const { return index_; }
  CUdevice device() const { return device_; }
  std::uint64_t generation() const { return generation_.load(); }
  const DeviceProperties& properties() const { return properties_; }
  CompletionThread& completion() { return completion_; }

  // Remembers `result` if it poisoned the context, and then fails every callback still
  // expected: their host functions will never run. Returns `result`.
  CUresult note(CUresult result) {
    if (!isStickyError(result)) {
      return result;
    }
    CUresult none = CUDA_SUCCESS;
    if (sticky_.compare_exchange_strong(none, result)) {
      spdlog::error("cuda device {}: context poisoned by {}; every call fails until reset", index_,
                    api_->describe(result));
    }
    completion_.failExpected(sticky_.load());
    return result;
  }

  CUresult sticky() const { return sticky_.load(); }

  // The status a callback reports: its own error, else the sticky one if the context is
  // poisoned by now.
  CUresult callbackStatus(CUresult status) const {
    return status != CUDA_SUCCESS ? status : sticky_.load();
  }

  // Asks the driver whether the context is poisoned. Owner thread or completion thread, primary
  // context current, no lane held. A fault in a green context's kernel may show only there, so
  // with `greenToo` each green context is asked as well: the completion thread does, every
  // kProbeInterval while callbacks are due; the owner thread, which asks before every operation,
  // does not, and learns of such a fault from the completion thread or from its own calls' errors.
  CUresult probe(bool greenToo);

  // --- Kernel timing. takeTimingPair: owner thread, `lane` current and held.
  std::optional<TimingPair> takeTimingPair(Lane lane) {
    {
      std::lock_guard lock(poolMutex_);
      std::vector<TimingPair>& pool = timingPools_[laneIndex(lane)];
      if (!pool.empty()) {
        TimingPair pair = pool.back();
        pool.pop_back();
        return pair;
      }
    }
    TimingPair pair;
    pair.generation = generation_.load();
    pair.lane = lane;
    if (api_->eventCreate(&pair.start, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
      return std::nullopt;
    }
    if (api_->eventCreate(&pair.end, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
      api_->eventDestroy(pair.start);
      return std::nullopt;
    }
    return pair;
  }

  void returnTimingPair(const TimingPair& pair) {
    std::lock_guard lock(poolMutex_);
    // Events of a context that was reset died with it.
    if (pair.generation == generation_.load()) {
      timingPools_[laneIndex(pair.lane)].push_back(pair);
    }
  }

  // Completion thread: the kernel's GPU time. The host function that released this item ran
  // after `end` was recorded, so both events have completed.
  Result<std::uint64_t> elapsedNanoseconds(const TimingPair& pair);

  // --- Notifier streams, for Event::whenComplete. One stream would make a notification wait
  // for every event queued on it before, however late those complete; so pick an idle one,
  // creating up to kMaxNotifiers, else the least busy. Owner thread, primary context current.
  Result<std::size_t> pickNotifier() {
    std::size_t best = 0;
    int bestPending = INT_MAX;
    for (std::size_t i = 0; i < notifiers_.size(); ++i) {
      if (notifiers_[i].stream == nullptr) {
        if (createNotifier(i) == CUDA_SUCCESS) {
          return i;
        }
        break;
      }
      const int pending = notifiers_[i].pending.load();
      if (pending == 0) {
        return i;
      }
      if (pending < bestPending) {
        best = i;
        bestPending = pending;
      }
    }
    if (notifiers_[best].stream == nullptr) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    return best;
  }
  CUstream notifierStream(std::size_t index) const { return notifiers_[index].stream; }
  void notifierBusy(std::size_t index) { notifiers_[index].pending.fetch_add(1); }
  void notifierIdle(std::size_t index, std::uint64_t generation) {
    if (generation == generation_.load()) {
      notifiers_[index].pending.fetch_sub(1);
    }
  }

  // Recreates the context (Device::reset), and the SM partition in it. On the thread the owner
  // lends the device to for it (the daemon's blocking-call thread), or the owner's.
  CUresult reset() {
    // Host functions still enqueued die with the context: their callbacks run now, and
    // nothing of the completion thread touches the old context afterwards.
    const CUresult sticky = sticky_.load();
    completion_.failExpected(sticky != CUDA_SUCCESS ? sticky : CUDA_ERROR_CONTEXT_IS_DESTROYED);
    completion_.drain();

    std::unique_lock exclusive(contextMutex_);
    generation_.fetch_add(1);
    {
      std::lock_guard lock(poolMutex_);
      for (std::vector<TimingPair>& pool : timingPools_) {
        pool.clear();
      }
    }
    for (Notifier& notifier : notifiers_) {
      notifier.stream = nullptr;
      notifier.pending.store(0);
    }
    // Each green context holds a reference on the primary context: they go first.
    destroyPartition();
    if (retained_) {
      retained_ = false;
      if (const CUresult released = api_->primaryCtxRelease(device_); released != CUDA_SUCCESS) {
        spdlog::warn("cuda device {}: cuDevicePrimaryCtxRelease: {}", index_,
                     api_->describe(released));
      }
    }
    if (const CUresult result = api_->primaryCtxReset(device_); result != CUDA_SUCCESS) {
      spdlog::error("cuda device {}: cuDevicePrimaryCtxReset: {}", index_, api_->describe(result));
      return result;
    }
    if (const CUresult result = api_->primaryCtxRetain(&context_, device_);
        result != CUDA_SUCCESS) {
      spdlog::error("cuda device {}: cuDevicePrimaryCtxRetain after reset: {}", index_,
                    api_->describe(result));
      return result;
    }
    retained_ = true;
    sticky_.store(CUDA_SUCCESS);
    {
      ContextGuard guard(*api_, context_);
      if (!guard.ok()) {
        return guard.status();
      }
      if (const CUresult result = createNotifier(0); result != CUDA_SUCCESS) {
        return result;
      }
    }
    if (options_.wantsSmPartition()) {
      if (const CUresult result = createPartition(); result != CUDA_SUCCESS) {
        // Without its partition the device must not serve: best-effort work would run on every
        // SM. Every call fails with this until a later reset() succeeds.
        sticky_.store(result);
        return result;
      }
    }
    spdlog::info("cuda device {}: context recreated", index_);
    return CUDA_SUCCESS;
  }

  bool retained() const { return retained_; }

private:
  struct Notifier {
    CUstream stream = nullptr;
    std::atomic<int> pending{0};  // whenComplete items queued on it; completion thread lowers it
  };

  CUresult createNotifier(std::size_t index) {
    // Non-blocking: it must never wait for, or hold up, the legacy NULL stream.
    return api_->streamCreateWithPriority(&notifiers_[index].stream, CU_STREAM_NON_BLOCKING, 0);
  }

  // Splits the SMs (DeviceOptions) into a best-effort group and the rest, and makes a green
  // context of each. Owner thread, at open() and after reset().
  CUresult createPartition();
  // Destroys what createPartition made. The caller has destroyed every stream made in them.
  void destroyPartition();

  void probeFromCompletionThread() {
    std::shared_lock lock(contextMutex_);
    if (!retained_) {
      return;
    }
    ContextGuard guard(*api_, context_);
    if (guard.ok()) {
      probe(true);
    }
  }

  CUresult readProperties() {
    std::array<char, 256> name{};
    if (const CUresult result =
            api_->deviceGetName(name.data(), static_cast<int>(name.size()) - 1, device_);
        result != CUDA_SUCCESS) {
      return result;
    }
    properties_.name = name.data();
    CUuuid uuid{};
    if (const CUresult result = api_->deviceGetUuid(&uuid, device_); result != CUDA_SUCCESS) {
      return result;
    }
    std::memcpy(properties_.uuid.data(), uuid.bytes, properties_.uuid.size());
    std::size_t total = 0;
    if (const CUresult result = api_->deviceTotalMem(&total, device_); result != CUDA_SUCCESS) {
      return result;
    }
    properties_.totalMemory = total;
    // Every attribute this driver knows; it says CUDA_ERROR_INVALID_VALUE for the others (gaps
    // in the enum, attributes newer than the driver).
    for (int attribute = 1; attribute < CU_DEVICE_ATTRIBUTE_MAX; ++attribute) {
      int value = 0;
      if (api_->deviceGetAttribute(&value, static_cast<CUdevice_attribute>(attribute), device_) ==
          CUDA_SUCCESS) {
        properties_.attributes.emplace_back(attribute, value);
      }
    }
    return CUDA_SUCCESS;
  }

  std::shared_ptr<const DriverApi> api_;
  const int index_;
  const CUdevice device_;
  const backend::DeviceOptions options_;
  CUcontext context_ = nullptr;
  bool retained_ = false;
  std::atomic<std::uint64_t> generation_{1};
  std::atomic<CUresult> sticky_{CUDA_SUCCESS};
  DeviceProperties properties_;
  backend::StreamPriorityRange priorities_;

  // The partition: [0] best-effort, [1] latency-critical (Lane index - 1).
  backend::SmPartition partition_;
  std::array<GreenLane, 2> green_;
  std::array<std::mutex, kLanes> laneMutexes_;

  // Held shared by the completion thread while it uses the context, exclusively by reset().
  std::shared_mutex contextMutex_;

  std::mutex poolMutex_;
  std::array<std::vector<TimingPair>, kLanes> timingPools_;

  std::array<Notifier, kMaxNotifiers> notifiers_;

  // Last: its thread starts in the constructor and may call back into the members above.
  CompletionThread completion_;
};

// Makes a lane's context current for one use, holding the lane while it is (see
// DeviceCore::laneMutex). The primary context may be current to any number of threads, so its
// lane is not held.
class LaneGuard {
public:
  LaneGuard(DeviceCore& core, Lane lane)
      : lock_(lockFor(core, lane)), guard_(core.api(), core.context(lane)) {}

  bool ok() const { return guard_.ok(); }
  CUresult status() const { return guard_.status(); }

private:
  static std::unique_lock<std::mutex> lockFor(DeviceCore& core, Lane lane) {
    if (lane == Lane::kPrimary || !core.partitioned()) {
      return {};
    }
    return std::unique_lock(core.laneMutex(lane));
  }

  // First: taken before the context is pushed, let go after it is popped.
  std::unique_lock<std::mutex> lock_;
  ContextGuard guard_;
};

// Out of line: they need LaneGuard.

CUresult DeviceCore::probe(bool greenToo) {
  if (notifiers_[0].stream != nullptr) {
    note(api_->streamQuery(notifiers_[0].stream));
  }
  if (greenToo && partition_.enabled && sticky_.load() == CUDA_SUCCESS) {
    for (const Lane lane : {Lane::kBestEffort, Lane::kLatencyCritical}) {
      const GreenLane& green = green_[laneIndex(lane) - 1];
      if (green.probe == nullptr) {
        continue;
      }
      LaneGuard guard(*this, lane);
      if (guard.ok()) {
        note(api_->streamQuery(green.probe));
      }
    }
  }
  return sticky_.load();
}

Result<std::uint64_t> DeviceCore::elapsedNanoseconds(const TimingPair& pair) {
  std::shared_lock lock(contextMutex_);
  if (pair.generation != generation_.load()) {
    return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  }
  LaneGuard guard(*this, pair.lane);
  if (!guard.ok()) {
    return guard.status();
  }
  float milliseconds = 0;
  if (const CUresult result = note(api_->eventElapsedTime(&milliseconds, pair.start, pair.end));
      result != CUDA_SUCCESS) {
    return result;
  }
  return static_cast<std::uint64_t>(std::llround(std::max(0.0f, milliseconds) * 1.0e6));
}

CUresult DeviceCore::createPartition() {
  const std::string missing = api_->greenContextEntryPointsMissing();
  if (!missing.empty()) {
    spdlog::error(
        "cuda device {}: an SM partition needs green contexts (a CUDA 12.5 or newer driver); "
        "driver {}.{} lacks {}",
        index_, api_->driverVersion / 1000, (api_->driverVersion % 1000) / 10, missing);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUdevResource whole{};
  if (const CUresult result = api_->deviceGetDevResource(device_, &whole, CU_DEV_RESOURCE_TYPE_SM);
      result != CUDA_SUCCESS) {
    spdlog::error("cuda device {}: cuDeviceGetDevResource(SM): {}", index_, api_->describe(result));
    return result;
  }
  const unsigned total = whole.sm.smCount;
  const unsigned wanted =
      options_.bestEffortPercent != 0
          ? static_cast<unsigned>(std::uint64_t{total} * options_.bestEffortPercent / 100)
          : options_.bestEffortSms;
  if (wanted == 0 || wanted >= total) {
    spdlog::error(
        "cuda device {}: cannot give {} of its {} SMs to best-effort work: the partition must "
        "leave SMs to each class",
        index_, wanted, total);
    return CUDA_ERROR_INVALID_VALUE;
  }
  // One group of at least `wanted` SMs (the driver rounds up to its granularity: on compute
  // capability 9.0, multiples of 8) for best-effort work; the remainder for latency-critical.
  std::array<CUdevResource, 1> groups{};
  unsigned groupCount = 1;
  CUdevResource rest{};
  if (const CUresult result =
          api_->devSmResourceSplitByCount(groups.data(), &groupCount, &whole, &rest, 0, wanted);
      result != CUDA_SUCCESS) {
    spdlog::error("cuda device {}: cuDevSmResourceSplitByCount({} of {} SMs): {}", index_, wanted,
                  total, api_->describe(result));
    return result;
  }
  const unsigned restSms = rest.type == CU_DEV_RESOURCE_TYPE_SM ? rest.sm.smCount : 0;
  if (groupCount != 1 || restSms == 0) {
    spdlog::error(
        "cuda device {}: splitting {} of its {} SMs off for best-effort work leaves none for "
        "latency-critical work (SM granularity: minimum {}, alignment {})",
        index_, wanted, total, whole.sm.minSmPartitionSize, whole.sm.smCoscheduledAlignment);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::array<CUdevResource*, 2> resources{&groups[0], &rest};
  for (std::size_t i = 0; i < green_.size(); ++i) {
    GreenLane& lane = green_[i];
    CUdevResourceDesc description = nullptr;
    CUresult result = api_->devResourceGenerateDesc(&description, resources[i], 1);
    if (result == CUDA_SUCCESS) {
      result = api_->greenCtxCreate(&lane.green, description, device_, CU_GREEN_CTX_DEFAULT_STREAM);
    }
    if (result == CUDA_SUCCESS) {
      result = api_->ctxFromGreenCtx(&lane.context, lane.green);
    }
    if (result == CUDA_SUCCESS) {
      result = api_->greenCtxStreamCreate(&lane.probe, lane.green, CU_STREAM_NON_BLOCKING, 0);
    }
    if (result != CUDA_SUCCESS) {
      spdlog::error("cuda device {}: cannot make the {} green context: {}", index_,
                    i == 0 ? "best-effort" : "latency-critical", api_->describe(result));
      destroyPartition();
      return result;
    }
    lane.sms = resources[i]->sm.smCount;
  }
  partition_ = backend::SmPartition{true, total, green_[0].sms, green_[1].sms};
  spdlog::info(
      "cuda device {}: SM partition: best-effort streams on {} SMs, latency-critical streams on "
      "the other {} (of {}; asked for {})",
      index_, partition_.bestEffortSms, partition_.latencyCriticalSms, total, wanted);
  return CUDA_SUCCESS;
}

void DeviceCore::destroyPartition() {
  for (GreenLane& lane : green_) {
    if (lane.probe != nullptr && sticky_.load() == CUDA_SUCCESS && lane.context != nullptr) {
      ContextGuard guard(*api_, lane.context);
      if (guard.ok()) {
        api_->streamDestroy(lane.probe);
      }
    }
    if (lane.green != nullptr) {
      if (const CUresult result = api_->greenCtxDestroy(lane.green); result != CUDA_SUCCESS) {
        spdlog::warn("cuda device {}: cuGreenCtxDestroy: {}", index_, api_->describe(result));
      }
    }
    lane = GreenLane{};
  }
  partition_ = backend::SmPartition{};
}

// Every object made by a device checks this before using its handle: after reset() the handles
// of the old context are dangling.
class DeviceObject {
protected:
  explicit DeviceObject(std::shared_ptr<DeviceCore> core)
      : core_(std::move(core)), generation_(core_->generation()) {}

  bool current() const { return generation_ == core_->generation(); }

  std::shared_ptr<DeviceCore> core_;
  const std::uint64_t generation_;
};

class CudaFunction final : public backend::Function {
public:
  CudaFunction(CUfunction function, CUkernel kernel, FunctionInfo info)
      : function_(function), kernel_(kernel), info_(std::move(info)) {}
  const FunctionInfo& info() const override { return info_; }
  // What cuLaunchKernel takes. A CUfunction belongs to the context its module was loaded in; a
  // CUkernel of a library belongs to none, and the driver launches it in the context of the
  // stream it is launched on (loading it there first if need be), which is what makes one
  // module usable on the streams of every green context.
  CUfunction launchHandle() const {
    return kernel_ != nullptr ? reinterpret_cast<CUfunction>(kernel_) : function_;
  }

  // Before a launch with `bytes` of dynamic shared memory. Past the default per-block limit
  // (48 KiB with the static shared memory) the driver launches only a function whose
  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES allows it. The client's cuFuncSetAttribute
  // sets that attribute in the stub, which checks it at the launch, against the opt-in limit as
  // the driver would; so the daemon raises the attribute here, once per new maximum.
  CUresult allowDynamicShared(const DriverApi& api, CUdevice device, unsigned bytes) {
    constexpr unsigned kDefaultPerBlock = 48 * 1024;
    const unsigned staticBytes = static_cast<unsigned>(std::max(info_.sharedSizeBytes, 0));
    if (bytes + staticBytes <= kDefaultPerBlock || bytes <= dynamicSharedAllowed_.load()) {
      return CUDA_SUCCESS;
    }
    const int value = static_cast<int>(bytes);
    CUresult result = CUDA_SUCCESS;
    if (kernel_ != nullptr) {
      result = api.kernelSetAttribute != nullptr
                   ? api.kernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, value,
                                            kernel_, device)
                   : CUDA_ERROR_NOT_SUPPORTED;
    } else {
      result =
          api.funcSetAttribute(function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, value);
    }
    if (result == CUDA_SUCCESS) dynamicSharedAllowed_.store(bytes);
    return result;
  }

private:
  CUfunction function_;  // in the primary context: for its attributes and parameter layout
  CUkernel kernel_;      // null for a module loaded with cuModuleLoadData
  FunctionInfo info_;
  // The largest dynamic shared memory this function's attribute allows, as allowDynamicShared
  // raised it (launches come from the lanes' threads).
  std::atomic<unsigned> dynamicSharedAllowed_{0};
};

// A loaded image: a CUmodule of the primary context or, with an SM partition, a
// context-independent CUlibrary (see CudaFunction::launchHandle).
struct LoadedImage {
  CUmodule module = nullptr;
  CUlibrary library = nullptr;
};

class CudaModule final : public backend::Module, private DeviceObject {
public:
  CudaModule(std::shared_ptr<DeviceCore> core, LoadedImage image,
             std::optional<ptx::PtxModuleInfo> ptxLayouts, std::uint64_t deviceBytes)
      : DeviceObject(std::move(core)),
        image_(image),
        ptxLayouts_(std::move(ptxLayouts)),
        deviceBytes_(deviceBytes) {}

  std::uint64_t deviceBytes() const override { return deviceBytes_; }

  Result<backend::GlobalVariable> global(std::string_view name) override {
    if (!current()) {
      return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    if (name.empty() || name.find('\0') != std::string_view::npos) {
      return CUDA_ERROR_NOT_FOUND;
    }
    const DriverApi& api = core_->api();
    ContextGuard guard(api, core_->context());
    if (!guard.ok()) {
      return guard.status();
    }
    const std::string key(name);
    backend::GlobalVariable variable;
    CUresult result = CUDA_SUCCESS;
    if (image_.library != nullptr) {
      if (api.libraryGetGlobal == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
      result =
          api.libraryGetGlobal(&variable.address, &variable.bytes, image_.library, key.c_str());
    } else {
      result = api.moduleGetGlobal(&variable.address, &variable.bytes, image_.module, key.c_str());
    }
    if (result != CUDA_SUCCESS) {
      return core_->note(result);
    }
    return variable;
  }

  ~CudaModule() override {
    if (!current()) {
      return;
    }
    ContextGuard guard(core_->api(), core_->context());
    if (guard.ok()) {
      core_->note(image_.library != nullptr ? core_->api().libraryUnload(image_.library)
                                            : core_->api().moduleUnload(image_.module));
    }
  }

  Result<backend::Function*> function(std::string_view name) override {
    if (auto found = functions_.find(std::string(name)); found != functions_.end()) {
      return static_cast<backend::Function*>(found->second.get());
    }
    if (!current()) {
      return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    // A NUL would end the name early and could find a different kernel.
    if (name.empty() || name.find('\0') != std::string_view::npos) {
      return CUDA_ERROR_NOT_FOUND;
    }
    const DriverApi& api = core_->api();
    ContextGuard guard(api, core_->context());
    if (!guard.ok()) {
      return guard.status();
    }
    const std::string key(name);
    CUfunction handle = nullptr;
    CUkernel kernel = nullptr;
    if (image_.library != nullptr) {
      if (const CUresult result =
              core_->note(api.libraryGetKernel(&kernel, image_.library, key.c_str()));
          result != CUDA_SUCCESS) {
        return result;
      }
      // The kernel's function in the current (primary) context, to read its layout from.
      if (const CUresult result = core_->note(api.kernelGetFunction(&handle, kernel));
          result != CUDA_SUCCESS) {
        return result;
      }
    } else if (const CUresult result =
                   core_->note(api.moduleGetFunction(&handle, image_.module, key.c_str()));
               result != CUDA_SUCCESS) {
      return result;
    }
    FunctionInfo info;
    if (const CUresult result = describe(handle, key, info); result != CUDA_SUCCESS) {
      return result;
    }
    auto made = std::make_unique<CudaFunction>(handle, kernel, std::move(info));
    backend::Function* function = made.get();
    functions_.emplace(key, std::move(made));
    return function;
  }

private:
  CUresult describe(CUfunction handle, const std::string& name, FunctionInfo& info) {
    const DriverApi& api = core_->api();
    // With lazy loading (the CUDA 12 default) a function is not loaded until first use, and
    // its parameter info can read as empty until it is.
    if (api.funcLoad != nullptr) {
      if (const CUresult result = core_->note(api.funcLoad(handle)); result != CUDA_SUCCESS) {
        spdlog::warn("cuda device {}: cuFuncLoad({}): {}", core_->index(), name,
                     api.describe(result));
        return result;
      }
    }
    if (api.funcGetParamInfo != nullptr) {
      for (std::size_t i = 0;; ++i) {
        if (i == kMaxKernelParameters) {
          spdlog::error("cuda device {}: kernel {} reports over {} parameters", core_->index(),
                        name, kMaxKernelParameters);
          return CUDA_ERROR_NOT_SUPPORTED;
        }
        std::size_t offset = 0;
        std::size_t size = 0;
        const CUresult result = api.funcGetParamInfo(handle, i, &offset, &size);
        if (result == CUDA_ERROR_INVALID_VALUE) {
          break;  // past the last parameter
        }
        if (result != CUDA_SUCCESS) {
          return core_->note(result);
        }
        info.parameters.push_back(
            KernelParameter{static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(size)});
        info.parameterBytes =
            std::max(info.parameterBytes, static_cast<std::uint32_t>(offset + size));
      }
    } else if (ptxLayouts_.has_value()) {
      const auto& entries = ptxLayouts_->entries;
      const auto entry = std::find_if(entries.begin(), entries.end(),
                                      [&](const ptx::PtxEntry& e) { return e.name == name; });
      if (entry == entries.end()) {
        spdlog::error("cuda device {}: kernel {} is not among the PTX entries parsed",
                      core_->index(), name);
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      for (const ptx::PtxParameter& parameter : entry->parameters) {
        info.parameters.push_back(KernelParameter{parameter.offset, parameter.size});
      }
      info.parameterBytes = entry->parameterBytes;
    } else {
      spdlog::error(
          "cuda device {}: cannot learn the parameters of kernel {}: the driver has no "
          "cuFuncGetParamInfo (CUDA 12.4+) and the module is not PTX",
          core_->index(), name);
      return CUDA_ERROR_NOT_SUPPORTED;
    }

    const std::array<std::pair<CUfunction_attribute, int*>, 7> attributes{{
        {CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &info.maxThreadsPerBlock},
        {CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &info.sharedSizeBytes},
        {CU_FUNC_ATTRIBUTE_NUM_REGS, &info.numRegs},
        {CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, &info.localSizeBytes},
        {CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, &info.constSizeBytes},
        {CU_FUNC_ATTRIBUTE_PTX_VERSION, &info.ptxVersion},
        {CU_FUNC_ATTRIBUTE_BINARY_VERSION, &info.binaryVersion},
    }};
    for (const auto& [attribute, value] : attributes) {
      if (const CUresult result = core_->note(api.funcGetAttribute(value, attribute, handle));
          result != CUDA_SUCCESS) {
        return result;
      }
    }
    return CUDA_SUCCESS;
  }

  LoadedImage image_;
  // Parameter layouts from the PTX parser, when the driver cannot tell them.
  std::optional<ptx::PtxModuleInfo> ptxLayouts_;
  std::uint64_t deviceBytes_;
  std::unordered_map<std::string, std::unique_ptr<CudaFunction>> functions_;
};

class CudaEvent final : public backend::Event, private DeviceObject {
public:
  // `event` was made in the primary context's lane.
  CudaEvent(std::shared_ptr<DeviceCore> core, CUevent event, unsigned flags)
      : DeviceObject(std::move(core)), event_(event), flags_(flags) {}

  ~CudaEvent() override {
    // cuEventDestroy returns at once; a record still pending completes, and a notifier stream
    // waiting on it still sees it complete.
    if (!current()) {
      return;
    }
    LaneGuard guard(*core_, lane_);
    if (guard.ok()) {
      core_->api().eventDestroy(event_);
    }
  }

  CUresult query() override {
    if (const CUresult sticky = core_->sticky(); sticky != CUDA_SUCCESS) {
      return sticky;
    }
    if (!current()) {
      return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    if (!recorded_) {
      return CUDA_SUCCESS;
    }
    LaneGuard guard(*core_, lane_);
    if (!guard.ok()) {
      return guard.status();
    }
    return core_->note(core_->api().eventQuery(event_));
  }

  void whenComplete(CompletionCallback done) override {
    DeviceCore* core = core_.get();
    CompletionThread& completion = core->completion();
    auto finish = [core, done = std::move(done)](CUresult status) {
      if (done) {
        done(core->callbackStatus(status));
      }
    };
    if (const CUresult sticky = core->sticky(); sticky != CUDA_SUCCESS) {
      completion.post(std::move(finish), sticky);
      return;
    }
    if (!current()) {
      completion.post(std::move(finish), CUDA_ERROR_CONTEXT_IS_DESTROYED);
      return;
    }
    if (!recorded_) {
      completion.post(std::move(finish), CUDA_SUCCESS);
      return;
    }
    const DriverApi& api = core->api();
    {
      LaneGuard guard(*core, lane_);
      if (!guard.ok()) {
        completion.post(std::move(finish), guard.status());
        return;
      }
      // Already complete: no need to go through a stream.
      if (const CUresult state = core->note(api.eventQuery(event_));
          state != CUDA_ERROR_NOT_READY) {
        completion.post(std::move(finish), state);
        return;
      }
    }
    // The notifier streams are the primary context's; a stream may wait for an event of
    // another context (cuStreamWaitEvent), so one of a green context's is fine.
    ContextGuard guard(api, core->context());
    if (!guard.ok()) {
      completion.post(std::move(finish), guard.status());
      return;
    }
    const Result<std::size_t> picked = core->pickNotifier();
    if (!picked.ok()) {
      completion.post(std::move(finish), picked.code());
      return;
    }
    const std::size_t index = picked.value();
    const CUstream notifier = core->notifierStream(index);
    if (const CUresult waited = core->note(api.streamWaitEvent(notifier, event_, 0));
        waited != CUDA_SUCCESS) {
      completion.post(std::move(finish), waited);
      return;
    }
    core->notifierBusy(index);
    void* token = completion.expect(
        [core, index, generation = generation_, finish = std::move(finish)](CUresult status) {
          core->notifierIdle(index, generation);
          finish(status);
        });
    if (const CUresult launched =
            core->note(api.launchHostFunc(notifier, &CompletionThread::hostFunction, token));
        launched != CUDA_SUCCESS) {
      if (CompletionThread::Work work = completion.cancel(token)) {
        completion.post(std::move(work), launched);
      }
    }
  }

  Result<float> elapsedSince(backend::Event& start) override {
    auto* begin = dynamic_cast<CudaEvent*>(&start);
    if (begin == nullptr || !current() || !begin->current()) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (!recorded_ || !begin->recorded_ || ((flags_ | begin->flags_) & CU_EVENT_DISABLE_TIMING)) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (const CUresult sticky = core_->sticky(); sticky != CUDA_SUCCESS) {
      return sticky;
    }
    LaneGuard guard(*core_, lane_);
    if (!guard.ok()) {
      return guard.status();
    }
    float milliseconds = 0;
    if (const CUresult result =
            core_->note(core_->api().eventElapsedTime(&milliseconds, begin->event_, event_));
        result != CUDA_SUCCESS) {
      return result;
    }
    return milliseconds;
  }

  // Before a record on a stream of `lane`: cuEventRecord wants the event and the stream of the
  // same context, so an event first recorded in another lane is made again in this one (a
  // record replaces the previous one anyway; waits already queued on the old event still see
  // it complete). Events of one client stay in one lane: all its streams share its class.
  // Owner thread, no lane held.
  CUresult moveTo(Lane lane) {
    if (lane == lane_) {
      return CUDA_SUCCESS;
    }
    CUevent made = nullptr;
    {
      LaneGuard guard(*core_, lane);
      if (!guard.ok()) {
        return guard.status();
      }
      if (const CUresult result = core_->note(core_->api().eventCreate(&made, flags_));
          result != CUDA_SUCCESS) {
        return result;
      }
    }
    {
      LaneGuard guard(*core_, lane_);
      if (guard.ok()) {
        core_->api().eventDestroy(event_);
      }
    }
    event_ = made;
    lane_ = lane;
    recorded_ = false;
    return CUDA_SUCCESS;
  }

  CUevent handle() const { return event_; }
  bool belongsTo(const DeviceCore& core) const { return core_.get() == &core && current(); }
  bool alive() const { return current(); }
  bool recorded() const { return recorded_; }
  void markRecorded() { recorded_ = true; }

private:
  CUevent event_;
  Lane lane_ = Lane::kPrimary;
  const unsigned flags_;
  bool recorded_ = false;
};

class CudaStream final : public backend::Stream, private DeviceObject {
public:
  CudaStream(std::shared_ptr<DeviceCore> core, CUstream stream, Lane lane, int priority)
      : DeviceObject(std::move(core)), stream_(stream), lane_(lane), priority_(priority) {}

  ~CudaStream() override {
    // cuStreamDestroy returns at once; work already queued still runs, host functions included.
    if (!current()) {
      return;
    }
    LaneGuard guard(*core_, lane_);
    if (guard.ok()) {
      core_->api().streamDestroy(stream_);
    }
  }

  CUresult enqueue(const backend::MemoryOperation& operation) override {
    if (CUresult checked = backend::checkOperation(operation); checked != CUDA_SUCCESS) {
      return checked;
    }
    return submit([&](const DriverApi& api) {
      return std::visit(
          protocol::Overloaded{
              [&](const backend::CopyHostToDevice& copy) {
                return api.memcpyHtoDAsync(copy.destination, copy.source, copy.bytes, stream_);
              },
              [&](const backend::CopyDeviceToHost& copy) {
                return api.memcpyDtoHAsync(copy.destination, copy.source, copy.bytes, stream_);
              },
              [&](const backend::CopyDeviceToDevice& copy) {
                return api.memcpyDtoDAsync(copy.destination, copy.source, copy.bytes, stream_);
              },
              [&](const backend::Memset& memset) { return enqueueMemset(api, memset); },
              [&](const backend::Memset2D& memset) { return enqueueMemset2D(api, memset); },
          },
          operation);
    });
  }

  CUresult launch(backend::Function& function, const LaunchConfig& config,
                  std::span<const std::byte> parameters, KernelCallback done) override {
    auto* kernel = dynamic_cast<CudaFunction*>(&function);
    if (kernel == nullptr) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    const std::size_t bytes = kernel->info().parameterBytes;
    if (parameters.size() < bytes) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (const CUresult refused = refuse(); refused != CUDA_SUCCESS) {
      return refused;
    }
    DeviceCore* core = core_.get();
    const DriverApi& api = core->api();
    LaneGuard guard(*core, lane_);
    if (!guard.ok()) {
      return guard.status();
    }

    // cuLaunchKernel copies the parameters before it returns; staging them in our own aligned
    // buffer keeps the driver off unaligned or soon-reused caller memory.
    alignas(16) std::array<std::byte, kInlineParameterBytes> inlineBuffer;
    std::vector<std::max_align_t> heapBuffer;
    void* buffer = inlineBuffer.data();
    if (bytes > inlineBuffer.size()) {
      heapBuffer.resize((bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t));
      buffer = heapBuffer.data();
    }
    if (bytes != 0) {
      std::memcpy(buffer, parameters.data(), bytes);
    }
    std::size_t bufferSize = bytes;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &bufferSize, CU_LAUNCH_PARAM_END};

    // Timing only when someone listens: two event records per kernel are not free.
    std::optional<TimingPair> timing;
    if (done) {
      timing = core->takeTimingPair(lane_);
      if (timing && api.eventRecord(timing->start, stream_) != CUDA_SUCCESS) {
        core->returnTimingPair(*timing);
        timing.reset();
      }
    }
    if (const CUresult allowed =
            core->note(kernel->allowDynamicShared(api, core->device(), config.sharedMemBytes));
        allowed != CUDA_SUCCESS) {
      if (timing) {
        core->returnTimingPair(*timing);
      }
      return allowed;
    }
    CUresult launched = CUDA_SUCCESS;
    if (config.cooperative) {
      // cuLaunchCooperativeKernel takes no `extra`: a pointer to each parameter in the buffer.
      std::vector<void*> arguments;
      for (const backend::KernelParameter& parameter : kernel->info().parameters) {
        arguments.push_back(static_cast<std::byte*>(buffer) + parameter.offset);
      }
      launched = core->note(api.launchCooperativeKernel(
          kernel->launchHandle(), config.grid.x, config.grid.y, config.grid.z, config.block.x,
          config.block.y, config.block.z, config.sharedMemBytes, stream_, arguments.data()));
    } else {
      launched = core->note(api.launchKernel(kernel->launchHandle(), config.grid.x, config.grid.y,
                                             config.grid.z, config.block.x, config.block.y,
                                             config.block.z, config.sharedMemBytes, stream_,
                                             nullptr, bytes != 0 ? extra : nullptr));
    }
    if (launched != CUDA_SUCCESS) {
      if (timing) {
        core->returnTimingPair(*timing);
      }
      return launched;
    }
    if (!done) {
      return CUDA_SUCCESS;
    }
    if (timing && api.eventRecord(timing->end, stream_) != CUDA_SUCCESS) {
      core->returnTimingPair(*timing);
      timing.reset();
    }

    auto finish = [core, timing, done = std::move(done)](CUresult status) {
      status = core->callbackStatus(status);
      std::uint64_t nanoseconds = 0;
      if (timing) {
        if (status == CUDA_SUCCESS) {
          Result<std::uint64_t> elapsed = core->elapsedNanoseconds(*timing);
          if (elapsed.ok()) {
            nanoseconds = elapsed.value();
          } else if (isStickyError(elapsed.code())) {
            status = elapsed.code();
          }
        }
        core->returnTimingPair(*timing);
      }
      done(status, nanoseconds);
    };
    CompletionThread& completion = core->completion();
    void* token = completion.expect(std::move(finish));
    if (const CUresult queued =
            core->note(api.launchHostFunc(stream_, &CompletionThread::hostFunction, token));
        queued != CUDA_SUCCESS) {
      // The kernel is queued, so this launch succeeded; its callback reports the error.
      if (CompletionThread::Work work = completion.cancel(token)) {
        completion.post(std::move(work), queued);
      }
    }
    return CUDA_SUCCESS;
  }

  CUresult record(backend::Event& event) override {
    auto* target = dynamic_cast<CudaEvent*>(&event);
    if (target == nullptr || !target->belongsTo(*core_)) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (const CUresult refused = refuse(); refused != CUDA_SUCCESS) {
      return refused;
    }
    if (const CUresult moved = target->moveTo(lane_); moved != CUDA_SUCCESS) {
      return moved;
    }
    const CUresult result =
        submit([&](const DriverApi& api) { return api.eventRecord(target->handle(), stream_); });
    if (result == CUDA_SUCCESS) {
      target->markRecorded();
    }
    return result;
  }

  CUresult wait(backend::Event& event) override {
    // Unlike a record, a wait may name an event of another device (CUDA allows it).
    auto* target = dynamic_cast<CudaEvent*>(&event);
    if (target == nullptr || !target->alive()) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (!target->recorded()) {
      return refuse();  // nothing to wait for
    }
    return submit(
        [&](const DriverApi& api) { return api.streamWaitEvent(stream_, target->handle(), 0); });
  }

  CUresult addCallback(CompletionCallback done) override {
    if (const CUresult refused = refuse(); refused != CUDA_SUCCESS) {
      return refused;
    }
    DeviceCore* core = core_.get();
    const DriverApi& api = core->api();
    LaneGuard guard(*core, lane_);
    if (!guard.ok()) {
      return guard.status();
    }
    CompletionThread& completion = core->completion();
    void* token = completion.expect([core, done = std::move(done)](CUresult status) {
      if (done) {
        done(core->callbackStatus(status));
      }
    });
    const CUresult queued =
        core->note(api.launchHostFunc(stream_, &CompletionThread::hostFunction, token));
    if (queued != CUDA_SUCCESS) {
      completion.cancel(token);  // not queued: the caller hears it from our result instead
    }
    return queued;
  }

  CUresult query() override {
    if (const CUresult refused = refuse(); refused != CUDA_SUCCESS) {
      return refused;
    }
    LaneGuard guard(*core_, lane_);
    if (!guard.ok()) {
      return guard.status();
    }
    return core_->note(core_->api().streamQuery(stream_));
  }

  int priority() const override {
    if (refuse() == CUDA_SUCCESS) {
      LaneGuard guard(*core_, lane_);
      int reported = 0;
      if (guard.ok() && core_->api().streamGetPriority(stream_, &reported) == CUDA_SUCCESS) {
        return reported;
      }
    }
    return priority_;
  }

private:
  CUresult enqueueMemset2D(const DriverApi& api, const backend::Memset2D& memset) {
    switch (memset.elementSize) {
      case 1:
        return api.memsetD2D8Async(memset.destination, memset.pitch,
                                   static_cast<unsigned char>(memset.value), memset.width,
                                   memset.height, stream_);
      case 2:
        return api.memsetD2D16Async(memset.destination, memset.pitch,
                                    static_cast<unsigned short>(memset.value), memset.width,
                                    memset.height, stream_);
      case 4:
        return api.memsetD2D32Async(memset.destination, memset.pitch, memset.value, memset.width,
                                    memset.height, stream_);
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }

  CUresult enqueueMemset(const DriverApi& api, const backend::Memset& memset) {
    switch (memset.elementSize) {
      case 1:
        return api.memsetD8Async(memset.destination, static_cast<unsigned char>(memset.value),
                                 memset.count, stream_);
      case 2:
        return api.memsetD16Async(memset.destination, static_cast<unsigned short>(memset.value),
                                  memset.count, stream_);
      case 4:
        return api.memsetD32Async(memset.destination, memset.value, memset.count, stream_);
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  // Why nothing may be queued now: the context is poisoned or this stream belongs to one that
  // was reset.
  CUresult refuse() const {
    if (const CUresult sticky = core_->sticky(); sticky != CUDA_SUCCESS) {
      return sticky;
    }
    return current() ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
  }

  template <typename Call>
  CUresult submit(Call&& call) {
    if (const CUresult refused = refuse(); refused != CUDA_SUCCESS) {
      return refused;
    }
    LaneGuard guard(*core_, lane_);
    if (!guard.ok()) {
      return guard.status();
    }
    return core_->note(call(core_->api()));
  }

  CUstream stream_;
  const Lane lane_;
  const int priority_;  // as asked for at creation, clamped to the device's range
};

// Host memory registered with the driver. A PORTABLE registration serves every context of the
// process, and registering a range twice fails, so the devices share one table: the first device
// asked registers the range, the last one asked to let go unregisters it.
//
// The registration is made in the primary context of the device that registered it first, and
// cuDevicePrimaryCtxReset destroys that context with everything made in it, so reset() registers
// that device's ranges again: a client's pinned memory must stay usable by the other devices, and
// by this one once it serves again.
struct HostRegistrations {
  struct Range {
    std::size_t bytes = 0;
    int users = 0;  // devices that registered it
    int owner = 0;  // index of the device in whose context the driver registration was made
  };
  std::mutex mutex;
  std::map<void*, Range> ranges;  // by start
};

constexpr unsigned kHostRegisterFlags = CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE;

// What the driver is given to load: the client's image, NUL-terminated, or the cubin the JIT made
// of its PTX ahead of the load.
struct CudaPreparedModule final : backend::PreparedModule {
  std::vector<char> image;
  std::optional<ptx::PtxModuleInfo> ptxLayouts;  // kernels' layouts, where the driver cannot say
};

class CudaDevice final : public backend::Device {
public:
  CudaDevice(std::shared_ptr<DeviceCore> core, std::shared_ptr<HostRegistrations> registrations)
      : core_(std::move(core)), registrations_(std::move(registrations)) {}

  const DeviceProperties& properties() const override { return core_->properties(); }

  using backend::Device::allocate;
  using backend::Device::createStreamFor;
  using backend::Device::registerHostMemory;

  // The owner (address space) is the sim's to enforce: one CUDA context cannot keep kernels apart.
  Result<CUdeviceptr> allocate(std::size_t bytes, backend::AddressSpace /*owner*/) override {
    CUdeviceptr pointer = 0;
    const CUresult result =
        call([&](const DriverApi& api) { return api.memAlloc(&pointer, bytes); });
    if (result != CUDA_SUCCESS) {
      return result;
    }
    return pointer;
  }

  CUresult free(CUdeviceptr pointer) override {
    return call([&](const DriverApi& api) { return api.memFree(pointer); });
  }

  // Virtual memory management, straight to the driver's: physical memory on this GPU, accessed
  // from this GPU only (gpuproxy makes no two devices peers).
  Result<CUdeviceptr> reserveAddresses(std::uint64_t bytes, std::uint64_t alignment) override {
    CUdeviceptr pointer = 0;
    const CUresult result = call([&](const DriverApi& api) {
      return api.memAddressReserve(&pointer, bytes, alignment, 0, 0);
    });
    if (result != CUDA_SUCCESS) {
      return result;
    }
    return pointer;
  }

  CUresult freeAddresses(CUdeviceptr start, std::uint64_t bytes) override {
    return call([&](const DriverApi& api) { return api.memAddressFree(start, bytes); });
  }

  Result<std::uint64_t> createPhysicalMemory(std::uint64_t bytes) override {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = core_->device();
    CUmemGenericAllocationHandle handle = 0;
    const CUresult result =
        call([&](const DriverApi& api) { return api.memCreate(&handle, bytes, &prop, 0); });
    if (result != CUDA_SUCCESS) {
      return result;
    }
    return std::uint64_t{handle};
  }

  CUresult releasePhysicalMemory(std::uint64_t handle) override {
    return call([&](const DriverApi& api) { return api.memRelease(handle); });
  }

  CUresult mapMemory(CUdeviceptr address, std::uint64_t bytes, std::uint64_t handle,
                     std::uint64_t offset) override {
    return call(
        [&](const DriverApi& api) { return api.memMap(address, bytes, offset, handle, 0); });
  }

  CUresult unmapMemory(CUdeviceptr address, std::uint64_t bytes) override {
    return call([&](const DriverApi& api) { return api.memUnmap(address, bytes); });
  }

  CUresult setMemoryAccess(CUdeviceptr address, std::uint64_t bytes,
                           backend::AddressSpace /*owner*/, bool writable) override {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = core_->device();
    access.flags = writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return call([&](const DriverApi& api) { return api.memSetAccess(address, bytes, &access, 1); });
  }

  std::uint64_t occupiedBytes(std::size_t bytes) const override {
    // cuMemAlloc returns 512-byte aligned memory carved from 2 MiB pages; an allocation of a page
    // or more gets whole pages of its own.
    constexpr std::uint64_t kSmallGranule = 512;
    constexpr std::uint64_t kPage = std::uint64_t{2} << 20;
    const std::uint64_t granule = bytes < kPage ? kSmallGranule : kPage;
    return (std::uint64_t{bytes} + granule - 1) / granule * granule;
  }

  CUresult registerHostMemory(void* host, std::size_t bytes,
                              backend::AddressSpace /*owner*/) override {
    std::lock_guard lock(registrations_->mutex);
    if (auto found = registrations_->ranges.find(host); found != registrations_->ranges.end()) {
      ++found->second.users;
      return CUDA_SUCCESS;
    }
    const CUresult result = call(
        [&](const DriverApi& api) { return api.memHostRegister(host, bytes, kHostRegisterFlags); });
    if (result == CUDA_SUCCESS) {
      registrations_->ranges.emplace(host, HostRegistrations::Range{bytes, 1, core_->index()});
    }
    return result;
  }

  CUresult unregisterHostMemory(void* host) override {
    std::lock_guard lock(registrations_->mutex);
    auto found = registrations_->ranges.find(host);
    if (found == registrations_->ranges.end()) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (--found->second.users > 0) return CUDA_SUCCESS;
    registrations_->ranges.erase(found);
    return call([&](const DriverApi& api) { return api.memHostUnregister(host); });
  }

  MemoryInfo memoryInfo() override {
    std::size_t free = 0;
    std::size_t total = 0;
    if (call([&](const DriverApi& api) { return api.memGetInfo(&free, &total); }) != CUDA_SUCCESS) {
      return MemoryInfo{};
    }
    return MemoryInfo{free, total};
  }

  Result<std::unique_ptr<backend::PreparedModule>> prepareModule(
      std::span<const std::byte> image) const override {
    if (image.empty()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto prepared = std::make_unique<CudaPreparedModule>();
    // cuModuleLoadData takes no size: PTX is read up to its NUL, which a client's image need not
    // carry. Cubin and fatbin carry their sizes and ignore the extra byte.
    prepared->image.assign(image.size() + 1, '\0');
    std::memcpy(prepared->image.data(), image.data(), image.size());
    if (ptx::looksLikePtx(image)) {
      if (core_->api().funcGetParamInfo == nullptr) {
        ptx::PtxParseResult parsed = ptx::parsePtx(image);
        if (parsed.ok()) {
          prepared->ptxLayouts = std::move(parsed.module);
        } else {
          spdlog::warn("cuda device {}: PTX parser: {}; its kernels cannot be launched",
                       core_->index(), parsed.error);
        }
      }
      compileAheadOfLoad(*prepared);
    }
    return std::unique_ptr<backend::PreparedModule>(std::move(prepared));
  }

  Result<std::unique_ptr<backend::Module>> loadPrepared(
      std::unique_ptr<backend::PreparedModule> preparedModule,
      backend::AddressSpace /*owner*/) override {
    auto* prepared = dynamic_cast<CudaPreparedModule*>(preparedModule.get());
    KJ_REQUIRE(prepared != nullptr, "a module prepared by another backend");
    CUmodule module = nullptr;
    // The driver does not say how much device memory a module takes; the drop in free memory
    // across the load does. The daemon is the only allocator in its context, and its
    // allocations, frees and module loads and unloads are made one at a time on one thread (the
    // GPU's blocking-call thread; prepareModule's JIT takes no device memory), so the
    // difference belongs to this module.
    const std::uint64_t freeBefore = memoryInfo().free;
    // With an SM partition the kernels run in the green contexts, where a CUfunction of the
    // primary context cannot be launched; a library's CUkernel can, in any context.
    CUlibrary library = nullptr;
    const CUresult result = call([&](const DriverApi& api) {
      return core_->partitioned() ? api.libraryLoadData(&library, prepared->image.data(), nullptr,
                                                        nullptr, 0, nullptr, nullptr, 0)
                                  : api.moduleLoadData(&module, prepared->image.data());
    });
    if (result != CUDA_SUCCESS) {
      return result;
    }
    const std::uint64_t freeAfter = memoryInfo().free;
    const std::uint64_t deviceBytes = freeBefore > freeAfter ? freeBefore - freeAfter : 0;
    return std::unique_ptr<backend::Module>(std::make_unique<CudaModule>(
        core_, LoadedImage{module, library}, std::move(prepared->ptxLayouts), deviceBytes));
  }

  Result<std::unique_ptr<backend::Stream>> createStream(unsigned flags, int priority) override {
    return createStreamFor(backend::TenantClass::kBestEffort, flags, priority);
  }

  Result<std::unique_ptr<backend::Stream>> createStreamFor(
      backend::TenantClass workClass, unsigned flags, int priority,
      backend::AddressSpace /*owner*/) override {
    if ((flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const backend::StreamPriorityRange& range = core_->priorities();
    const int clamped = std::clamp(priority, std::min(range.greatest, range.least),
                                   std::max(range.greatest, range.least));
    const Lane lane = core_->laneFor(workClass);
    CUstream stream = nullptr;
    CUresult result = CUDA_SUCCESS;
    if (lane == Lane::kPrimary) {
      // Always non-blocking: a client's stream must never synchronise with the daemon context's
      // legacy NULL stream; the daemon emulates each client's own NULL stream itself.
      result = call([&](const DriverApi& api) {
        return api.streamCreateWithPriority(&stream, flags | CU_STREAM_NON_BLOCKING, clamped);
      });
    } else {
      // cuGreenCtxStreamCreate requires CU_STREAM_NON_BLOCKING, and ignores the current context.
      if (const CUresult sticky = core_->sticky(); sticky != CUDA_SUCCESS) {
        return sticky;
      }
      LaneGuard guard(*core_, lane);
      if (!guard.ok()) {
        return guard.status();
      }
      result = core_->note(core_->api().greenCtxStreamCreate(&stream, core_->green(lane),
                                                             CU_STREAM_NON_BLOCKING, clamped));
    }
    if (result != CUDA_SUCCESS) {
      return result;
    }
    return std::unique_ptr<backend::Stream>(
        std::make_unique<CudaStream>(core_, stream, lane, clamped));
  }

  backend::StreamPriorityRange streamPriorityRange() const override { return core_->priorities(); }
  backend::SmPartition smPartition() const override { return core_->partition(); }

  Result<std::unique_ptr<backend::Event>> createEvent(unsigned flags) override {
    CUevent event = nullptr;
    const CUresult result =
        call([&](const DriverApi& api) { return api.eventCreate(&event, flags); });
    if (result != CUDA_SUCCESS) {
      return result;
    }
    return std::unique_ptr<backend::Event>(std::make_unique<CudaEvent>(core_, event, flags));
  }

  CUresult stickyError() override {
    if (const CUresult sticky = core_->sticky(); sticky != CUDA_SUCCESS || !core_->retained()) {
      return sticky;
    }
    ContextGuard guard(core_->api(), core_->context());
    return guard.ok() ? core_->probe(false) : core_->sticky();
  }

  // One context serves every client, so a limit only ever grows here: the largest any client
  // asked for (a larger stack, FIFO or heap than asked for harms no kernel). A client is granted
  // what it asked for once the context's limit covers it, or what the driver clamped it to. The
  // driver refuses to change the heap or the printf FIFO once a kernel that uses them has run in
  // the context (CUDA_ERROR_INVALID_VALUE), and the client then gets that.
  Result<std::uint64_t> setLimit(backend::AddressSpace /*owner*/, CUlimit limit,
                                 std::uint64_t value) override {
    if (limit != CU_LIMIT_STACK_SIZE && limit != CU_LIMIT_PRINTF_FIFO_SIZE &&
        limit != CU_LIMIT_MALLOC_HEAP_SIZE) {
      return CUDA_ERROR_UNSUPPORTED_LIMIT;
    }
    std::size_t current = 0;
    const CUresult result = call([&](const DriverApi& api) {
      CUresult status = api.ctxGetLimit(&current, limit);
      if (status == CUDA_SUCCESS && current < value) {
        status = api.ctxSetLimit(limit, static_cast<std::size_t>(value));
        if (status == CUDA_SUCCESS) status = api.ctxGetLimit(&current, limit);
      }
      return status;
    });
    if (result != CUDA_SUCCESS) return result;
    return std::min<std::uint64_t>(value, current);
  }

  CUresult reset() override {
    if (const CUresult result = core_->reset(); result != CUDA_SUCCESS) {
      return result;
    }
    registerHostRangesAgain();
    return CUDA_SUCCESS;
  }

private:
  // After reset(): the ranges whose driver registration died with the old context (see
  // HostRegistrations). A failure is logged, not returned: the context itself is usable, and
  // only work that touches that range will fail.
  void registerHostRangesAgain() {
    std::lock_guard lock(registrations_->mutex);
    std::size_t again = 0;
    for (const auto& [host, range] : registrations_->ranges) {
      if (range.owner != core_->index()) {
        continue;
      }
      void* start = host;
      const std::size_t bytes = range.bytes;
      const CUresult result = call([&](const DriverApi& api) {
        return api.memHostRegister(start, bytes, kHostRegisterFlags);
      });
      // Already registered: the driver kept it through the reset, which is just as good.
      if (result == CUDA_SUCCESS || result == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
        ++again;
        continue;
      }
      spdlog::error(
          "cuda device {}: pinned host memory at {} ({} bytes) could not be registered again "
          "after the reset: {}; GPU work that uses it will fail",
          core_->index(), host, bytes, core_->api().describe(result));
    }
    if (again != 0) {
      spdlog::info("cuda device {}: {} pinned host range(s) registered again after the reset",
                   core_->index(), again);
    }
  }

  // Compiles a PTX image for this device with the driver's linker, so that the JIT, which may
  // take seconds, runs in prepareModule and cuModuleLoadData only has a cubin to load. The
  // linker needs a current context (its target is the context's device) but no device memory.
  // Where it is missing or fails, the PTX stays and the driver compiles it at load, reporting
  // its own error there.
  void compileAheadOfLoad(CudaPreparedModule& prepared) const {
    const DriverApi& driver = core_->api();
    if (driver.linkCreate == nullptr || driver.linkAddData == nullptr ||
        driver.linkComplete == nullptr || driver.linkDestroy == nullptr) {
      return;
    }
    std::vector<char> cubin;
    const CUresult result = call([&](const DriverApi& api) {
      CUlinkState link = nullptr;
      CUresult status = api.linkCreate(0, nullptr, nullptr, &link);
      if (status != CUDA_SUCCESS) return status;
      status = api.linkAddData(link, CU_JIT_INPUT_PTX, prepared.image.data(), prepared.image.size(),
                               "module", 0, nullptr, nullptr);
      void* linked = nullptr;
      std::size_t linkedBytes = 0;
      if (status == CUDA_SUCCESS) status = api.linkComplete(link, &linked, &linkedBytes);
      if (status == CUDA_SUCCESS) {
        // The linker owns its output until linkDestroy.
        const auto* bytes = static_cast<const char*>(linked);
        cubin.assign(bytes, bytes + linkedBytes);
      }
      api.linkDestroy(link);
      return status;
    });
    if (result != CUDA_SUCCESS || cubin.empty()) {
      spdlog::debug(
          "cuda device {}: compiling PTX ahead of its load failed ({}); the driver "
          "compiles it at load",
          core_->index(), driver.describe(result));
      return;
    }
    prepared.image = std::move(cubin);
  }

  template <typename Call>
  CUresult call(Call&& function) const {
    if (const CUresult sticky = core_->sticky(); sticky != CUDA_SUCCESS) {
      return sticky;
    }
    if (!core_->retained()) {
      return CUDA_ERROR_CONTEXT_IS_DESTROYED;  // a failed reset() left no context
    }
    ContextGuard guard(core_->api(), core_->context());
    if (!guard.ok()) {
      return guard.status();
    }
    return core_->note(function(core_->api()));
  }

  std::shared_ptr<DeviceCore> core_;
  std::shared_ptr<HostRegistrations> registrations_;
};

class CudaBackend final : public backend::Backend {
public:
  CudaBackend(std::shared_ptr<const DriverApi> api, int deviceCount)
      : api_(std::move(api)), deviceCount_(deviceCount) {}

  std::string_view name() const override { return "cuda"; }
  int driverVersion() const override { return api_->driverVersion; }
  int deviceCount() const override { return deviceCount_; }

  Result<std::unique_ptr<backend::Device>> openDevice(
      int index, const backend::DeviceOptions& options) override {
    if (index < 0 || index >= deviceCount_) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    CUdevice device = 0;
    if (const CUresult result = api_->deviceGet(&device, index); result != CUDA_SUCCESS) {
      return result;
    }
    auto core = std::make_shared<DeviceCore>(api_, index, device, options);
    if (const CUresult result = core->open(); result != CUDA_SUCCESS) {
      spdlog::error("cuda device {}: cannot open: {}", index, api_->describe(result));
      return result;
    }
    const DeviceProperties& properties = core->properties();
    spdlog::info("cuda device {}: {}, {} MiB, {} attributes, parameter layouts from {}", index,
                 properties.name, properties.totalMemory >> 20, properties.attributes.size(),
                 api_->funcGetParamInfo != nullptr ? "cuFuncGetParamInfo" : "the PTX parser");
    return std::unique_ptr<backend::Device>(
        std::make_unique<CudaDevice>(std::move(core), registrations_));
  }

private:
  std::shared_ptr<const DriverApi> api_;
  int deviceCount_;
  std::shared_ptr<HostRegistrations> registrations_ = std::make_shared<HostRegistrations>();
};

}  // namespace

Result<std::unique_ptr<backend::Backend>> newCudaBackend(std::string& whyNot,
                                                         const std::string& library) {
  try {
    std::shared_ptr<const DriverApi> api;
    if (const CUresult result = loadDriver(library, api, whyNot); result != CUDA_SUCCESS) {
      return result;
    }
    int count = 0;
    if (const CUresult result = api->deviceGetCount(&count); result != CUDA_SUCCESS) {
      whyNot = "cuDeviceGetCount failed: " + api->describe(result);
      return result;
    }
    if (count <= 0) {
      whyNot = "the CUDA driver (" + library + ") reports no devices";
      return CUDA_ERROR_NO_DEVICE;
    }
    spdlog::info("cuda: driver {}.{} from {}, {} device(s)", api->driverVersion / 1000,
                 (api->driverVersion % 1000) / 10, library, count);
    return std::unique_ptr<backend::Backend>(std::make_unique<CudaBackend>(std::move(api), count));
  } catch (const std::exception& error) {
    whyNot = std::string("cuda backend: ") + error.what();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

}  // namespace gpuproxy::server::cuda
