// cuGetExportTable: the driver's private tables that the CUDA runtime (cudart, static or shared)
// asks for by UUID before and after cuInit. They are answered here, in the stub, with no round
// trip: module loading through them goes through the same cuModuleLoadData as everything else.
//
// Every slot whose meaning is known is implemented; every other slot of a known table is a
// tracer that logs "<table> slot N" and answers CUDA_ERROR_NOT_SUPPORTED (a function returning
// an int is safe to call with any arguments under the SysV ABI), so a runtime that starts
// using a new slot says so instead of jumping to null. A table the stub does not know is refused
// with a warning naming its UUID, once. GPUPROXY_LOG_LEVEL=debug logs every table and slot used.

#include <cuda.h>
#include <pthread.h>
#include <unistd.h>

#include <array>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "client/stub/api_support.hpp"
#include "client/stub/export.hpp"
#include "client/stub/integrity_check.hpp"

using gpuproxy::stub::currentContext;
using gpuproxy::stub::handleValue;
using gpuproxy::stub::Runtime;

namespace {

using Uuid = std::array<std::uint8_t, 16>;

// The tables, in the order of kTableNames; the index is a template argument of the tracers.
enum TableId : int {
  kCudartInterface,
  kToolsTls,
  kToolsRuntimeCallbackHooks,
  kContextLocalStorage,
  kContextCreateBypass,
  kHeapAccess,
  kDeviceExtendedRuntime,
  kIntegrityCheck,
  kContextChecks,
  kContextInternals,
  kTableCount
};

constexpr std::array<const char*, kTableCount> kTableNames = {
    "CUDART_INTERFACE",
    "TOOLS_TLS",
    "TOOLS_RUNTIME_CALLBACK_HOOKS",
    "CONTEXT_LOCAL_STORAGE_INTERFACE_V0301",
    "CTX_CREATE_BYPASS",
    "HEAP_ACCESS",
    "DEVICE_EXTENDED_RT",
    "INTEGRITY_CHECK",
    "CONTEXT_CHECKS",
    "CONTEXT_INTERNALS",
};

template <int Table, int Slot>
CUresult unknownSlot() {
  GPUPROXY_STUB_LOG(kWarn, "cuGetExportTable: %s slot %d is not supported", kTableNames[Table],
                    Slot);
  return CUDA_ERROR_NOT_SUPPORTED;
}

// For tool-facing slots whose absence the runtime tolerates: nothing to do, success.
template <int Table, int Slot>
CUresult nothingToDo() {
  GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: %s slot %d: nothing to do", kTableNames[Table],
                    Slot);
  return CUDA_SUCCESS;
}

template <typename Function>
const void* slot(Function* function) {
  return reinterpret_cast<const void*>(function);
}

// What a slot nobody has filled in answers: CUDA_ERROR_NOT_SUPPORTED, or (tool-facing tables the
// runtime tolerates doing nothing) CUDA_SUCCESS.
enum class UnfilledSlots { kRefuse, kSucceed };

// A table of N slots, each a tracer; with a header, slot 0 holds the table's size in bytes.
template <int Table, UnfilledSlots Unfilled, std::size_t... Slot>
std::vector<const void*> tracedTable(bool sizeHeader, std::index_sequence<Slot...>) {
  std::vector<const void*> table = {(Unfilled == UnfilledSlots::kRefuse
                                         ? slot(&unknownSlot<Table, static_cast<int>(Slot)>)
                                         : slot(&nothingToDo<Table, static_cast<int>(Slot)>))...};
  if (sizeHeader) {
    table[0] = reinterpret_cast<const void*>(table.size() * sizeof(void*));
  }
  return table;
}

template <int Table, std::size_t N, UnfilledSlots Unfilled = UnfilledSlots::kRefuse>
std::vector<const void*> tracedTable(bool sizeHeader) {
  return tracedTable<Table, Unfilled>(sizeHeader, std::make_index_sequence<N>());
}

// ---- CUDART_INTERFACE: how the runtime loads the fatbins nvcc embedded ------------------------

CUresult loadModule(const char* slotName, CUmodule* module, const void* image) {
  GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: CUDART_INTERFACE %s", slotName);
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuModuleLoadData(module, image);
}

