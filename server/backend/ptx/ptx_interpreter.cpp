#include "server/backend/ptx/ptx_interpreter.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <iterator>
#include <sstream>
#include <utility>

#include "server/backend/ptx/ptx_printf.hpp"

namespace gpuproxy::server::ptx {
namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t alignUp(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Backward branches (and reschedules) a warp may take before the others of its block get a turn:
// enough that a warp runs long stretches, few enough that a warp spinning on shared memory lets
// the one it waits for run, and that a stop request is seen within microseconds.
constexpr int kWarpBudget = 256;
// nanosleep sleeps at most this long (PTX: the duration is in [0, 2 * t] with t up to 1 ms).
constexpr std::uint64_t kMaxSleepNanoseconds = 1'000'000;

std::string hex(std::uint64_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

}  // namespace

// ---- Executable ------------------------------------------------------------------------------

Executable::Executable(std::shared_ptr<const Program> program, std::uint64_t globalBase,
                       std::vector<std::uint64_t> placements)
    : program_(std::move(program)), globalBase_(globalBase), placements_(std::move(placements)) {
  const auto count = static_cast<std::uint32_t>(program_->functions.size());
  constants_.resize(count);
  localRows_.resize(count);
  stackBytes_.assign(count, 0);
  recursive_.assign(count, false);
  for (std::uint32_t f = 0; f < count; ++f) {
    const Function& function = program_->functions[f];
    for (std::size_t c = 0; c < function.constants.size(); ++c) {
      const Constant& constant = function.constants[c];
      if (constant.kind == Constant::Kind::kLocalAddress) {
        constants_[f].push_back(constant.value + static_cast<std::uint64_t>(constant.addend));
        localRows_[f].push_back(function.registerRows + static_cast<std::uint32_t>(c));
      } else {
        constants_[f].push_back(addressOf(constant));
      }
    }
  }
  // Stack needs: the deepest chain of frames from each kernel, or a fixed stack when the chain
  // has no bound (recursion, calls through pointers). Iterative, so a hostile module's call
  // graph cannot exhaust the daemon's own stack.
  constexpr std::uint64_t kUnbounded = ~0ull;
  std::vector<std::uint64_t> need(count, 0);
  std::vector<std::uint8_t> state(count, 0);  // 0 new, 1 on the path, 2 done
  auto frameBytes = [&](std::uint32_t f) { return alignUp(program_->functions[f].localBytes, 16); };
  for (std::uint32_t root = 0; root < count; ++root) {
    if (state[root] != 0) continue;
    std::vector<std::pair<std::uint32_t, std::size_t>> path{{root, 0}};
    state[root] = 1;
    while (!path.empty()) {
      auto& [f, next] = path.back();
      const std::vector<Instruction>& code = program_->functions[f].code;
      bool descended = false;
      while (next < code.size()) {
        const Instruction& instruction = code[next++];
        if (instruction.flow != Flow::kCall) continue;
        if (instruction.op[0] != kNoRegister) {
          need[f] = kUnbounded;  // through a pointer: any function, any depth
          continue;
        }
        const std::uint32_t callee = instruction.target;
        if (callee >= count || !program_->functions[callee].defined) continue;
        if (state[callee] == 1) {
          need[f] = kUnbounded;  // recursion
          continue;
        }
        if (state[callee] == 0) {
          state[callee] = 1;
          path.emplace_back(callee, 0);
          descended = true;
          break;
        }
        const std::uint64_t below = need[callee];
        need[f] = (below == kUnbounded || need[f] == kUnbounded)
                      ? kUnbounded
                      : std::max(need[f], below + kCallFrameBytes);
      }
      if (descended) continue;
      // Done with f: its frame plus its deepest callee.
      const std::uint32_t done = f;
      if (need[done] != kUnbounded) need[done] += frameBytes(done);
      state[done] = 2;
      path.pop_back();
      if (!path.empty()) {
        const std::uint32_t parent = path.back().first;
        const std::uint64_t below = need[done];
        need[parent] = (below == kUnbounded || need[parent] == kUnbounded)
                           ? kUnbounded
                           : std::max(need[parent], below + kCallFrameBytes);
      }
    }
  }
  for (std::uint32_t f = 0; f < count; ++f) {
    std::uint64_t bytes = need[f];
    if (bytes == kUnbounded) {
      bytes = frameBytes(f) + kRecursionStackBytes;
      recursive_[f] = true;
    }
    stackBytes_[f] = static_cast<std::uint32_t>(std::max<std::uint64_t>(alignUp(bytes, 16), 16));
  }
}

std::uint64_t Executable::variableAddress(std::uint32_t index) const {
  if (index < placements_.size() && placements_[index] != 0) return placements_[index];
  return globalBase_ + program_->globalOffsets[index];
}

std::uint64_t Executable::addressOf(const Constant& constant) const {
  switch (constant.kind) {
    case Constant::Kind::kVariableAddress:
      return variableAddress(constant.symbol) + static_cast<std::uint64_t>(constant.addend);
    case Constant::Kind::kFunctionAddress:
      return kFunctionWindow + std::uint64_t{constant.symbol} * kFunctionStride +
             static_cast<std::uint64_t>(constant.addend);
    default:
      return constant.value;
  }
}

std::vector<MemoryRange> Executable::variableRanges(std::byte* host) const {
  std::vector<MemoryRange> ranges;
  const std::uint64_t bytes = program_->globalBytes;
  const std::uint64_t writable = std::min(program_->constOffset, bytes);
  if (writable > 0) ranges.push_back({globalBase_, globalBase_ + writable, host, true});
  if (bytes > writable) {
    ranges.push_back({globalBase_ + writable, globalBase_ + bytes, host + writable, false});
  }
  return ranges;
}

std::vector<std::byte> Executable::initialImage() const {
  std::vector<std::byte> image(program_->globalBytes);
  for (std::size_t v = 0; v < program_->variables.size(); ++v) {
    const Variable& variable = program_->variables[v];
    if (variable.space != Space::kGlobal && variable.space != Space::kConst) continue;
    const std::uint64_t base = program_->globalOffsets[v];
    if (!variable.initializer.empty()) {
      std::memcpy(image.data() + base, variable.initializer.data(), variable.initializer.size());
    }
    for (const Variable::Relocation& relocation : variable.relocations) {
      std::uint64_t value = 0;
      if (relocation.function) {
        value = kFunctionWindow + std::uint64_t{relocation.symbol} * kFunctionStride;
      } else {
        const Variable& target = program_->variables[relocation.symbol];
        if (target.space == Space::kShared) {
          value = (relocation.generic ? kSharedWindow : 0) + target.sharedOffset;
        } else {
          value = variableAddress(relocation.symbol);
        }
      }
      value += static_cast<std::uint64_t>(relocation.addend);
      value >>= relocation.shift;
      std::memcpy(image.data() + base + relocation.offset, &value, relocation.bytes);
    }
  }
  return image;
}

// ---- Device heap -----------------------------------------------------------------------------

DeviceHeap::DeviceHeap(std::uint64_t base, std::uint64_t bytes) : base_(base) {
  if (bytes > 0) free_.emplace(0, bytes);
}

std::uint64_t DeviceHeap::allocate(std::uint64_t bytes, std::uint64_t alignment) {
  // Not a power of two: NULL, as __nv_aligned_device_malloc answers. Blocks are at least 16-byte
  // aligned (malloc's alignment on a GPU) and sized in 16-byte steps.
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) return 0;
  alignment = std::max<std::uint64_t>(alignment, 16);
  const std::uint64_t size = alignUp(std::max<std::uint64_t>(bytes, 1), 16);
  if (size < bytes) return 0;
  std::lock_guard lock(mutex_);
  for (auto block = free_.begin(); block != free_.end(); ++block) {
    const auto [offset, available] = *block;
    const std::uint64_t start = alignUp(base_ + offset, alignment) - base_;
    if (start < offset || start - offset > available || available - (start - offset) < size) {
      continue;
    }
    free_.erase(block);
    // What is left before and after the block stays free.
    if (start > offset) free_.emplace(offset, start - offset);
    const std::uint64_t end = start + size;
    if (offset + available > end) free_.emplace(end, offset + available - end);
    used_.emplace(start, size);
    return base_ + start;
  }
  return 0;
}

void DeviceHeap::release(std::uint64_t address) {
  if (address < base_) return;
  std::lock_guard lock(mutex_);
  const auto used = used_.find(address - base_);
  if (used == used_.end()) return;
  std::uint64_t offset = used->first;
  std::uint64_t size = used->second;
  used_.erase(used);
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      offset = previous->first;
      size += previous->second;
      free_.erase(previous);
    }
  }
  free_.emplace(offset, size);
}

