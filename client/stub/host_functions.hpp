#pragma once
// Host work on streams (cuLaunchHostFunc, cuStreamAddCallback), run as CUDA runs it: the call
// returns at once, the function runs on a thread of the stub's own once the stream's earlier work
// is done, and the stream's later work waits until it has returned. The daemon does the waiting
// on its side (HostFunction and HostFunctionReturned records, protocol/RING_FORMAT.md): it answers
// the record's token when the function is due and holds the stream until it hears back.
//
// One thread runs every function of the process, each as soon as it is due, whatever the order
// they were queued in (functions on different streams have no order in CUDA either; a function
// due later must not wait for one queued earlier whose stream waits for it). The functions must
// not call CUDA, as with the driver.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include <cuda.h>

namespace gpuproxy::stub {

class DataPlane;

class HostFunctions {
public:
  // `dataPlane` outlives this object (both live until the process exits).
  explicit HostFunctions(DataPlane& dataPlane);
  HostFunctions(const HostFunctions&) = delete;
  HostFunctions& operator=(const HostFunctions&) = delete;

  // Queues `run` on (context, stream): it is called with the stream's status (an error of the
  // stream's earlier work, or CUDA_ERROR_MPS_CONNECTION_FAILED once gpuproxyd is gone) when due.
  // An error here means it was not queued and will not run.
  CUresult launch(std::uint64_t context, std::uint64_t stream, std::function<void(CUresult)> run);

private:
  struct Pending {
    std::uint64_t context = 0;
    std::uint64_t stream = 0;
    std::function<void(CUresult)> run;
  };
  void threadMain();

  DataPlane& dataPlane_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::map<std::uint64_t, Pending> pending_;  // by completion token
};

}  // namespace gpuproxy::stub
