#pragma once
// The PTX interpreter: runs one kernel launch of a decoded Program with a GPU's semantics.
//
// Threads: all threads of a block, each with its own registers, grouped in warps of 32 that
// execute every instruction together (one dispatch per warp-instruction, a loop over its lanes).
// Divergence: a warp is a set of groups (lanes at one pc in one call frame); the deepest frame
// runs first, and within it the group with the lowest pc, so lanes that branched apart meet
// again wherever their paths do, for any control flow. Warps of a block run cooperatively on one
// worker thread: a warp runs until it waits (a barrier, a warp-synchronous instruction whose
// lanes are elsewhere, nanosleep), exits, or has taken enough backward branches to let the others
// run. Blocks of a launch are spread over a pool of worker threads; the calling thread works too.
//
// Memory: each access is checked against the launch's MemoryMap (global and constant memory),
// the block's shared memory, the thread's local memory and the parameter space; the first fault
// stops the launch (every worker stops at its next block or backward branch).

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "server/backend/ptx/ptx_exec.hpp"
#include "server/backend/ptx/ptx_program.hpp"

namespace gpuproxy::server::ptx {

// A decoded module placed in device memory: its variables live at globalBase, except those
// `placements` names (by variable index, 0: not placed elsewhere), which live at that address
// (managed variables in memory the host shares). Everything a launch needs that depends on where
// the module sits is computed here once, at load.
class Executable {
public:
  Executable(std::shared_ptr<const Program> program, std::uint64_t globalBase,
             std::vector<std::uint64_t> placements = {});
  // Where variable `index` lives.
  std::uint64_t variableAddress(std::uint32_t index) const;