// ---- Printf buffer ---------------------------------------------------------------------------

void PrintfBuffer::append(std::string_view text) {
  std::lock_guard lock(mutex_);
  text_.append(text);
  if (text_.size() > capacity_) {
    // Circular, as the GPU's: the oldest output goes, whole lines where possible.
    std::size_t drop = text_.size() - capacity_;
    const std::size_t newline = text_.find('\n', drop);
    if (newline != std::string::npos && newline + 1 <= text_.size()) drop = newline + 1;
    lost_ += drop;
    text_.erase(0, drop);
  }
}

std::string PrintfBuffer::take() {
  std::lock_guard lock(mutex_);
  return std::exchange(text_, {});
}

std::uint64_t PrintfBuffer::takeLostBytes() {
  std::lock_guard lock(mutex_);
  return std::exchange(lost_, 0);
}

void PrintfBuffer::noteLost(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  lost_ += bytes;
}

bool PrintfBuffer::empty() const {
  std::lock_guard lock(mutex_);
  return text_.empty() && lost_ == 0;
}

// ---- One launch ------------------------------------------------------------------------------

struct Interpreter::Launch {
  const LaunchRequest* request = nullptr;
  const Executable* executable = nullptr;
  const Program* program = nullptr;
  const Function* kernel = nullptr;
  std::uint64_t totalBlocks = 0;
  std::uint32_t threadsPerBlock = 0;
  std::uint32_t warpsPerBlock = 0;
  std::uint64_t sharedBytes = 0;  // the kernel's, and the reserved region if it uses it
  std::uint64_t reservedSharedOffset = 0;
  std::uint32_t localStride = 0;
  unsigned workerCount = 1;
  std::atomic<std::uint64_t> nextBlock{0};
  std::atomic<bool> failed{false};
  std::atomic<std::uint64_t> threadInstructions{0};
  unsigned helpers = 0;  // guarded by Interpreter::mutex_
  std::mutex mutex;
  LaunchOutcome outcome;
  // A cooperative launch's grid barrier workspace, laid out as cooperative_groups' driver ABI
  // reads it (its size, then the barrier word), and the global memory range that holds it.
  alignas(8) std::uint32_t gridWorkspace[2] = {sizeof gridWorkspace, 0};
  MemoryRange gridWorkspaceRange;

  bool stopRequested() const {
    return request->stop != nullptr && request->stop->load(std::memory_order_relaxed);
  }
  bool shouldStop() const { return failed.load(std::memory_order_relaxed) || stopRequested(); }
  void fail(CUresult status, std::string message, std::uint64_t address) {
    std::lock_guard lock(mutex);
    if (outcome.status == CUDA_SUCCESS) {
      outcome.status = status;
      outcome.message = std::move(message);
      outcome.faultAddress = address;
    }
    failed.store(true, std::memory_order_relaxed);
  }
};

// Per-thread local memory of a block: reserved address space, backed only where touched.
class LocalMemory {
public:
  LocalMemory() = default;
  ~LocalMemory() { release(); }
  LocalMemory(const LocalMemory&) = delete;
  LocalMemory& operator=(const LocalMemory&) = delete;

  // At least `bytes`, all zero.
  std::byte* zeroed(std::size_t bytes) {
    if (bytes > capacity_) {
      release();
      void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (memory == MAP_FAILED) return nullptr;
      base_ = static_cast<std::byte*>(memory);
      capacity_ = bytes;
      used_ = 0;
    } else if (used_ > 0) {
      madvise(base_, used_, MADV_DONTNEED);  // reads as zeros again
    }
    used_ = bytes;
    return base_;
  }

private:
  void release() {
    if (base_ != nullptr) munmap(base_, capacity_);
    base_ = nullptr;
    capacity_ = 0;
    used_ = 0;
  }
  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
};

// What a worker thread keeps between blocks and launches.
class BlockRunner {
public:
  BlockRunner() { context_.fault = &fault_; }

  bool prepare(Interpreter::Launch& launch, unsigned workerIndex);
  // Runs one block to its end; false when it faulted or the launch is to stop.
  // `beside`, when not null, may run work beside the block between two turns of its warps.
  bool runBlock(std::uint64_t linearIndex, BlockBoundary* beside);

  // A block run in turns, beside others (a cooperative launch): started, stepped until it is done
  // or failed, finished.
  enum class BlockState : std::uint8_t { kRunning, kSleeping, kDone, kFailed };
  void startBlock(std::uint64_t linearIndex);
  // One turn of every warp that can run. `alone`: no other block shares the thread, so when every
  // warp sleeps (nanosleep) the thread sleeps too; else kSleeping says so.
  BlockState stepBlock(bool alone);
  void finishBlock();
  std::uint64_t takeInstructionCount() { return std::exchange(instructions_, 0); }

private:
  enum class Wait : std::uint8_t { kNone, kBarrier, kWarpSync, kSleep };
  struct Group {
    std::uint32_t pc = 0;
    std::uint32_t mask = 0;
    Frame* frame = nullptr;
    Wait wait = Wait::kNone;
    bool forced = false;  // run a warp-synchronous instruction with the lanes at hand
    std::uint32_t barrier = 0;
    Clock::time_point wakeAt{};
  };
  struct Warp {
    std::uint32_t index = 0;
    std::uint32_t present = 0;  // lanes that exist (the last warp of a block may be partial)
    std::uint32_t live = 0;     // lanes that have not exited
    std::vector<Group> groups;
    std::uint32_t tid[3][kWarpSize] = {};
  };
  struct Barrier {
    std::uint32_t arrived = 0;
    std::uint32_t expected = 0;  // 0: every live thread of the block
    std::uint32_t popc = 0;
    bool all = true;
    bool any = false;
  };
  enum class Step : std::uint8_t { kReschedule, kYield, kFault };

