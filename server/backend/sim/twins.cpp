#include "server/backend/sim/twins.hpp"

#include <algorithm>

namespace gpuproxy::server::sim {
namespace {

// Threads with distinct x indices: blockIdx.x * blockDim.x + threadIdx.x over the whole launch.
// Threads that differ only in y or z repeat the same x index, so they add no coverage.
std::uint64_t threadsAlongX(const backend::LaunchConfig& config) {
  return std::uint64_t{config.grid.x} * config.block.x;
}

// c[i] = a[i] + b[i] for i < min(n, threads along x).
CUresult vectorAdd(KernelContext& context) {
  const auto a = context.parameterAs<CUdeviceptr>(0);
  const auto b = context.parameterAs<CUdeviceptr>(1);
  const auto c = context.parameterAs<CUdeviceptr>(2);
  const auto n = context.parameterAs<std::int32_t>(3);
  if (n <= 0) return CUDA_SUCCESS;
  const std::uint64_t count =
      std::min<std::uint64_t>(static_cast<std::uint64_t>(n), threadsAlongX(context.config()));
  const std::size_t bytes = count * sizeof(float);
  std::byte* in0 = context.translate(a, bytes);
  std::byte* in1 = context.translate(b, bytes);
  std::byte* out = context.translate(c, bytes);
  if (in0 == nullptr || in1 == nullptr || out == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
  // Element by element through memcpy: the ranges may overlap (c == a is a valid launch) and the
  // arena holds bytes, not float objects.
  for (std::uint64_t i = 0; i < count; ++i) {
    float x = 0;
    float y = 0;
    std::memcpy(&x, in0 + i * sizeof(float), sizeof(float));
    std::memcpy(&y, in1 + i * sizeof(float), sizeof(float));
    const float sum = x + y;
    std::memcpy(out + i * sizeof(float), &sum, sizeof(float));
  }
  return CUDA_SUCCESS;
}

// p[i] = value for i < min(n, threads along x).
CUresult fillU32(KernelContext& context) {
  const auto p = context.parameterAs<CUdeviceptr>(0);
  const auto value = context.parameterAs<std::uint32_t>(1);
  const auto n = context.parameterAs<std::uint64_t>(2);
  const std::uint64_t count = std::min(n, threadsAlongX(context.config()));
  if (count == 0) return CUDA_SUCCESS;
  std::byte* out = context.translate(p, count * sizeof(std::uint32_t));
  if (out == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::memcpy(out + i * sizeof(std::uint32_t), &value, sizeof(value));
  }
  return CUDA_SUCCESS;
}

// Occupies the engine for ns nanoseconds by sleeping: the CUDA kernel busy-waits on %globaltimer,
// but a CPU twin that burned a core would starve a small CI machine.
CUresult spin(KernelContext& context) {
  // Beyond ~146 years the deadline would overflow the clock; nobody waits that long anyway.
  constexpr std::uint64_t kMaxNanoseconds = 1ull << 62;
  const std::uint64_t ns = std::min(context.parameterAs<std::uint64_t>(0), kMaxNanoseconds);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(static_cast<std::int64_t>(ns));
  return context.sleepUntil(deadline) ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

// The CUDA kernel stores to address 8, which no allocation covers: an illegal address.
CUresult trap(KernelContext& context) {
  return context.translate(8, sizeof(int)) == nullptr ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

// out[i] = args.words[i] for every word of the by-value struct (one thread does it all, so the
// launch configuration does not matter as long as it has a thread 0).
CUresult copyWords(KernelContext& context) {
  const auto out = context.parameterAs<CUdeviceptr>(0);
  const std::span<const std::byte> words = context.parameter(1);
  std::byte* destination = context.translate(out, words.size());
  if (destination == nullptr) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::memcpy(destination, words.data(), words.size());
  return CUDA_SUCCESS;
}

}  // namespace

const std::vector<Twin>& allTwins() {
  static const std::vector<Twin> kTwins = {
      {"vector_add", {8, 8, 8, 4}, true, &vectorAdd},
      {"fill_u32", {8, 4, 8}, true, &fillU32},
      {"spin", {8}, false, &spin},
      {"trap", {}, true, &trap},
      {"copy_words_4k", {8, 1024 * 4}, true, &copyWords},
      {"copy_words_32k", {8, 8000 * 4}, true, &copyWords},
  };
  return kTwins;
}

const Twin* findTwin(std::string_view name) {
  const std::vector<Twin>& twins = allTwins();
  const auto found =
      std::find_if(twins.begin(), twins.end(), [&](const Twin& twin) { return twin.name == name; });
  return found == twins.end() ? nullptr : &*found;
}

}  // namespace gpuproxy::server::sim