CUresult moduleFromFatbinWrapper(CUmodule* module, const void* wrapper) {
  return loadModule("module from fatbin wrapper", module, wrapper);
}

// The extended forms carry options the stub does not know; with none, they are the plain load.
CUresult moduleFromFatbinWrapperWithOptions(CUmodule* module, const void* wrapper, void* options,
                                            void* values, unsigned count) {
  if (options != nullptr || values != nullptr || count != 0) {
    GPUPROXY_STUB_LOG(kWarn,
                      "cuGetExportTable: module load with %u runtime options is not "
                      "supported",
                      count);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return loadModule("module from fatbin wrapper (with options)", module, wrapper);
}

CUresult moduleFromFatbin(const void* fatbin, CUmodule* module, void* options, void* values,
                          unsigned count) {
  if (options != nullptr || values != nullptr || count != 0) {
    GPUPROXY_STUB_LOG(kWarn,
                      "cuGetExportTable: module load with %u runtime options is not "
                      "supported",
                      count);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return loadModule("module from fatbin", module, fatbin);
}

CUresult primaryContextOfDevice(CUcontext* context, CUdevice device) {
  GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: CUDART_INTERFACE primary context of %d", device);
  return cuDevicePrimaryCtxRetain(context, device);
}

void runtimeNotice(std::size_t value) {
  GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: CUDART_INTERFACE notice %zu", value);
}

// The real driver loads its PTX compilers here; the daemon's backend does any JIT.
CUresult loadCompilers() {
  GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: CUDART_INTERFACE load compilers");
  return CUDA_SUCCESS;
}

// ---- TOOLS_RUNTIME_CALLBACK_HOOKS: buffers the runtime fills for profilers --------------------

template <std::size_t Words>
void hookBuffer(void** buffer, std::size_t* words) {
  static std::array<std::uint32_t, Words> storage{};
  if (buffer != nullptr) *buffer = storage.data();
  if (words != nullptr) *words = storage.size();
}

// ---- CONTEXT_LOCAL_STORAGE: the runtime's per-context state -----------------------------------

using StorageDestructor = void (*)(CUcontext, void*, void*);

struct StoredValue {
  void* value = nullptr;
  StorageDestructor destructor = nullptr;
};

class ContextLocalStorage {
public:
  static ContextLocalStorage& instance() {
    static auto* storage = new ContextLocalStorage();  // outlives static destructors at exit
    return *storage;
  }

  void put(std::uint64_t context, void* key, StoredValue value) {
    std::lock_guard lock(mutex_);
    values_[{context, key}] = value;
  }
  bool erase(std::uint64_t context, void* key) {
    std::lock_guard lock(mutex_);
    return values_.erase({context, key}) != 0;
  }
  bool get(std::uint64_t context, void* key, void** value) const {
    std::lock_guard lock(mutex_);
    auto found = values_.find({context, key});
    if (found == values_.end()) return false;
    *value = found->second.value;
    return true;
  }
  // Removes every value of `context` and runs their destructors, outside the lock (a
  // destructor may call back into the driver).
  void release(std::uint64_t context) {
    std::vector<std::pair<void*, StoredValue>> released;
    {
      std::lock_guard lock(mutex_);
      auto first = values_.lower_bound({context, nullptr});
      auto last = first;
      while (last != values_.end() && last->first.first == context) {
        released.emplace_back(last->first.second, last->second);
        ++last;
      }
      values_.erase(first, last);
    }
    for (auto& [key, stored] : released) {
      if (stored.destructor != nullptr) {
        stored.destructor(gpuproxy::stub::toHandle<CUcontext>(context), key, stored.value);
      }
    }
  }

private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::uint64_t, void*>, StoredValue> values_;
};

// A null context means the calling thread's current one.
std::uint64_t storageContext(CUcontext context) {
  const std::uint64_t named = handleValue(context);
  return named != 0 ? named : currentContext();
}

CUresult storagePut(CUcontext context, void* key, void* value, StorageDestructor destructor) {
  const std::uint64_t owner = storageContext(context);
  if (owner == 0) return CUDA_ERROR_INVALID_CONTEXT;
  ContextLocalStorage::instance().put(owner, key, StoredValue{value, destructor});
  return CUDA_SUCCESS;
}

CUresult storageDelete(CUcontext context, void* key) {
  const std::uint64_t owner = storageContext(context);
  if (owner == 0) return CUDA_ERROR_INVALID_CONTEXT;
  return ContextLocalStorage::instance().erase(owner, key) ? CUDA_SUCCESS
                                                           : CUDA_ERROR_INVALID_HANDLE;
}

CUresult storageGet(void** value, CUcontext context, void* key) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t owner = storageContext(context);
  if (owner == 0) return CUDA_ERROR_INVALID_CONTEXT;
  return ContextLocalStorage::instance().get(owner, key, value) ? CUDA_SUCCESS
                                                                : CUDA_ERROR_INVALID_HANDLE;
}

// ---- DEVICE_EXTENDED_RT, CONTEXT_CHECKS ---------------------------------------------------

CUresult deviceFlagByte(unsigned char* result, CUdevice /*device*/) {
  if (result == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *result = 0;
  return CUDA_SUCCESS;
}

CUresult contextCheck(CUcontext /*context*/, std::uint32_t* flags, const void** /*detail*/) {
  if (flags != nullptr) *flags = 0;
  return CUDA_SUCCESS;
}

std::uint32_t contextCheckFlags() {
  return 0;
}

// ---- TOOLS_TLS, CONTEXT_INTERNALS: what cuBLAS keys its per-context state by ------------------

CUresult currentContextForTools(CUcontext* context) {
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t current = currentContext();
  GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: TOOLS_TLS current context %" PRIu64, current);
  *context = gpuproxy::stub::toHandle<CUcontext>(current);
  return current != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult contextId(CUcontext context, unsigned long long* id) {
  GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: CONTEXT_INTERNALS id of context %" PRIu64,
                    handleValue(context));
  return cuCtxGetId(context, id);
}

// The driver's own object behind a stream handle. The stub's handles are its objects: the
// "private" stream is the handle itself, with the NULL stream made explicit (CU_STREAM_LEGACY
// or, for per-thread default-stream code, CU_STREAM_PER_THREAD).
CUresult streamBehindHandle(CUcontext context, CUstream stream, CUstream* privateStream,
                            int perThreadDefault) {
  GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: CONTEXT_INTERNALS stream behind %p",
                    static_cast<void*>(stream));
  if (privateStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  (void)context;  // a stream names its own context
  if (stream == nullptr) stream = perThreadDefault != 0 ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
  unsigned long long id = 0;
  if (const CUresult valid = cuStreamGetId(stream, &id); valid != CUDA_SUCCESS) return valid;
  *privateStream = stream;
  return CUDA_SUCCESS;
}

CUresult streamIdentity(CUcontext context, CUstream privateStream, unsigned long long* id) {
  GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: CONTEXT_INTERNALS identity of stream %p",
                    static_cast<void*>(privateStream));
  (void)context;
  if (privateStream == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuStreamGetId(privateStream, id);
}

// ---- INTEGRITY_CHECK ----------------------------------------------------------------------

struct Tables;
const Tables& tables();

CUresult integrityCheck(std::uint32_t runtimeVersion, std::uint64_t timestamp,
                        std::uint64_t* answer);

struct Tables {
  std::vector<const void*> cudartInterface = tracedTable<kCudartInterface, 13>(true);
  std::vector<const void*> toolsTls = tracedTable<kToolsTls, 4, UnfilledSlots::kSucceed>(true);
  std::vector<const void*> callbackHooks = tracedTable<kToolsRuntimeCallbackHooks, 7>(true);
  std::vector<const void*> contextLocalStorage = tracedTable<kContextLocalStorage, 4>(false);
  std::vector<const void*> contextCreateBypass = tracedTable<kContextCreateBypass, 2>(true);
  std::vector<const void*> heapAccess = tracedTable<kHeapAccess, 3>(true);
  std::vector<const void*> deviceExtended = tracedTable<kDeviceExtendedRuntime, 26>(true);
  std::vector<const void*> integrity = tracedTable<kIntegrityCheck, 3>(true);
  std::vector<const void*> contextChecks = tracedTable<kContextChecks, 4>(true);
  std::vector<const void*> contextInternals = tracedTable<kContextInternals, 93>(true);

  Tables() {
    cudartInterface[1] = slot(&moduleFromFatbinWrapper);
    cudartInterface[2] = slot(&primaryContextOfDevice);
    cudartInterface[6] = slot(&moduleFromFatbinWrapperWithOptions);
    cudartInterface[7] = slot(&runtimeNotice);
    cudartInterface[8] = slot(&moduleFromFatbin);
    cudartInterface[12] = slot(&loadCompilers);
    callbackHooks[2] = slot(&hookBuffer<1024>);
    callbackHooks[6] = slot(&hookBuffer<14>);
    contextLocalStorage[0] = slot(&storagePut);
    contextLocalStorage[1] = slot(&storageDelete);
    contextLocalStorage[2] = slot(&storageGet);
    deviceExtended[13] = slot(&deviceFlagByte);
    integrity[1] = slot(&integrityCheck);
    contextChecks[2] = slot(&contextCheck);
    contextChecks[3] = slot(&contextCheckFlags);
    toolsTls[2] = slot(&currentContextForTools);
    contextInternals[4] = slot(&contextId);
    contextInternals[39] = slot(&streamIdentity);
    contextInternals[51] = slot(&streamBehindHandle);
  }
};

const Tables& tables() {
  static const auto* instance = new Tables();  // referenced by the runtime until exit
  return *instance;
}

CUresult integrityCheck(std::uint32_t runtimeVersion, std::uint64_t timestamp,
                        std::uint64_t* answer) {
  if (answer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int driverVersion = 0;
  cuDriverGetVersion(&driverVersion);
  gpuproxy::stub::IntegrityInputs inputs;
  inputs.driverVersion = static_cast<std::uint32_t>(driverVersion);
  inputs.runtimeVersion = runtimeVersion;
  inputs.processId = static_cast<std::uint32_t>(getpid());
  inputs.threadId = static_cast<std::uint32_t>(pthread_self());
  inputs.cudartTable = tables().cudartInterface.data();
  inputs.integrityTable = tables().integrity.data();
  inputs.checkFunction = tables().integrity[1];
  inputs.timestamp = timestamp;

  std::vector<gpuproxy::stub::IntegrityDevice> devices;
  if (const Runtime* runtime = Runtime::instance()) {
    for (const gpuproxy::stub::DeviceRecord& record : runtime->devices()) {
      gpuproxy::stub::IntegrityDevice device;
      device.uuid = record.uuid;
      device.pciDomain = record.attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID).value_or(0);
      device.pciBus = record.attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID).value_or(0);
      device.pciDevice = record.attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID).value_or(0);
      devices.push_back(device);
    }
  }
  const std::array<std::uint64_t, 2> value = gpuproxy::stub::integrityCheckAnswer(inputs, devices);
  std::memcpy(answer, value.data(), sizeof(value));
  GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: INTEGRITY_CHECK version %u, %zu devices",
                    runtimeVersion, devices.size());
  return CUDA_SUCCESS;
}