  Frame* acquireFrame(std::uint32_t function, std::uint32_t localBase);
  void releaseFrame(Frame* frame);
  void bind(Frame* frame);
  enum class Progress : std::uint8_t { kRan, kWaiting, kFault };
  Progress runWarp(Warp& warp);
  Group* pick(Warp& warp);
  Step runGroup(Warp& warp, std::size_t index, int& budget);
  Step faultAt(const Instruction& instruction, Warp& warp, std::uint32_t mask);
  Step stop(CUresult status, std::string message, Warp& warp, std::uint32_t lane,
            std::uint64_t address = 0);
  void exitLanes(Warp& warp, Frame* frame, std::uint32_t lanes);
  void checkBarrier(std::uint32_t id);
  void releaseBarrier(std::uint32_t id);
  bool callBuiltin(Warp& warp, const Function& callee, const CallSite& site, std::uint32_t lanes,
                   const Instruction& call, Step& step);
  std::string where(const Warp& warp, std::uint32_t lane) const;
  bool resolveDeadlock();

  Interpreter::Launch* launch_ = nullptr;
  const Executable* executable_ = nullptr;
  std::uint64_t generation_ = 0;
  ExecContext context_;
  Fault fault_;
  std::vector<Warp> warps_;
  std::vector<std::byte> sharedStorage_;
  LocalMemory local_;
  std::vector<std::vector<std::unique_ptr<Frame>>> freeFrames_;  // by function index
  std::vector<std::unique_ptr<Frame>> frames_;                   // every frame made
  std::vector<std::uint64_t> frameGeneration_;
  Barrier barriers_[16];
  std::uint32_t liveThreads_ = 0;
  std::uint32_t sleepers_ = 0;
  std::uint64_t instructions_ = 0;
};

Frame* BlockRunner::acquireFrame(std::uint32_t function, std::uint32_t localBase) {
  const Program& program = executable_->program();
  const Function& code = program.functions[function];
  std::unique_ptr<Frame> frame;
  auto& pool = freeFrames_[function];
  const bool fresh = pool.empty();
  if (!fresh) {
    frame = std::move(pool.back());
    pool.pop_back();
  } else {
    frame = std::make_unique<Frame>();
    frame->function = &code;
    frame->regStorage.assign(static_cast<std::size_t>(code.rows()) * kWarpSize, 0);
    frame->predStorage.assign(std::max<std::uint32_t>(code.predicates, 1), 0);
    frame->paramStorage.assign(
        std::max<std::size_t>(std::size_t{code.parameterStride()} * kWarpSize, 1), std::byte{0});
    frame->regs = frame->regStorage.data();
    frame->preds = frame->predStorage.data();
    frame->params = frame->paramStorage.data();
    // Constant rows never change while the frame lives; local addresses depend on localBase.
    const std::vector<std::uint64_t>& values = executable_->constants(function);
    for (std::size_t c = 0; c < values.size(); ++c) {
      std::uint64_t* row = frame->regs + (code.registerRows + c) * kWarpSize;
      std::fill(row, row + kWarpSize, values[c]);
    }
    frame->localBase = 0;
  }
  const std::vector<std::uint32_t>& localRows = executable_->localRows(function);
  if (!localRows.empty() && (fresh || frame->localBase != localBase)) {
    const std::vector<std::uint64_t>& values = executable_->constants(function);
    for (const std::uint32_t row : localRows) {
      const std::uint64_t value = values[row - code.registerRows] + localBase;
      std::fill(frame->regs + std::size_t{row} * kWarpSize,
                frame->regs + std::size_t{row + 1} * kWarpSize, value);
    }
  }
  frame->localBase = localBase;
  frame->caller = nullptr;
  frame->liveMask = 0;
  frame->depth = 0;
  Frame* raw = frame.release();
  return raw;
}

void BlockRunner::releaseFrame(Frame* frame) {
  const auto index =
      static_cast<std::size_t>(frame->function - executable_->program().functions.data());
  freeFrames_[index].emplace_back(frame);
}

bool BlockRunner::prepare(Interpreter::Launch& launch, unsigned workerIndex) {
  const bool sameModule = executable_ == launch.executable;
  launch_ = &launch;
  executable_ = launch.executable;
  ++generation_;
  // Frames hold registers of the previous launch (perhaps another client's): start afresh.
  freeFrames_.clear();
  freeFrames_.resize(launch.program->functions.size());
  (void)sameModule;
  const LaunchRequest& request = *launch.request;
  context_ = ExecContext{};
  context_.fault = &fault_;
  fault_ = Fault{};
  context_.launch = nullptr;
  context_.kernelParams = request.parameters.data();
  context_.kernelParamBytes = static_cast<std::uint32_t>(request.parameters.size());
  context_.memory = request.memory;
  context_.gridWorkspace = request.cooperative ? &launch.gridWorkspaceRange : nullptr;
  context_.lastRange = nullptr;
  for (int d = 0; d < 3; ++d) {
    context_.ntid[d] = request.block[d];
    context_.nctaid[d] = request.grid[d];
  }
  context_.warpsPerBlock = launch.warpsPerBlock;
  context_.workerIndex = workerIndex;
  context_.workerCount = launch.workerCount;
  context_.dynamicSharedBytes = request.dynamicSharedBytes;
  context_.sharedBytes = launch.sharedBytes;
  context_.reservedSharedOffset = launch.reservedSharedOffset;
  sharedStorage_.assign(std::max<std::uint64_t>(launch.sharedBytes, 16) + 16, std::byte{0});
  // 16-byte aligned, for 128-bit accesses and atomics.
  const auto address = reinterpret_cast<std::uintptr_t>(sharedStorage_.data());
  context_.shared = sharedStorage_.data() + (alignUp(address, 16) - address);
  context_.localStride = launch.localStride;
  context_.local = local_.zeroed(std::size_t{launch.localStride} * launch.threadsPerBlock);
  if (context_.local == nullptr) {
    launch.fail(CUDA_ERROR_OUT_OF_MEMORY, "no memory for the threads' local memory", 0);
    return false;
  }
  warps_.resize(launch.warpsPerBlock);
  for (std::uint32_t w = 0; w < launch.warpsPerBlock; ++w) {
    Warp& warp = warps_[w];
    warp.index = w;
    warp.present = 0;
    warp.groups.clear();
    warp.groups.reserve(kWarpSize);
    for (std::uint32_t lane = 0; lane < kWarpSize; ++lane) {
      const std::uint32_t t = w * kWarpSize + lane;
      if (t >= launch.threadsPerBlock) {
        warp.tid[0][lane] = warp.tid[1][lane] = warp.tid[2][lane] = 0;
        continue;
      }
      warp.present |= 1u << lane;
      warp.tid[0][lane] = t % request.block[0];
      warp.tid[1][lane] = (t / request.block[0]) % request.block[1];
      warp.tid[2][lane] = t / (request.block[0] * request.block[1]);
    }
  }
  return true;
}

void BlockRunner::bind(Frame* frame) {
  context_.frame = frame;
  context_.regs = frame->regs;
  context_.preds = frame->preds;
  context_.params = frame->params;
  context_.paramStride = frame->function->parameterStride();
  context_.localBase = frame->localBase;
}

