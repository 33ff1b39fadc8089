// Programmatic dependent launch, as CUDA 12's libraries (CUB's merge sort among them) and
// hand-tuned pipelines use it: a consumer kernel launched with cudaLaunchKernelEx and
// cudaLaunchAttributeProgrammaticStreamSerialization may begin before its producer ends, and
// waits for the producer's results with cudaGridDependencySynchronize(); the producer says when
// its dependants may start (cudaTriggerProgrammaticLaunchCompletion). A programmatic event and a
// launch completion event recorded by launches are waited on from another stream. Every value
// is checked on the host. Ends "dependent_launch: PASSED". Needs compute capability 9.0.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "checks.cuh"

__global__ void produce(int* values, int n, int round) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) values[i] = i * 3 + round;
  cudaTriggerProgrammaticLaunchCompletion();
}

__global__ void consume(const int* values, int* sums, int n) {
  // Nothing of the producer's output may be read before this returns.
  cudaGridDependencySynchronize();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) sums[i] = values[i] + values[n - 1 - i];
}

__global__ void copyAfter(const int* from, int* to, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) to[i] = from[i];
}

int main() {
  constexpr int n = 1 << 16;
  constexpr int threads = 256;
  constexpr int blocks = (n + threads - 1) / threads;
  constexpr int rounds = 4;
  int* values = nullptr;
  int* sums = nullptr;
  int* copied = nullptr;
  CHECK(cudaMalloc(&values, n * sizeof(int)));
  CHECK(cudaMalloc(&sums, n * sizeof(int)));
  CHECK(cudaMalloc(&copied, n * sizeof(int)));
  cudaStream_t stream = nullptr;
  cudaStream_t other = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  cudaEvent_t programmatic = nullptr;
  cudaEvent_t launched = nullptr;
  CHECK(cudaEventCreateWithFlags(&programmatic, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&launched, cudaEventDisableTiming));

  std::vector<int> got(n);
  for (int round = 0; round < rounds; ++round) {
    // The producer records a programmatic event that the other stream waits for.
    cudaLaunchAttribute producerAttributes[1] = {};
    producerAttributes[0].id = cudaLaunchAttributeProgrammaticEvent;
    producerAttributes[0].val.programmaticEvent.event = programmatic;
    producerAttributes[0].val.programmaticEvent.flags = 0;
    producerAttributes[0].val.programmaticEvent.triggerAtBlockStart = 0;
    cudaLaunchConfig_t producer = {};
    producer.gridDim = dim3(blocks);
    producer.blockDim = dim3(threads);
    producer.stream = stream;
    producer.attrs = producerAttributes;
    producer.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&producer, produce, values, n, round));

    cudaLaunchAttribute consumerAttributes[2] = {};
    consumerAttributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    consumerAttributes[0].val.programmaticStreamSerializationAllowed = 1;
    consumerAttributes[1].id = cudaLaunchAttributeLaunchCompletionEvent;
    consumerAttributes[1].val.launchCompletionEvent.event = launched;
    consumerAttributes[1].val.launchCompletionEvent.flags = 0;
    cudaLaunchConfig_t consumer = producer;
    consumer.attrs = consumerAttributes;
    consumer.numAttrs = 2;
    CHECK(cudaLaunchKernelEx(&consumer, consume, static_cast<const int*>(values), sums, n));

    // Work of another stream ordered after the producer's event: it sees the producer's values.
    CHECK(cudaStreamWaitEvent(other, programmatic, 0));
    copyAfter<<<blocks, threads, 0, other>>>(values, copied, n);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(other));
    CHECK(cudaMemcpy(got.data(), copied, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
      EXPECT(got[i] == i * 3 + round, "round %d: value %d is %d after the programmatic event",
             round, i, got[i]);
    }

    CHECK(cudaEventSynchronize(launched));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(got.data(), sums, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
      const int expected = (i * 3 + round) + ((n - 1 - i) * 3 + round);
      EXPECT(got[i] == expected, "round %d: sum %d is %d, expected %d", round, i, got[i],
             expected);
    }
  }

  // The events refuse what CUDA refuses: an external record.
  cudaLaunchAttribute external[1] = {};
  external[0].id = cudaLaunchAttributeLaunchCompletionEvent;
  external[0].val.launchCompletionEvent.event = launched;
  external[0].val.launchCompletionEvent.flags = cudaEventRecordExternal;
  cudaLaunchConfig_t refused = {};
  refused.gridDim = dim3(blocks);
  refused.blockDim = dim3(threads);
  refused.stream = stream;
  refused.attrs = external;
  refused.numAttrs = 1;
  const cudaError_t externalStatus = cudaLaunchKernelEx(&refused, produce, values, n, 0);
  EXPECT(externalStatus == cudaErrorInvalidValue,
         "an external launch completion event gave %s", cudaGetErrorName(externalStatus));
  std::printf("external launch completion event: %s\n", cudaGetErrorName(externalStatus));

  CHECK(cudaEventDestroy(programmatic));
  CHECK(cudaEventDestroy(launched));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaStreamDestroy(other));
  CHECK(cudaFree(values));
  CHECK(cudaFree(sums));
  CHECK(cudaFree(copied));
  std::printf("%d rounds checked\ndependent_launch: PASSED\n", rounds);
  return 0;
}
