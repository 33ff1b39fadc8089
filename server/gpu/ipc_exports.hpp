#pragma once
// Interprocess handles of one GPU (cuIpcGetMemHandle, cuIpcGetEventHandle, and physical memory
// exported to a shareable handle, cuMemExportToShareableHandle): what each token names, and for
// whom. A token is 16 random bytes, so a client cannot name an export it was not
// given; and an export opens only for clients of the tenant that made it, so a handle that leaks
// to another tenant is as good as a made-up one. One context per GPU gives every client the same
// address space, so an opened allocation has its exporter's address.
//
// Memory that is mapped elsewhere outlives its exporter's hold on it: when the exporter frees it
// (or goes) while another client still has it open, its charge moves here and the memory is freed
// only when the last mapping is closed. CUDA calls that order undefined behaviour; gpuproxy must
// still never hand memory that one client can reach to anybody else.
//
// A pure table: GpuClient maps and unmaps the memory and frees it. Owned by the GpuShard, and
// touched only on its owner thread.

#include "scheduler/scheduler.hpp"
#include "server/backend/backend.hpp"
#include "server/gpu/memory_charge.hpp"
#include "server/gpu/physical_memory.hpp"
#include "server/tenant/tenant.hpp"

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>

namespace gpuproxy::server {

using IpcToken = std::array<std::byte, 16>;

class IpcExports {
public:
  // Who asks: the client (its per-GPU scheduling id, unique on the GPU) and its tenant.
  struct Party {
    scheduler::ClientId client = 0;
    TenantId tenant = 0;
  };

  // ---- memory
  // The token of allocation [base, base + bytes) of `exporter`'s: the one it already has, else a
  // new one.
  IpcToken exportMemory(Party exporter, CUdeviceptr base, std::uint64_t bytes);
  // An export `importer` may map: its range, one more mapping counted. CUDA_ERROR_INVALID_VALUE for
  // a token this GPU did not make, one its exporter has let go of, or another tenant's;
  // CUDA_ERROR_INVALID_CONTEXT for the exporter itself.
  struct Range {
    CUdeviceptr base = 0;
    std::uint64_t bytes = 0;
  };
  backend::Result<Range> openMemory(const IpcToken& token, Party importer);
  // One mapping of the export at `base` closed. When it was the last, and the exporter had let go
  // of the memory, returns the memory's charge: the caller frees the memory, then drops it.
  std::optional<MemoryCharge> closeMemory(CUdeviceptr base);
  // The exporter lets go of allocation `base` (freed, its context destroyed, its client gone).
  // While it is mapped elsewhere, its charge is kept here and true returned: the caller must not
  // free it. Otherwise false (the caller frees it as usual); either way it opens no more.
  bool keepForImporters(CUdeviceptr base, MemoryCharge& charge);
  // Allocations held here for importers only (tests), and what they cost (status).
  std::size_t memoryKeptForImporters() const;
  std::uint64_t bytesKeptForImporters() const;

  // ---- events
  IpcToken exportEvent(Party exporter, const std::shared_ptr<backend::Event>& event);
  // The exported event, shared with `importer`. Errors as openMemory's; an event its exporter and
  // every importer have destroyed is gone.
  backend::Result<std::shared_ptr<backend::Event>> openEvent(const IpcToken& token, Party importer);
  // The exporter destroyed `event`: it opens no more (importers keep theirs).
  void forgetEvent(const backend::Event& event);

  // ---- physical memory (cuMemExportToShareableHandle)
  // The token of `memory`: the one it already has, else a new one.
  IpcToken exportPhysical(Party exporter, const std::shared_ptr<PhysicalMemory>& memory);
  // The exported memory, shared with `importer` (its exporter too: a process may import its own
  // handle). CUDA_ERROR_INVALID_VALUE for a token this GPU did not make, memory every holder has
  // let go of, or another tenant's.
  backend::Result<std::shared_ptr<PhysicalMemory>> openPhysical(const IpcToken& token,
                                                                Party importer);

private:
  // Objects exported by reference (events, physical memory): a token names its object while any
  // client holds it, and an object has one token.
  template <typename Object>
  class SharedExports {
  public:
    IpcToken add(Party exporter, const std::shared_ptr<Object>& object);
    // Errors as mayOpen's; `exporterOpens`: the exporter may open its own export.
    backend::Result<std::shared_ptr<Object>> open(const IpcToken& token, Party importer,
                                                  bool exporterOpens) const;
    void forget(const Object& object);

  private:
    struct Entry {
      Party exporter;
      std::weak_ptr<Object> object;
    };
    std::map<IpcToken, Entry> entries_;         // by token
    std::map<const Object*, IpcToken> tokens_;  // the token each exported object has
  };

  struct MemoryExport {
    IpcToken token{};
    std::uint64_t bytes = 0;
    Party exporter;
    bool exporterHolds = true;
    unsigned mappings = 0;
    std::optional<MemoryCharge> keptCharge;  // once the exporter let go while mapped elsewhere
  };
  // The export's error for `importer`, or CUDA_SUCCESS.
  static CUresult mayOpen(const Party& exporter, const Party& importer);

  std::map<CUdeviceptr, MemoryExport> memory_;    // by allocation start
  std::map<IpcToken, CUdeviceptr> memoryTokens_;  // of exports whose exporter holds them
  SharedExports<backend::Event> events_;
  SharedExports<PhysicalMemory> physical_;
};

// 16 bytes from the kernel's random source.
IpcToken newIpcToken();

}  // namespace gpuproxy::server