std::string BlockRunner::where(const Warp& warp, std::uint32_t lane) const {
  std::ostringstream out;
  out << "thread (" << warp.tid[0][lane] << "," << warp.tid[1][lane] << "," << warp.tid[2][lane]
      << ") of block (" << context_.ctaid[0] << "," << context_.ctaid[1] << "," << context_.ctaid[2]
      << ")";
  return out.str();
}

BlockRunner::Step BlockRunner::stop(CUresult status, std::string message, Warp& warp,
                                    std::uint32_t lane, std::uint64_t address) {
  launch_->fail(status,
                "kernel '" + launch_->kernel->name + "': " + message + " in " + where(warp, lane),
                address);
  return Step::kFault;
}

BlockRunner::Step BlockRunner::faultAt(const Instruction& instruction, Warp& warp,
                                       std::uint32_t mask) {
  const Function& function = *context_.frame->function;
  const std::string& source = instruction.source < function.sourceLines.size()
                                  ? function.sourceLines[instruction.source]
                                  : std::string("?");
  // The handler's message names the lane; report the first lane of the warp-instruction.
  std::string message = fault_.what + " at " + source;
  if (&function != launch_->kernel) message += " in function '" + function.name + "'";
  const std::uint32_t lane = mask == 0 ? 0 : static_cast<std::uint32_t>(std::countr_zero(mask));
  const CUresult status = fault_.status == CUDA_SUCCESS ? CUDA_ERROR_LAUNCH_FAILED : fault_.status;
  return stop(status, message, warp, lane, fault_.address);
}

void BlockRunner::startBlock(std::uint64_t linearIndex) {
  const LaunchRequest& request = *launch_->request;
  context_.ctaid[0] = static_cast<std::uint32_t>(linearIndex % request.grid[0]);
  context_.ctaid[1] = static_cast<std::uint32_t>((linearIndex / request.grid[0]) % request.grid[1]);
  context_.ctaid[2] =
      static_cast<std::uint32_t>(linearIndex / (std::uint64_t{request.grid[0]} * request.grid[1]));
  if (launch_->sharedBytes > 0) std::memset(context_.shared, 0, launch_->sharedBytes);
  for (Barrier& barrier : barriers_) barrier = Barrier{};
  liveThreads_ = launch_->threadsPerBlock;
  sleepers_ = 0;
  const auto kernelIndex =
      static_cast<std::uint32_t>(launch_->kernel - executable_->program().functions.data());
  for (Warp& warp : warps_) {
    warp.live = warp.present;
    warp.groups.clear();
    Frame* root = acquireFrame(kernelIndex, 0);
    root->liveMask = warp.present;
    warp.groups.push_back(Group{0, warp.present, root});
  }
}

BlockRunner::BlockState BlockRunner::stepBlock(bool alone) {
  bool ran = false;
  for (Warp& warp : warps_) {
    if (warp.live == 0) continue;
    const bool runnable =
        std::any_of(warp.groups.begin(), warp.groups.end(), [&](const Group& group) {
          return group.wait == Wait::kNone || group.wait == Wait::kWarpSync;
        });
    if (!runnable) continue;
    const Progress progress = runWarp(warp);
    if (progress == Progress::kFault) return BlockState::kFailed;
    ran = ran || progress == Progress::kRan;
  }
  if (std::all_of(warps_.begin(), warps_.end(), [](const Warp& warp) { return warp.live == 0; })) {
    return BlockState::kDone;
  }
  if (launch_->shouldStop()) return BlockState::kFailed;
  if (ran) return BlockState::kRunning;
  if (sleepers_ > 0) {
    // Every runnable warp sleeps: alone, sleep until the first wakes (in slices, to see a stop).
    Clock::time_point earliest = Clock::time_point::max();
    for (const Warp& warp : warps_) {
      for (const Group& group : warp.groups) {
        if (group.wait == Wait::kSleep) earliest = std::min(earliest, group.wakeAt);
      }
    }
    const Clock::time_point now = Clock::now();
    if (alone && earliest > now) {
      std::this_thread::sleep_until(std::min(earliest, now + std::chrono::milliseconds(1)));
    }
    const Clock::time_point after = Clock::now();
    bool woke = false;
    for (Warp& warp : warps_) {
      for (Group& group : warp.groups) {
        if (group.wait == Wait::kSleep && group.wakeAt <= after) {
          group.wait = Wait::kNone;
          --sleepers_;
          woke = true;
        }
      }
    }
    return woke || alone ? BlockState::kRunning : BlockState::kSleeping;
  }
  if (resolveDeadlock()) return BlockState::kRunning;
  // Every thread waits for others that can never come: a GPU would hang here.
  Warp& stuck =
      *std::find_if(warps_.begin(), warps_.end(), [](const Warp& warp) { return warp.live != 0; });
  stop(CUDA_ERROR_LAUNCH_FAILED,
       "deadlock: every thread left waits at a barrier that cannot complete (threads that "
       "exited or never arrive)",
       stuck, static_cast<std::uint32_t>(std::countr_zero(stuck.live)));
  return BlockState::kFailed;
}

void BlockRunner::finishBlock() {
  // Frames back to the pool.
  for (Warp& warp : warps_) {
    for (Group& group : warp.groups) {
      for (Frame* frame = group.frame; frame != nullptr && frame->liveMask != 0;) {
        Frame* caller = frame->caller;
        frame->liveMask = 0;
        releaseFrame(frame);
        frame = caller;
      }
    }
    warp.groups.clear();
  }
}

bool BlockRunner::runBlock(std::uint64_t linearIndex, BlockBoundary* beside) {
  startBlock(linearIndex);
  BlockState state = BlockState::kRunning;
  while (state == BlockState::kRunning || state == BlockState::kSleeping) {
    // No warp is in the middle of an instruction here, and what runs touches no state of ours.
    if (beside != nullptr && beside->besideWorkWaiting()) beside->runBesideWork();
    state = stepBlock(/*alone=*/true);
  }
  finishBlock();
  return state == BlockState::kDone;
}

// No warp can run: if some wait at warp-synchronous instructions for lanes that are elsewhere
// (diverged code syncing at different instructions, which sm_70+ allows), run the first such
// group with the lanes it has.
bool BlockRunner::resolveDeadlock() {
  for (Warp& warp : warps_) {
    Group* best = nullptr;
    for (Group& group : warp.groups) {
      if (group.wait == Wait::kWarpSync && (best == nullptr || group.pc < best->pc)) best = &group;
    }
    if (best != nullptr) {
      best->wait = Wait::kNone;
      best->forced = true;
      return true;
    }
  }
  return false;
}

// Merges groups that meet (same frame, same pc) and picks the next to run: the deepest frame
// first, then the lowest pc.
BlockRunner::Group* BlockRunner::pick(Warp& warp) {
  std::vector<Group>& groups = warp.groups;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    Group& a = groups[i];
    if (a.wait != Wait::kNone && a.wait != Wait::kWarpSync) continue;
    for (std::size_t j = i + 1; j < groups.size();) {
      Group& b = groups[j];
      if ((b.wait == Wait::kNone || b.wait == Wait::kWarpSync) && b.pc == a.pc &&
          b.frame == a.frame) {
        a.mask |= b.mask;
        a.wait = Wait::kNone;
        a.forced = false;
        groups.erase(groups.begin() + static_cast<std::ptrdiff_t>(j));
        continue;
      }
      ++j;
    }
  }
  Group* best = nullptr;
  for (Group& group : groups) {
    if (group.wait != Wait::kNone) continue;
    if (best == nullptr || group.frame->depth > best->frame->depth ||
        (group.frame->depth == best->frame->depth && group.pc < best->pc)) {
      best = &group;
    }
  }
  return best;
}