  const Program& program() const { return *program_; }
  std::uint64_t globalBase() const { return globalBase_; }
  // The module's variables' initial bytes, relocations applied (for the loader to copy).
  std::vector<std::byte> initialImage() const;
  // The module's variables, held at `host`, as a launch may touch them: .global ones writable,
  // .const ones read-only.
  std::vector<MemoryRange> variableRanges(std::byte* host) const;
  // Values of function `index`'s constant rows; rows listed in localRows() add the frame's
  // local base.
  const std::vector<std::uint64_t>& constants(std::uint32_t index) const {
    return constants_[index];
  }
  const std::vector<std::uint32_t>& localRows(std::uint32_t index) const {
    return localRows_[index];
  }
  // Bytes of local memory each thread of a launch of `kernel` needs: its own frame, plus a stack
  // for the calls it makes (fixed when the call graph recurses).
  std::uint32_t localBytesPerThread(std::uint32_t kernel) const { return stackBytes_[kernel]; }
  // Whether `kernel`'s call graph recurses, so that its stack is a limit rather than its need.
  bool recurses(std::uint32_t kernel) const { return recursive_[kernel]; }
  std::uint64_t addressOf(const Constant& constant) const;

private:
  std::shared_ptr<const Program> program_;
  std::uint64_t globalBase_;
  std::vector<std::uint64_t> placements_;
  std::vector<std::vector<std::uint64_t>> constants_;
  std::vector<std::vector<std::uint32_t>> localRows_;
  std::vector<std::uint32_t> stackBytes_;
  std::vector<bool> recursive_;
};

// Bytes of call stack each thread gets when the kernel's call graph recurses, unless its client
// asked for more (CU_LIMIT_STACK_SIZE, LaunchRequest::stackBytes); deeper recursion stops the
// launch, as a GPU does when a thread overflows its stack.
inline constexpr std::uint32_t kRecursionStackBytes = 4096;
// The most stack a thread may have (CU_LIMIT_STACK_SIZE is clamped to it, as the driver clamps it
// to the local memory a GPU thread can address).
inline constexpr std::uint32_t kMaxStackBytesPerThread = 512 * 1024;
// What each call costs on that stack beyond the callee's .local variables (a return address and
// saved registers on a GPU).
inline constexpr std::uint32_t kCallFrameBytes = 16;
inline constexpr std::uint32_t kMaxCallDepth = 1024;

// Device printf output of one launch: bounded, as the GPU's printf FIFO is (1 MiB by default,
// cudaLimitPrintfFifoSize). When a launch writes more, the oldest output is dropped, as on a GPU,
// whose buffer is circular; `lostBytes` counts what was dropped.
class PrintfBuffer {
public:
  explicit PrintfBuffer(std::size_t capacity) : capacity_(capacity) {}
  std::size_t capacity() const { return capacity_; }
  void append(std::string_view text);
  std::string take();
  std::uint64_t takeLostBytes();
  // Output dropped on the way here (a launch's own buffer overflowed).
  void noteLost(std::uint64_t bytes);
  bool empty() const;

private:
  mutable std::mutex mutex_;
  std::size_t capacity_;
  std::string text_;
  std::uint64_t lost_ = 0;
};

// The device heap kernels allocate from with malloc and free (new and delete): a range of device
// memory whose bookkeeping lives here, out of the kernels' reach. CUDA gives a context one heap of
// cudaLimitMallocHeapSize bytes (8 MiB by default); the sim gives each client one per device.
class DeviceHeap {
public:
  DeviceHeap(std::uint64_t base, std::uint64_t bytes);
  // A block of `bytes` aligned to `alignment` (a power of two); 0 when none is free (as malloc
  // returns NULL on a GPU) or the alignment is not a power of two.
  std::uint64_t allocate(std::uint64_t bytes, std::uint64_t alignment = 16);
  // Frees a block allocate() returned; anything else is ignored (free(NULL) among them).
  void release(std::uint64_t address);

private:
  std::mutex mutex_;
  std::uint64_t base_;
  std::map<std::uint64_t, std::uint64_t> free_;  // offset -> bytes
  std::map<std::uint64_t, std::uint64_t> used_;
};

// What a device lets run beside a launch, as a GPU would: between two blocks, work more urgent
// than the launch (a GPU's block scheduler gives the SMs that free up to a higher-priority
// stream's blocks before the running kernel's next ones) and other streams' work that is not a
// kernel (a GPU's copy engines copy while its SMs compute); between two turns of a block's warps,
// only the latter, so that a kernel of one long block (or one that waits for what another
// stream's copy writes) does not hold copies up. Called only by the thread that called
// Interpreter::run, for blocks it runs.
class BlockBoundary {
public:
  virtual ~BlockBoundary() = default;
  // Cheap, read before every block: whether either kind of work is waiting.
  virtual bool workWaiting() const = 0;
  // Runs that work on the calling thread; the launch then goes on.
  virtual void runWaitingWork() = 0;
  // Cheap, read between two turns of a block's warps: whether work that is not a kernel waits.
  virtual bool besideWorkWaiting() const = 0;
  // Runs that work on the calling thread, in the middle of a block; never a kernel. Asked between
  // two rounds of a cooperative launch's blocks too, whose blocks are all resident at once.
  virtual void runBesideWork() = 0;
};

struct LaunchRequest {
  const Executable* executable = nullptr;
  std::uint32_t kernel = 0;  // function index
  std::uint32_t grid[3] = {1, 1, 1};
  std::uint32_t block[3] = {1, 1, 1};
  std::uint32_t dynamicSharedBytes = 0;
  std::span<const std::byte> parameters;  // the packed buffer, kernelParameterBytes long
  const MemoryMap* memory = nullptr;
  // Set by another thread to abandon the launch (a reset or shutdown); checked at backward
  // branches, nanosleep and between blocks.
  const std::atomic<bool>* stop = nullptr;
  PrintfBuffer* printf = nullptr;  // may be null: output is dropped
  DeviceHeap* heap = nullptr;      // may be null: malloc returns NULL
  // The client's CU_LIMIT_STACK_SIZE: a recursing kernel's threads get at least this much stack
  // (0: kRecursionStackBytes beyond the kernel's frame).
  std::uint32_t stackBytes = 0;
  // A cooperative launch: every block is resident at once, taking turns on the calling thread,
  // so that blocks may wait for each other (a grid barrier); %envreg1/%envreg2 hold the address
  // of the grid's barrier workspace, as cooperative_groups expects from the driver.
  bool cooperative = false;
  // The priority of the launch's stream on its device, lower more urgent (CUDA's order): a worker
  // thread between two blocks leaves it for an active launch more urgent than it.
  int priority = 0;
  // May be null. A cooperative launch, whose blocks are all resident at once, asks it only for
  // work beside its blocks (besideWorkWaiting).
  BlockBoundary* boundary = nullptr;
};

struct LaunchOutcome {
  CUresult status = CUDA_SUCCESS;
  std::string message;  // for a fault: what, where, which thread
  std::uint64_t faultAddress = 0;
  std::uint64_t threadInstructions = 0;  // lanes x instructions executed (for benchmarks)
};

class BlockRunner;

// Runs launches on a pool of worker threads, shared by every device of a backend.
class Interpreter {
public:
  // `workers` helper threads (0: none, the calling thread runs every block).
  explicit Interpreter(unsigned workers);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Blocks until the launch has finished, failed or been stopped.
  LaunchOutcome run(const LaunchRequest& request);
  unsigned workers() const { return static_cast<unsigned>(threads_.size()); }

  struct Launch;

private:
  void workerMain(unsigned index);
  std::unique_ptr<BlockRunner> acquireRunner();
  void releaseRunner(std::unique_ptr<BlockRunner> runner);
  // Runs blocks of `launch` until none is left; a worker (not the caller of run()) also stops
  // when a more urgent launch has blocks left.
  void work(Launch& launch, BlockRunner& runner, unsigned workerIndex, bool caller);
  // Whether an active launch more urgent than `launch` has blocks left to start.
  bool moreUrgentLaunchWaiting(const Launch& launch);
  // The active launch with blocks left to start, the most urgent first; mutex_ held.
  Launch* mostUrgentWithBlocksLocked() const;
  void noteActiveChangedLocked();
  // A cooperative launch: every block resident at once, in turns on the calling thread.
  void runCooperatively(Launch& launch);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Launch*> active_;
  // The smallest priority among active_ (INT_MAX when empty), read without the lock between
  // blocks so that a launch pays for the check only while a more urgent one is active.
  std::atomic<int> mostUrgentActive_{std::numeric_limits<int>::max()};
  bool stopping_ = false;
  std::vector<std::unique_ptr<BlockRunner>> idleRunners_;
  std::vector<std::thread> threads_;
};

}  // namespace gpuproxy::server::ptx