struct KnownTable {
  Uuid id;
  int table;
};

constexpr std::array<KnownTable, kTableCount> kKnownTables = {{
    {{0x6B, 0xD5, 0xFB, 0x6C, 0x5B, 0xF4, 0xE7, 0x4A, 0x89, 0x87, 0xD9, 0x39, 0x12, 0xFD, 0x9D,
      0xF9},
     kCudartInterface},
    {{0x42, 0xD8, 0x5A, 0x81, 0x23, 0xF6, 0xCB, 0x47, 0x82, 0x98, 0xF6, 0xE7, 0x8A, 0x3A, 0xEC,
      0xDC},
     kToolsTls},
    {{0xA0, 0x94, 0x79, 0x8C, 0x2E, 0x74, 0x2E, 0x74, 0x93, 0xF2, 0x08, 0x00, 0x20, 0x0C, 0x0A,
      0x66},
     kToolsRuntimeCallbackHooks},
    {{0xC6, 0x93, 0x33, 0x6E, 0x11, 0x21, 0xDF, 0x11, 0xA8, 0xC3, 0x68, 0xF3, 0x55, 0xD8, 0x95,
      0x93},
     kContextLocalStorage},
    {{0x0C, 0xA5, 0x0B, 0x8C, 0x10, 0x04, 0x92, 0x9A, 0x89, 0xA7, 0xD0, 0xDF, 0x10, 0xE7, 0x72,
      0x86},
     kContextCreateBypass},
    {{0x19, 0x5B, 0xCB, 0xF4, 0xD6, 0x7D, 0x02, 0x4A, 0xAC, 0xC5, 0x1D, 0x29, 0xCE, 0xA6, 0x31,
      0xAE},
     kHeapAccess},
    {{0xB1, 0x05, 0x41, 0xE1, 0xF7, 0xC7, 0xC7, 0x4A, 0x9F, 0x64, 0xF2, 0x23, 0xBE, 0x99, 0xF1,
      0xE2},
     kDeviceExtendedRuntime},
    {{0xD4, 0x08, 0x20, 0x55, 0xBD, 0xE6, 0x70, 0x4B, 0x8D, 0x34, 0xBA, 0x12, 0x3C, 0x66, 0xE1,
      0xF2},
     kIntegrityCheck},
    {{0x26, 0x3E, 0x88, 0x60, 0x7C, 0xD2, 0x61, 0x43, 0x92, 0xF6, 0xBB, 0xD5, 0x00, 0x6D, 0xFA,
      0x7E},
     kContextChecks},
    {{0x21, 0x31, 0x8C, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8C, 0xA6, 0x41, 0xFF, 0x73, 0x24, 0xC8,
      0xF2},
     kContextInternals},
}};