BlockRunner::Progress BlockRunner::runWarp(Warp& warp) {
  int budget = kWarpBudget;
  bool ran = false;
  context_.warpIndex = warp.index;
  context_.tid[0] = warp.tid[0];
  context_.tid[1] = warp.tid[1];
  context_.tid[2] = warp.tid[2];
  while (warp.live != 0) {
    Group* group = pick(warp);
    if (group == nullptr) break;  // everything waits
    ran = true;
    const Step step = runGroup(warp, static_cast<std::size_t>(group - warp.groups.data()), budget);
    if (step == Step::kFault) return Progress::kFault;
    if (step == Step::kYield || --budget <= 0) break;
  }
  return ran ? Progress::kRan : Progress::kWaiting;
}

void BlockRunner::exitLanes(Warp& warp, Frame* frame, std::uint32_t lanes) {
  warp.live &= ~lanes;
  for (Frame* f = frame; f != nullptr;) {
    Frame* caller = f->caller;
    f->liveMask &= ~lanes;
    if (f->liveMask == 0) releaseFrame(f);
    f = caller;
  }
  liveThreads_ -= static_cast<std::uint32_t>(std::popcount(lanes));
  for (std::uint32_t id = 0; id < 16; ++id) {
    if (barriers_[id].arrived > 0) checkBarrier(id);
  }
}

void BlockRunner::checkBarrier(std::uint32_t id) {
  Barrier& barrier = barriers_[id];
  const std::uint32_t expected = barrier.expected != 0 ? barrier.expected : liveThreads_;
  if (barrier.arrived >= expected) releaseBarrier(id);
}

void BlockRunner::releaseBarrier(std::uint32_t id) {
  const Barrier barrier = barriers_[id];
  barriers_[id] = Barrier{};
  for (Warp& warp : warps_) {
    for (Group& group : warp.groups) {
      if (group.wait != Wait::kBarrier || group.barrier != id) continue;
      const Instruction& instruction = group.frame->function->code[group.pc];
      const unsigned kind = instruction.flags & 7;
      if (kind == 2) {
        std::uint64_t* d = group.frame->regs + std::size_t{instruction.op[2]} * kWarpSize;
        forLanes(group.mask, [&](std::uint32_t lane) { d[lane] = barrier.popc; });
      } else if (kind == 3 || kind == 4) {
        const bool value = kind == 3 ? barrier.all : barrier.any;
        std::uint32_t& p = group.frame->preds[instruction.op[2]];
        p = value ? (p | group.mask) : (p & ~group.mask);
      }
      group.wait = Wait::kNone;
      ++group.pc;
    }
  }
}

bool BlockRunner::callBuiltin(Warp& warp, const Function& callee, const CallSite& site,
                              std::uint32_t lanes, const Instruction& call, Step& step) {
  const auto builtin = static_cast<Builtin>(callee.builtinId);
  Frame* frame = context_.frame;
  auto argument = [&](std::uint32_t lane, std::size_t index) {
    std::uint64_t value = 0;
    if (index < site.arguments.size()) {
      const CallSite::Slot& slot = site.arguments[index];
      std::memcpy(&value,
                  frame->params + std::size_t{lane} * frame->function->parameterStride() +
                      slot.callerOffset,
                  std::min<std::uint32_t>(slot.bytes, 8));
    }
    return value;
  };
  auto result = [&](std::uint32_t lane, std::uint64_t value) {
    if (site.results.empty()) return;
    const CallSite::Slot& slot = site.results[0];
    std::memcpy(
        frame->params + std::size_t{lane} * frame->function->parameterStride() + slot.callerOffset,
        &value, std::min<std::uint32_t>(slot.bytes, 8));
  };
  switch (builtin) {
    case Builtin::kVprintf: {
      bool ok = true;
      forLanes(lanes, [&](std::uint32_t lane) {
        if (!ok) return;
        const PrintfResult printed =
            formatDevicePrintf(context_, lane, argument(lane, 0), argument(lane, 1));
        if (!printed.ok) {
          ok = false;
          return;
        }
        if (launch_->request->printf != nullptr) launch_->request->printf->append(printed.text);
        result(lane, static_cast<std::uint64_t>(static_cast<std::int64_t>(printed.arguments)));
      });
      if (!ok) {
        step = faultAt(call, warp, lanes);
        return false;
      }
      return true;
    }
    case Builtin::kAssertFail: {
      const std::uint32_t lane = static_cast<std::uint32_t>(std::countr_zero(lanes));
      std::string message;
      std::string file;
      std::string function;
      if (!readDeviceString(context_, lane, argument(lane, 0), message) ||
          !readDeviceString(context_, lane, argument(lane, 1), file) ||
          !readDeviceString(context_, lane, argument(lane, 3), function)) {
        step = faultAt(call, warp, lanes);
        return false;
      }
      const auto line = static_cast<std::uint32_t>(argument(lane, 2));
      std::ostringstream text;
      text << file << ":" << line << ": " << function << ": block: [" << context_.ctaid[0] << ","
           << context_.ctaid[1] << "," << context_.ctaid[2] << "], thread: [" << warp.tid[0][lane]
           << "," << warp.tid[1][lane] << "," << warp.tid[2][lane] << "] Assertion `" << message
           << "` failed.\n";
      if (launch_->request->printf != nullptr) launch_->request->printf->append(text.str());
      step = stop(CUDA_ERROR_ASSERT, "assertion `" + message + "` failed", warp, lane);
      return false;
    }
    case Builtin::kMalloc:
      forLanes(lanes, [&](std::uint32_t lane) {
        DeviceHeap* heap = launch_->request->heap;
        result(lane, heap != nullptr ? heap->allocate(argument(lane, 0)) : 0);
      });
      return true;
    case Builtin::kAlignedMalloc:
      forLanes(lanes, [&](std::uint32_t lane) {
        DeviceHeap* heap = launch_->request->heap;
        result(lane, heap != nullptr ? heap->allocate(argument(lane, 0), argument(lane, 1)) : 0);
      });
      return true;
    case Builtin::kFree:
      forLanes(lanes, [&](std::uint32_t lane) {
        if (launch_->request->heap != nullptr) launch_->request->heap->release(argument(lane, 0));
      });
      return true;
    case Builtin::kGraphSetConditional: {
      // A handle that is no value of this client's faults as a bad store would.
      bool ok = true;
      forLanes(lanes, [&](std::uint32_t lane) {
        if (!ok) return;
        std::byte* value =
            translate(context_, Space::kGlobal, argument(lane, 0), 4, 4, lane, /*write=*/true);
        if (value == nullptr) {
          ok = false;
          return;
        }
        const auto set = static_cast<std::uint32_t>(argument(lane, 1));
        std::memcpy(value, &set, sizeof set);
      });
      if (!ok) {
        step = faultAt(call, warp, lanes);
        return false;
      }
      return true;
    }
    default:
      step = stop(CUDA_ERROR_NOT_SUPPORTED, "call to external function '" + callee.name + "'", warp,
                  static_cast<std::uint32_t>(std::countr_zero(lanes)));
      return false;
  }
}

