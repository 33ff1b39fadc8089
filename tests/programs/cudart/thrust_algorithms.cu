// Thrust (and through it CUB) as applications use it: fill, transform, reduce, scan, sort and
// copy back, each checked against the same computation on the host, and CUB's device-wide radix
// sort called directly (its one-sweep kernels, bounded to 384 threads), and a sort by a comparator
// of the program's own, which Thrust does with CUB's merge sort (its kernels launched with
// programmatic dependent launch). Ends "thrust_algorithms: PASSED". CUB's kernels use warp shuffles with inline assembly, dynamic tuning by the kernels'
// PTX version, occupancy queries and temporary allocations: everything a real library leans on.
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/functional.h>
#include <thrust/host_vector.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

struct Square {
  __host__ __device__ long long operator()(int value) const {
    return static_cast<long long>(value) * value;
  }
};

// Orders by last decimal digit, then by value: not a plain "<", so Thrust cannot radix-sort.
struct ByLastDigit {
  __host__ __device__ bool operator()(int a, int b) const {
    return a % 10 != b % 10 ? a % 10 < b % 10 : a < b;
  }
};

int main() {
  const int n = 100000;
  thrust::device_vector<int> values(n);
  thrust::sequence(values.begin(), values.end());
  const long long sum = thrust::reduce(values.begin(), values.end(), 0LL);
  const long long expectedSum = static_cast<long long>(n) * (n - 1) / 2;

  thrust::device_vector<long long> squares(n);
  thrust::transform(values.begin(), values.end(), squares.begin(), Square());
  thrust::inclusive_scan(squares.begin(), squares.end(), squares.begin());
  const long long lastPrefix = squares.back();
  long long expectedPrefix = 0;
  for (long long i = 0; i < n; ++i) expectedPrefix += i * i;

  // Pseudo-random keys, sorted on the device and on the host.
  std::vector<float> host(n);
  unsigned state = 12345;
  for (float& key : host) {
    state = state * 1664525u + 1013904223u;
    key = static_cast<float>(state >> 8) / 65536.0f;
  }
  thrust::device_vector<float> keys(host.begin(), host.end());
  thrust::sort(keys.begin(), keys.end());
  std::sort(host.begin(), host.end());
  thrust::host_vector<float> sorted = keys;
  const bool sortedRight = std::equal(host.begin(), host.end(), sorted.begin());

  // The same keys' integer parts by a comparator: a merge sort.
  std::vector<int> byDigit(n);
  for (int i = 0; i < n; ++i) byDigit[i] = static_cast<int>(host[(i * 7919) % n] * 1000.0f);
  thrust::device_vector<int> digitKeys(byDigit.begin(), byDigit.end());
  thrust::sort(digitKeys.begin(), digitKeys.end(), ByLastDigit());
  std::sort(byDigit.begin(), byDigit.end(), ByLastDigit());
  thrust::host_vector<int> digitSorted = digitKeys;
  const bool mergedRight = std::equal(byDigit.begin(), byDigit.end(), digitSorted.begin());

  // Key-value pairs through cub::DeviceRadixSort, temporary storage sized by a first call.
  std::vector<unsigned> pairKeys(n);
  std::vector<unsigned> pairValues(n);
  for (int i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    pairKeys[i] = state % 1000003u;
    pairValues[i] = static_cast<unsigned>(i);
  }
  thrust::device_vector<unsigned> keysIn(pairKeys.begin(), pairKeys.end());
  thrust::device_vector<unsigned> valuesIn(pairValues.begin(), pairValues.end());
  thrust::device_vector<unsigned> keysOut(n);
  thrust::device_vector<unsigned> valuesOut(n);
  std::size_t temporaryBytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, temporaryBytes, keysIn.data().get(),
                                  keysOut.data().get(), valuesIn.data().get(),
                                  valuesOut.data().get(), n);
  thrust::device_vector<unsigned char> temporary(temporaryBytes);
  const cudaError_t sortStatus = cub::DeviceRadixSort::SortPairs(
      temporary.data().get(), temporaryBytes, keysIn.data().get(), keysOut.data().get(),
      valuesIn.data().get(), valuesOut.data().get(), n);
  thrust::host_vector<unsigned> gotKeys = keysOut;
  thrust::host_vector<unsigned> gotValues = valuesOut;
  std::vector<unsigned> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](unsigned a, unsigned b) { return pairKeys[a] < pairKeys[b]; });
  bool pairsRight = sortStatus == cudaSuccess;
  for (int i = 0; i < n && pairsRight; ++i) {
    pairsRight = gotKeys[i] == pairKeys[order[i]] && gotValues[i] == order[i];
  }

  std::printf(
      "sum %lld (expected %lld), prefix %lld (expected %lld), sort %s, comparator sort %s, radix "
      "pairs %s (%s)\n",
      sum, expectedSum, lastPrefix, expectedPrefix, sortedRight ? "matches" : "DIFFERS",
      mergedRight ? "matches" : "DIFFERS", pairsRight ? "match" : "DIFFER",
      cudaGetErrorName(sortStatus));
  if (sum != expectedSum || lastPrefix != expectedPrefix || !sortedRight || !mergedRight ||
      !pairsRight) {
    std::printf("FAILED\n");
    return 1;
  }
  std::printf("thrust_algorithms: PASSED\n");
  return 0;
}