const void* const* tableData(int table) {
  const Tables& all = tables();
  switch (table) {
    case kCudartInterface:
      return all.cudartInterface.data();
    case kToolsTls:
      return all.toolsTls.data();
    case kToolsRuntimeCallbackHooks:
      return all.callbackHooks.data();
    case kContextLocalStorage:
      return all.contextLocalStorage.data();
    case kContextCreateBypass:
      return all.contextCreateBypass.data();
    case kHeapAccess:
      return all.heapAccess.data();
    case kDeviceExtendedRuntime:
      return all.deviceExtended.data();
    case kIntegrityCheck:
      return all.integrity.data();
    case kContextChecks:
      return all.contextChecks.data();
    case kContextInternals:
      return all.contextInternals.data();
    default:
      return nullptr;
  }
}

std::string uuidText(const Uuid& id) {
  char text[40];
  std::snprintf(text, sizeof(text),
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", id[0],
                id[1], id[2], id[3], id[4], id[5], id[6], id[7], id[8], id[9], id[10], id[11],
                id[12], id[13], id[14], id[15]);
  return text;
}

}  // namespace

namespace gpuproxy::stub {

void releaseContextLocalStorage(std::uint64_t context) {
  ContextLocalStorage::instance().release(context);
}

}  // namespace gpuproxy::stub