BlockRunner::Step BlockRunner::runGroup(Warp& warp, std::size_t index, int& budget) {
  Frame* frame = warp.groups[index].frame;
  bind(frame);
  const Function& function = *frame->function;
  const Instruction* code = function.code.data();
  std::uint32_t pc = warp.groups[index].pc;
  std::uint32_t mask = warp.groups[index].mask;
  const bool forced = warp.groups[index].forced;
  warp.groups[index].forced = false;
  // Another group of this frame ahead of us: stop there to meet it.
  std::uint32_t limit = 0xffffffffu;
  for (std::size_t i = 0; i < warp.groups.size(); ++i) {
    const Group& other = warp.groups[i];
    if (i != index && other.frame == frame && other.pc > pc &&
        (other.wait == Wait::kNone || other.wait == Wait::kWarpSync)) {
      limit = std::min(limit, other.pc);
    }
  }
  context_.groupMask = mask;
  std::uint64_t executed = 0;
  auto save = [&]() {
    Group& group = warp.groups[index];
    group.pc = pc;
    group.mask = mask;
    instructions_ += executed;
  };
  // Lanes of the group leave it for another pc: a new group (same frame).
  auto split = [&](std::uint32_t lanes, std::uint32_t at) {
    if (lanes != 0) warp.groups.push_back(Group{at, lanes, frame});
  };
  for (;;) {
    if (pc >= limit) {
      save();
      return Step::kReschedule;
    }
    const Instruction& instruction = code[pc];
    std::uint32_t exec = mask;
    if (instruction.guard != kNoPredicate) {
      const std::uint32_t p = context_.preds[instruction.guard];
      exec &= instruction.guardNegated != 0 ? ~p : p;
    }
    switch (instruction.flow) {
      case Flow::kPlain:
        if (exec != 0) {
          instruction.handler(context_, instruction, exec);
          executed += static_cast<std::uint64_t>(std::popcount(exec));
        }
        ++pc;
        continue;
      case Flow::kMemory:
        if (exec != 0) {
          if (!instruction.handler(context_, instruction, exec)) {
            save();
            return faultAt(instruction, warp, exec);
          }
          executed += static_cast<std::uint64_t>(std::popcount(exec));
        }
        ++pc;
        continue;
      case Flow::kBranch:
        executed += static_cast<std::uint64_t>(std::popcount(exec));
        if (exec == mask) {
          const bool backward = instruction.target <= pc;
          pc = instruction.target;
          if (backward && --budget <= 0) {
            save();
            return Step::kYield;
          }
          continue;
        }
        if (exec == 0) {
          ++pc;
          continue;
        }
        split(mask & ~exec, pc + 1);
        mask = exec;
        pc = instruction.target;
        save();
        return Step::kReschedule;
      case Flow::kExit:
      case Flow::kReturn:
        if (exec == 0) {
          ++pc;
          continue;
        }
        executed += static_cast<std::uint64_t>(std::popcount(exec));
        if (instruction.flow == Flow::kExit || frame->caller == nullptr) {
          const std::uint32_t rest = mask & ~exec;
          save();
          warp.groups.erase(warp.groups.begin() + static_cast<std::ptrdiff_t>(index));
          exitLanes(warp, frame, exec);
          if (rest != 0) warp.groups.push_back(Group{pc + 1, rest, frame});
          return Step::kReschedule;
        } else {
          // Back to the caller with the results of the returning lanes.
          split(mask & ~exec, pc + 1);
          Frame* caller = frame->caller;
          const CallSite& site = caller->function->callSites[frame->callSite];
          forLanes(exec, [&](std::uint32_t lane) {
            for (std::size_t r = 0; r < site.results.size() && r < function.resultOffsets.size();
                 ++r) {
              const CallSite::Slot& slot = site.results[r];
              std::memcpy(caller->params + std::size_t{lane} * caller->function->parameterStride() +
                              slot.callerOffset,
                          frame->params + std::size_t{lane} * function.parameterStride() +
                              function.resultOffsets[r],
                          std::min(slot.bytes, function.resultSizes[r]));
            }
          });
          mask = exec;
          pc = frame->returnPc;
          save();
          Group& group = warp.groups[index];
          group.frame = caller;
          frame->liveMask &= ~exec;
          if (frame->liveMask == 0) releaseFrame(frame);
          return Step::kReschedule;
        }
      case Flow::kCall: {
        if (exec == 0) {
          ++pc;
          continue;
        }
        executed += static_cast<std::uint64_t>(std::popcount(exec));
        const CallSite& site = function.callSites[instruction.extra];
        std::uint32_t calleeIndex = instruction.target;
        std::uint32_t calling = exec;
        const Program& program = executable_->program();
        if (instruction.op[0] != kNoRegister) {
          // Through a pointer: the lanes calling the first lane's target go now, the others
          // call theirs after.
          const std::uint64_t* targets = context_.row(instruction.op[0]);
          const std::uint32_t first = static_cast<std::uint32_t>(std::countr_zero(exec));
          const std::uint64_t address = targets[first];
          const std::uint64_t slot = (address - kFunctionWindow) / kFunctionStride;
          if (address < kFunctionWindow || (address - kFunctionWindow) % kFunctionStride != 0 ||
              slot >= program.functions.size() ||
              (!program.functions[slot].defined && !program.functions[slot].builtin)) {
            save();
            return stop(CUDA_ERROR_ILLEGAL_INSTRUCTION,
                        "call through a pointer that is no function (" + hex(address) + ")", warp,
                        first, address);
          }
          calleeIndex = static_cast<std::uint32_t>(slot);
          calling = 0;
          forLanes(exec, [&](std::uint32_t lane) {
            if (targets[lane] == address) calling |= 1u << lane;
          });
          const Function& target = program.functions[calleeIndex];
          if (site.arguments.size() != target.parameterSizes.size() ||
              site.results.size() > target.resultSizes.size()) {
            save();
            return stop(CUDA_ERROR_ILLEGAL_INSTRUCTION,
                        "call through a pointer to '" + target.name +
                            "', whose parameters differ from the call's",
                        warp, first, address);
          }
        }
        const Function& callee = program.functions[calleeIndex];
        split(mask & ~exec, pc + 1);
        split(exec & ~calling, pc);
        mask = calling;
        if (callee.builtin || !callee.defined) {
          Step step = Step::kReschedule;
          context_.groupMask = mask;
          if (!callBuiltin(warp, callee, site, calling, instruction, step)) {
            save();
            return step;
          }
          ++pc;
          save();
          return Step::kReschedule;
        }
        const std::uint64_t base =
            alignUp(std::uint64_t{frame->localBase} + function.localBytes, 16) + kCallFrameBytes;
        if (frame->depth + 1 >= kMaxCallDepth || base + callee.localBytes > context_.localStride) {
          save();
          return stop(CUDA_ERROR_LAUNCH_FAILED,
                      "stack overflow calling '" + callee.name + "' (depth " +
                          std::to_string(frame->depth + 1) + ", " +
                          std::to_string(context_.localStride) + " bytes of stack per thread)",
                      warp, static_cast<std::uint32_t>(std::countr_zero(calling)));
        }
        Frame* next = acquireFrame(calleeIndex, static_cast<std::uint32_t>(base));
        next->caller = frame;
        next->returnPc = pc + 1;
        next->callSite = instruction.extra;
        next->liveMask = calling;
        next->depth = frame->depth + 1;
        forLanes(calling, [&](std::uint32_t lane) {
          for (std::size_t a = 0; a < site.arguments.size(); ++a) {
            const CallSite::Slot& slot = site.arguments[a];
            std::memcpy(
                next->params + std::size_t{lane} * callee.parameterStride() +
                    callee.parameterOffsets[a],
                frame->params + std::size_t{lane} * function.parameterStride() + slot.callerOffset,
                std::min(slot.bytes, callee.parameterSizes[a]));
          }
        });
        pc = 0;
        save();
        warp.groups[index].frame = next;
        return Step::kReschedule;
      }
      case Flow::kBarrier: {
        if (exec == 0) {
          ++pc;
          continue;
        }
        executed += static_cast<std::uint64_t>(std::popcount(exec));
        split(mask & ~exec, pc + 1);
        mask = exec;
        const std::uint32_t first = static_cast<std::uint32_t>(std::countr_zero(exec));
        const std::uint32_t id =
            static_cast<std::uint32_t>(context_.row(instruction.op[0])[first]) & 15;
        const std::uint32_t count =
            instruction.op[1] != kNoRegister
                ? static_cast<std::uint32_t>(context_.row(instruction.op[1])[first])
                : 0;
        Barrier& barrier = barriers_[id];
        barrier.arrived += static_cast<std::uint32_t>(std::popcount(exec));
        if (count != 0) barrier.expected = count;
        const unsigned kind = instruction.flags & 7;
        if (kind >= 2) {
          std::uint32_t p = context_.preds[instruction.op[3]];
          if ((instruction.flags & 16) != 0) p = ~p;
          const std::uint32_t votes = p & exec;
          barrier.popc += static_cast<std::uint32_t>(std::popcount(votes));
          barrier.all = barrier.all && votes == exec;
          barrier.any = barrier.any || votes != 0;
        }
        if (kind == 1) {
          // bar.arrive: counted, no wait.
          ++pc;
          save();
          checkBarrier(id);
          return Step::kReschedule;
        }
        save();
        Group& group = warp.groups[index];
        group.wait = Wait::kBarrier;
        group.barrier = id;
        checkBarrier(id);
        return Step::kReschedule;
      }
      case Flow::kWarpSync: {
        if (exec == 0) {
          ++pc;
          continue;
        }
        const std::uint32_t first = static_cast<std::uint32_t>(std::countr_zero(exec));
        const auto members =
            static_cast<std::uint32_t>(context_.row(instruction.op[instruction.target])[first]);
        // Lanes of this group that the guard turned off do not take part.
        const std::uint32_t required = members & warp.live & ~(mask & ~exec);
        if ((required & ~exec) != 0 && !forced) {
          save();
          warp.groups[index].wait = Wait::kWarpSync;
          return Step::kReschedule;
        }
        context_.groupMask = mask;
        if (!instruction.handler(context_, instruction, exec)) {  // wmma.load/store may fault
          save();
          return faultAt(instruction, warp, exec);
        }
        executed += static_cast<std::uint64_t>(std::popcount(exec));
        ++pc;
        continue;
      }
      case Flow::kSleep: {
        if (exec == 0) {
          ++pc;
          continue;
        }
        executed += static_cast<std::uint64_t>(std::popcount(exec));
        const std::uint32_t first = static_cast<std::uint32_t>(std::countr_zero(exec));
        const std::uint64_t nanoseconds = std::min<std::uint64_t>(
            static_cast<std::uint32_t>(context_.row(instruction.op[0])[first]),
            kMaxSleepNanoseconds);
        ++pc;
        save();
        Group& group = warp.groups[index];
        group.wait = Wait::kSleep;
        group.wakeAt = Clock::now() + std::chrono::nanoseconds(nanoseconds);
        ++sleepers_;
        return Step::kYield;
      }
      case Flow::kTrap:
        if (exec == 0) {
          ++pc;
          continue;
        }
        save();
        // A GPU reports a kernel's `trap` as an illegal instruction (cudaErrorIllegalInstruction;
        // seen on the CUDA path of ROCm/hip issue #233, where abort() became `trap`).
        return stop(CUDA_ERROR_ILLEGAL_INSTRUCTION, "trap", warp,
                    static_cast<std::uint32_t>(std::countr_zero(exec)));
      case Flow::kBreakpoint:
        ++pc;
        continue;
    }
  }
}

// ---- The pool --------------------------------------------------------------------------------

Interpreter::Interpreter(unsigned workers) {
  threads_.reserve(workers);
  for (unsigned i = 0; i < workers; ++i) {
    threads_.emplace_back([this, i] { workerMain(i + 1); });
  }
}

Interpreter::~Interpreter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

std::unique_ptr<BlockRunner> Interpreter::acquireRunner() {
  std::lock_guard lock(mutex_);
  if (idleRunners_.empty()) return std::make_unique<BlockRunner>();
  std::unique_ptr<BlockRunner> runner = std::move(idleRunners_.back());
  idleRunners_.pop_back();
  return runner;
}

void Interpreter::releaseRunner(std::unique_ptr<BlockRunner> runner) {
  std::lock_guard lock(mutex_);
  idleRunners_.push_back(std::move(runner));
}

void Interpreter::work(Launch& launch, BlockRunner& runner, unsigned workerIndex, bool caller) {
  if (!runner.prepare(launch, workerIndex)) return;
  BlockBoundary* boundary = caller ? launch.request->boundary : nullptr;
  while (!launch.shouldStop()) {
    if (boundary != nullptr && boundary->workWaiting()) boundary->runWaitingWork();
    if (!caller && mostUrgentActive_.load(std::memory_order_relaxed) < launch.request->priority &&
        moreUrgentLaunchWaiting(launch)) {
      break;
    }
    const std::uint64_t block = launch.nextBlock.fetch_add(1, std::memory_order_relaxed);
    if (block >= launch.totalBlocks) break;
    if (!runner.runBlock(block, boundary)) break;
  }
  launch.threadInstructions.fetch_add(runner.takeInstructionCount(), std::memory_order_relaxed);
}

bool Interpreter::moreUrgentLaunchWaiting(const Launch& launch) {
  std::lock_guard lock(mutex_);
  const Launch* urgent = mostUrgentWithBlocksLocked();
  return urgent != nullptr && urgent->request->priority < launch.request->priority;
}

Interpreter::Launch* Interpreter::mostUrgentWithBlocksLocked() const {
  Launch* chosen = nullptr;
  for (Launch* candidate : active_) {
    if (candidate->nextBlock.load(std::memory_order_relaxed) >= candidate->totalBlocks ||
        candidate->shouldStop()) {
      continue;
    }
    if (chosen == nullptr || candidate->request->priority < chosen->request->priority) {
      chosen = candidate;
    }
  }
  return chosen;
}