GPUPROXY_EXPORT CUresult cuGetExportTable(const void** ppExportTable,
                                          const CUuuid* pExportTableId) {
  if (ppExportTable == nullptr || pExportTableId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ppExportTable = nullptr;
  Uuid id;
  std::memcpy(id.data(), pExportTableId->bytes, id.size());
  for (const KnownTable& known : kKnownTables) {
    if (known.id == id) {
      GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: %s", kTableNames[known.table]);
      *ppExportTable = tableData(known.table);
      return CUDA_SUCCESS;
    }
  }
  // cudart 13 asks for this one before cuInit and carries on without it; refusing it is part of
  // normal operation, not news.
  static constexpr Uuid kAskedBeforeInit = {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e,
                                            0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9};
  if (id == kAskedBeforeInit) {
    GPUPROXY_STUB_LOG(kDebug, "cuGetExportTable: table {%s} refused (not needed)",
                      uuidText(id).c_str());
    return CUDA_ERROR_INVALID_VALUE;
  }
  static std::mutex refusedMutex;
  static std::set<Uuid> refused;
  std::lock_guard lock(refusedMutex);
  if (refused.insert(id).second) {
    GPUPROXY_STUB_LOG(kWarn, "cuGetExportTable: table {%s} is not supported", uuidText(id).c_str());
  }
  return CUDA_ERROR_INVALID_VALUE;
}