void Interpreter::noteActiveChangedLocked() {
  int mostUrgent = std::numeric_limits<int>::max();
  for (const Launch* launch : active_) mostUrgent = std::min(mostUrgent, launch->request->priority);
  mostUrgentActive_.store(mostUrgent, std::memory_order_relaxed);
}

// Every block of the grid is started, then each takes a turn (every warp that can run, up to its
// budget of backward branches) until all are done: a block spinning on a grid barrier lets the
// others reach it. Blocks taking turns on one thread need no more than the device holds at once
// (the backend refuses a larger grid); the cost is that the launch uses one core.
void Interpreter::runCooperatively(Launch& launch) {
  launch.gridWorkspaceRange = MemoryRange{
      reinterpret_cast<std::uint64_t>(launch.gridWorkspace),
      reinterpret_cast<std::uint64_t>(launch.gridWorkspace) + sizeof launch.gridWorkspace,
      reinterpret_cast<std::byte*>(launch.gridWorkspace), true};
  // Every block's registers, shared and local memory exist at once: refuse a grid that would take
  // more than the sim gives one launch, rather than take the daemon's memory (local memory is
  // backed only where touched, but a kernel may touch all of it).
  constexpr std::uint64_t kMaxResidentBytes = std::uint64_t{1} << 30;
  const std::uint64_t perBlock =
      std::uint64_t{launch.warpsPerBlock} * launch.kernel->rows() * kWarpSize * 8 +
      std::uint64_t{launch.localStride} * launch.threadsPerBlock + launch.sharedBytes;
  if (launch.totalBlocks * perBlock > kMaxResidentBytes) {
    launch.fail(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                "kernel '" + launch.kernel->name + "': a cooperative grid of " +
                    std::to_string(launch.totalBlocks) +
                    " blocks needs more memory at once than the sim gives a launch",
                0);
    return;
  }
  std::vector<std::unique_ptr<BlockRunner>> blocks;
  blocks.reserve(launch.totalBlocks);
  for (std::uint64_t index = 0; index < launch.totalBlocks; ++index) {
    auto runner = std::make_unique<BlockRunner>();
    if (!runner->prepare(launch, static_cast<unsigned>(index % launch.workerCount))) break;
    runner->startBlock(index);
    blocks.push_back(std::move(runner));
  }
  using State = BlockRunner::BlockState;
  std::vector<State> states(blocks.size(), State::kRunning);
  bool failed = blocks.size() != launch.totalBlocks;
  BlockBoundary* beside = launch.request->boundary;
  for (std::size_t left = blocks.size(); left > 0 && !failed;) {
    // Between two rounds of turns no block is in the middle of an instruction (runBlock's rule).
    if (beside != nullptr && beside->besideWorkWaiting()) beside->runBesideWork();
    bool ran = false;
    for (std::size_t index = 0; index < blocks.size() && !failed; ++index) {
      if (states[index] == State::kDone) continue;
      states[index] = blocks[index]->stepBlock(/*alone=*/false);
      if (states[index] == State::kFailed) failed = true;
      if (states[index] == State::kDone) --left;
      ran = ran || states[index] == State::kRunning;
    }
    // Every block left sleeps (nanosleep): give the core back a moment.
    if (!ran && !failed && left > 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (auto& runner : blocks) {
    runner->finishBlock();
    launch.threadInstructions.fetch_add(runner->takeInstructionCount(), std::memory_order_relaxed);
  }
}

void Interpreter::workerMain(unsigned index) {
  auto runner = std::make_unique<BlockRunner>();
  std::unique_lock lock(mutex_);
  for (;;) {
    Launch* launch = nullptr;
    wake_.wait(lock, [&] {
      if (stopping_) return true;
      launch = mostUrgentWithBlocksLocked();
      return launch != nullptr;
    });
    if (stopping_) return;
    ++launch->helpers;
    lock.unlock();
    work(*launch, *runner, index, /*caller=*/false);
    lock.lock();
    --launch->helpers;
    wake_.notify_all();
  }
}

LaunchOutcome Interpreter::run(const LaunchRequest& request) {
  Launch launch;
  launch.request = &request;
  launch.executable = request.executable;
  launch.program = &request.executable->program();
  launch.kernel = &launch.program->functions.at(request.kernel);
  if (!launch.kernel->unsupported.empty()) {
    // A kernel the front end could not lower has no code to run (its module loaded for others).
    LaunchOutcome outcome;
    outcome.status = CUDA_ERROR_NOT_SUPPORTED;
    outcome.message = launch.kernel->unsupported;
    return outcome;
  }
  launch.totalBlocks = std::uint64_t{request.grid[0]} * request.grid[1] * request.grid[2];
  launch.threadsPerBlock = request.block[0] * request.block[1] * request.block[2];
  launch.warpsPerBlock = (launch.threadsPerBlock + kWarpSize - 1) / kWarpSize;
  launch.sharedBytes = request.dynamicSharedBytes > 0
                           ? launch.program->dynamicSharedOffset + request.dynamicSharedBytes
                           : launch.program->staticSharedBytes;
  if (launch.program->usesReservedShared) {
    launch.reservedSharedOffset = (launch.sharedBytes + 15) / 16 * 16;
    launch.sharedBytes = launch.reservedSharedOffset + kReservedSharedBytes;
  }
  launch.localStride = request.executable->localBytesPerThread(request.kernel);
  if (request.executable->recurses(request.kernel)) {
    const std::uint32_t asked = std::min(request.stackBytes, kMaxStackBytesPerThread);
    launch.localStride = std::max(launch.localStride, (asked + 15) / 16 * 16);
  }
  launch.workerCount = workers() + 1;
  if (request.parameters.size() != launch.kernel->kernelParameterBytes ||
      launch.threadsPerBlock == 0 || launch.totalBlocks == 0 || !launch.kernel->isKernel) {
    LaunchOutcome outcome;
    outcome.status = CUDA_ERROR_INVALID_VALUE;
    outcome.message = "malformed launch";
    return outcome;
  }
  if (request.cooperative) {
    runCooperatively(launch);
  } else {
    const bool share = !threads_.empty() && launch.totalBlocks > 1;
    if (share) {
      std::lock_guard lock(mutex_);
      active_.push_back(&launch);
      noteActiveChangedLocked();
    }
    if (share) wake_.notify_all();
    std::unique_ptr<BlockRunner> runner = acquireRunner();
    work(launch, *runner, 0, /*caller=*/true);
    releaseRunner(std::move(runner));
    if (share) {
      std::unique_lock lock(mutex_);
      active_.erase(std::find(active_.begin(), active_.end(), &launch));
      noteActiveChangedLocked();
      wake_.wait(lock, [&] { return launch.helpers == 0; });
    }
  }
  LaunchOutcome outcome;
  {
    std::lock_guard lock(launch.mutex);
    outcome = launch.outcome;
  }
  if (outcome.status == CUDA_SUCCESS && launch.stopRequested()) {
    // A reset or shutdown stopped it, perhaps before every block ran.
    outcome.status = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    outcome.message = "the launch was abandoned";
  }
  outcome.threadInstructions = launch.threadInstructions.load();
  return outcome;
}

}  // namespace gpuproxy::server::ptx
