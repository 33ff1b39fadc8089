// CUDA graphs made by stream capture, as applications use them to launch a fixed sequence of work
// many times with one call. Built by plain nvcc: `graphs <mode>` prints what it saw and ends with
// "<mode>: PASSED" (exit 0) or a line naming the failing call (exit 1).
//
//   capture          a capture across two streams (fork and join through events): a copy from
//                    pinned memory, kernels, a host function, a copy back; nothing runs while it
//                    is captured; the graph then launched three times, reading new input each time
//   capture-errors   what CUDA refuses during capture: the legacy stream, synchronising with a
//                    capturing stream or the device (which invalidates the capture), a fork that
//                    is never joined
//   nodes            a graph built node by node (memset, kernels, a copy, a host function, an empty
//                    node, a dependency added afterwards), launched; a kernel's arguments changed
//                    in the executable graph; cudaGraphExecUpdate from a graph of the same shape
//                    and from one of another; a cycle refused at instantiation; the same graph
//                    through cudaGraphAddNode and cudaGraph(Exec)NodeSetParams
//   capture-graph    the graph a capture builds, as cudaStreamGetCaptureInfo hands it out while
//                    the capture lasts: the nodes the stream's next operation will depend on
//                    (none at first, the last captured one, a fork's point, both sides of a
//                    join); a kernel node added to it by hand, made the stream's dependency with
//                    cudaStreamUpdateCaptureDependencies, so that what is captured next runs
//                    after it; the same graph at the end; the refusals
//   structure        a graph's structure read back and changed: root nodes, each node's
//                    dependencies and dependents, the edges, an edge removed (the two nodes then
//                    run in either order), a host node's function replaced in the graph and in an
//                    executable graph; a child graph node holding a copy of another graph (which
//                    changing the original afterwards leaves alone), launched twice; the graph
//                    printed as DOT
//   params           a captured graph's nodes read back (a memset's, a copy's and a kernel's
//                    parameters) and changed: in the executable graph (a memset's value, a copy's
//                    destination, a kernel switched off and on again) and in the graph, then
//                    taken over by cudaGraphExecUpdate
//   user-objects     user objects: the graph takes the program's reference, an executable graph
//                    one of its own; destroying the graph leaves the object alive, destroying the
//                    executable graph right after a launch ends it only once the launch has run
//                    (its destructor sees the launch's host node done); counts retained and
//                    released by hand; the refusals
//   memory           memory nodes: cudaMallocAsync and cudaFreeAsync captured (the same address at
//                    every launch); an allocation a graph leaves live, used after the launch and
//                    freed by the program, by cudaFreeAsync or by another graph's free node; a
//                    launch while it is live refused, unless AUTO_FREE_ON_LAUNCH; one executable
//                    graph at a time, no clone; cudaDeviceGetGraphMemAttribute; the memory given
//                    back when the graphs are destroyed
//   event-nodes      event record and wait nodes: a graph that waits for an event recorded
//                    outside it (held until a host function lets the producing stream go),
//                    copies, and records an event; the executable graph's wait given another
//                    event; the same nodes made by capture (cudaEventRecordExternal,
//                    cudaEventWaitExternal); the events read back and the refusals
//   destroy-node     nodes removed from a graph (cudaGraphDestroyNode): their edges go with them,
//                    the rest keeps its handles and runs without them; a child graph node's graph
//                    goes with it; an executable graph made before refuses the update; a clone
//                    made before keeps the node, found by cudaGraphNodeFindInClone;
//                    cudaGraphExecGetFlags; the refusals
//   kernel-attributes a kernel node's launch attributes: hints (priority, cache access policy) kept
//                    and read back, a cooperative node, attributes copied to another node and kept
//                    when the node's parameters change; the refusals
//   conditional      conditional nodes (CUDA 12.4): an if node with and without its else body, a
//                    while loop counted down by its own body's kernel (a body built node by node,
//                    one filled by cudaStreamBeginCaptureToGraph, and one added to a capture in
//                    progress), a switch; the value reset
//                    at each launch (cudaGraphCondAssignDefault) or kept; the refusals. Where the
//                    driver refuses conditional handles altogether it says so and exits 3

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "checks.cuh"

__global__ void scale(float* x, float factor, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= factor;
}

__global__ void accumulate(float* sum, const float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) sum[i] += x[i];
}

__global__ void iota(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += static_cast<float>(i);
}

// The value of a conditional node: nonzero when *flag is.
__global__ void decide(cudaGraphConditionalHandle handle, const int* flag) {
  cudaGraphSetConditional(handle, *flag);
}

__global__ void copyInt(int* to, const int* from) {
  *to = *from;
}

// A while loop's body: one more run counted, one fewer to go.
__global__ void countDown(cudaGraphConditionalHandle handle, int* remaining, int* runs) {
  ++*runs;
  --*remaining;
  cudaGraphSetConditional(handle, *remaining > 0 ? 1u : 0u);
}

__global__ void store(int* where, int value) {
  *where = value;
}

namespace {

void countCall(void* calls) {
  ++*static_cast<int*>(calls);
}

// The graph of `nodes` mode: x = 0, x += i, x *= factor, copied to `out`, then a host function
// and an empty node; `scaleNode` is the scale kernel's.
struct BuiltGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphNode_t scaleNode = nullptr;
};

cudaError_t buildGraph(float* x, float* out, int n, float* factor, int* calls, BuiltGraph& built) {
  cudaError_t status = cudaGraphCreate(&built.graph, 0);
  if (status != cudaSuccess) return status;
  cudaMemsetParams clear{};
  clear.dst = x;
  clear.value = 0;
  clear.elementSize = 4;
  clear.width = n;
  clear.height = 1;
  cudaGraphNode_t cleared;
  if ((status = cudaGraphAddMemsetNode(&cleared, built.graph, nullptr, 0, &clear)) != cudaSuccess) {
    return status;
  }
  void* iotaArgs[] = {&x, &n};
  cudaKernelNodeParams fill{};
  fill.func = reinterpret_cast<void*>(iota);
  fill.gridDim = dim3(n / 256);
  fill.blockDim = dim3(256);
  fill.kernelParams = iotaArgs;
  cudaGraphNode_t filled;
  if ((status = cudaGraphAddKernelNode(&filled, built.graph, &cleared, 1, &fill)) != cudaSuccess) {
    return status;
  }
  // Added with no dependency; the one on `filled` comes afterwards.
  void* scaleArgs[] = {&x, factor, &n};
  cudaKernelNodeParams scaling{};
  scaling.func = reinterpret_cast<void*>(scale);
  scaling.gridDim = dim3(n / 256);
  scaling.blockDim = dim3(256);
  scaling.kernelParams = scaleArgs;
  if ((status = cudaGraphAddKernelNode(&built.scaleNode, built.graph, nullptr, 0, &scaling)) !=
      cudaSuccess) {
    return status;
  }
  if ((status = cudaGraphAddDependencies(built.graph, &filled, &built.scaleNode, nullptr, 1)) !=
      cudaSuccess) {
    return status;
  }
  cudaGraphNode_t copied;
  if ((status = cudaGraphAddMemcpyNode1D(&copied, built.graph, &built.scaleNode, 1, out, x,
                                         n * sizeof(float), cudaMemcpyDeviceToHost)) !=
      cudaSuccess) {
    return status;
  }
  cudaHostNodeParams count{};
  count.fn = countCall;
  count.userData = calls;
  cudaGraphNode_t counted;
  if ((status = cudaGraphAddHostNode(&counted, built.graph, &copied, 1, &count)) != cudaSuccess) {
    return status;
  }
  cudaGraphNode_t end;
  return cudaGraphAddEmptyNode(&end, built.graph, &counted, 1);
}

// The same graph through cudaGraphAddNode, every node described by cudaGraphNodeParams (the
// generic form CUDA 12.2 added), the scale kernel's dependency given as it is added.
cudaError_t buildGraphGeneric(float* x, float* out, int n, float* factor, int* calls,
                              BuiltGraph& built) {
  cudaError_t status = cudaGraphCreate(&built.graph, 0);
  if (status != cudaSuccess) return status;
  cudaGraphNodeParams clear{};
  clear.type = cudaGraphNodeTypeMemset;
  clear.memset.dst = x;
  clear.memset.value = 0;
  clear.memset.elementSize = 4;
  clear.memset.width = n;
  clear.memset.height = 1;
  cudaGraphNode_t cleared;
  if ((status = cudaGraphAddNode(&cleared, built.graph, nullptr, nullptr, 0, &clear)) !=
      cudaSuccess) {
    return status;
  }
  void* iotaArgs[] = {&x, &n};
  cudaGraphNodeParams fill{};
  fill.type = cudaGraphNodeTypeKernel;
  fill.kernel.func = reinterpret_cast<void*>(iota);
  fill.kernel.gridDim = dim3(n / 256);
  fill.kernel.blockDim = dim3(256);
  fill.kernel.kernelParams = iotaArgs;
  cudaGraphNode_t filled;
  if ((status = cudaGraphAddNode(&filled, built.graph, &cleared, nullptr, 1, &fill)) !=
      cudaSuccess) {
    return status;
  }
  void* scaleArgs[] = {&x, factor, &n};
  cudaGraphNodeParams scaling{};
  scaling.type = cudaGraphNodeTypeKernel;
  scaling.kernel.func = reinterpret_cast<void*>(scale);
  scaling.kernel.gridDim = dim3(n / 256);
  scaling.kernel.blockDim = dim3(256);
  scaling.kernel.kernelParams = scaleArgs;
  if ((status = cudaGraphAddNode(&built.scaleNode, built.graph, &filled, nullptr, 1, &scaling)) !=
      cudaSuccess) {
    return status;
  }
  cudaGraphNodeParams copy{};
  copy.type = cudaGraphNodeTypeMemcpy;
  copy.memcpy.copyParams.srcPtr = make_cudaPitchedPtr(x, n * sizeof(float), n, 1);
  copy.memcpy.copyParams.dstPtr = make_cudaPitchedPtr(out, n * sizeof(float), n, 1);
  copy.memcpy.copyParams.extent = make_cudaExtent(n * sizeof(float), 1, 1);
  copy.memcpy.copyParams.kind = cudaMemcpyDeviceToHost;
  cudaGraphNode_t copied;
  if ((status = cudaGraphAddNode(&copied, built.graph, &built.scaleNode, nullptr, 1, &copy)) !=
      cudaSuccess) {
    return status;
  }
  cudaGraphNodeParams count{};
  count.type = cudaGraphNodeTypeHost;
  count.host.fn = countCall;
  count.host.userData = calls;
  cudaGraphNode_t counted;
  if ((status = cudaGraphAddNode(&counted, built.graph, &copied, nullptr, 1, &count)) !=
      cudaSuccess) {
    return status;
  }
  cudaGraphNodeParams empty{};
  empty.type = cudaGraphNodeTypeEmpty;
  cudaGraphNode_t end;
  return cudaGraphAddNode(&end, built.graph, &counted, nullptr, 1, &empty);
}

// out[i] == factor * i for every i.
bool scaledBy(const float* out, int n, float factor) {
  for (int i = 0; i < n; ++i) {
    if (out[i] != factor * static_cast<float>(i)) return false;
  }
  return true;
}

int captureMode() {
  const int n = 1 << 16;
  const size_t bytes = n * sizeof(float);
  float* input = nullptr;
  float* output = nullptr;
  CHECK(cudaMallocHost(&input, bytes));
  CHECK(cudaMallocHost(&output, bytes));
  float* x = nullptr;
  float* sum = nullptr;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&sum, bytes));
  CHECK(cudaMemset(sum, 0, bytes));
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < n; ++i) output[i] = -1.0f;

  cudaStream_t main_stream;
  cudaStream_t side_stream;
  CHECK(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
  cudaEvent_t fork;
  cudaEvent_t join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  int calls = 0;

  CHECK(cudaStreamBeginCapture(main_stream, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  CHECK(cudaStreamGetCaptureInfo(main_stream, &status, &id));
  EXPECT(status == cudaStreamCaptureStatusActive && id != 0, "capture status %d id %llu",
         static_cast<int>(status), id);
  CHECK(cudaMemcpyAsync(x, input, bytes, cudaMemcpyHostToDevice, main_stream));
  scale<<<n / 256, 256, 0, main_stream>>>(x, 2.0f, n);
  CHECK(cudaGetLastError());
  // Fork: the side stream joins the capture and does the accumulation.
  CHECK(cudaEventRecord(fork, main_stream));
  CHECK(cudaStreamWaitEvent(side_stream, fork, 0));
  CHECK(cudaStreamIsCapturing(side_stream, &status));
  EXPECT(status == cudaStreamCaptureStatusActive, "the side stream did not join the capture");
  accumulate<<<n / 256, 256, 0, side_stream>>>(sum, x, n);
  CHECK(cudaEventRecord(join, side_stream));
  CHECK(cudaStreamWaitEvent(main_stream, join, 0));  // join
  CHECK(cudaLaunchHostFunc(main_stream, countCall, &calls));
  CHECK(cudaMemcpyAsync(output, sum, bytes, cudaMemcpyDeviceToHost, main_stream));
  cudaGraph_t graph;
  CHECK(cudaStreamEndCapture(main_stream, &graph));
  CHECK(cudaStreamIsCapturing(main_stream, &status));
  EXPECT(status == cudaStreamCaptureStatusNone, "still capturing after the end");
  CHECK(cudaStreamIsCapturing(side_stream, &status));
  EXPECT(status == cudaStreamCaptureStatusNone, "the side stream still captures");

  size_t nodes = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  std::printf("graph of %zu nodes\n", nodes);
  EXPECT(nodes == 5, "expected 5 nodes (copy, 2 kernels, host function, copy)");
  // Capturing ran nothing.
  CHECK(cudaDeviceSynchronize());
  EXPECT(calls == 0 && output[0] == -1.0f, "work ran during capture (calls %d, output %f)", calls,
         output[0]);

  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));  // the executable graph keeps what it needs
  for (int launch = 1; launch <= 3; ++launch) {
    // The graph's copy reads the pinned input as it is when the launch runs.
    for (int i = 0; i < n; ++i) input[i] = static_cast<float>(launch * (i % 100));
    CHECK(cudaGraphLaunch(exec, main_stream));
    CHECK(cudaStreamSynchronize(main_stream));
    // sum = 2 * (1 + ... + launch) * (i % 100)
    const float factor = static_cast<float>(launch * (launch + 1));
    for (int i = 0; i < n; i += 97) {
      EXPECT(output[i] == factor * static_cast<float>(i % 100), "launch %d: output[%d] = %f",
             launch, i, output[i]);
    }
    EXPECT(calls == launch, "the host function ran %d times after %d launches", calls, launch);
  }
  std::printf("3 launches, host function called %d times\n", calls);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaEventDestroy(fork));
  CHECK(cudaEventDestroy(join));
  CHECK(cudaStreamDestroy(main_stream));
  CHECK(cudaStreamDestroy(side_stream));
  CHECK(cudaFree(x));
  CHECK(cudaFree(sum));
  CHECK(cudaFreeHost(input));
  CHECK(cudaFreeHost(output));
  return 0;
}

int captureErrors() {
  float* x = nullptr;
  CHECK(cudaMalloc(&x, 1024 * sizeof(float)));
  cudaStream_t stream;
  cudaStream_t other;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;

  cudaError_t status = cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal);
  std::printf("capture of the legacy stream: %s\n", cudaGetErrorName(status));
  EXPECT(status != cudaSuccess, "the legacy stream was captured");
  cudaGetLastError();

  // Synchronising with a capturing stream invalidates the capture.
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  scale<<<4, 256, 0, stream>>>(x, 2.0f, 1024);
  status = cudaStreamSynchronize(stream);
  std::printf("synchronize during capture: %s\n", cudaGetErrorName(status));
  EXPECT(status == cudaErrorStreamCaptureUnsupported, "expected cudaErrorStreamCaptureUnsupported");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CHECK(cudaStreamIsCapturing(stream, &capture));
  EXPECT(capture == cudaStreamCaptureStatusInvalidated, "capture status %d",
         static_cast<int>(capture));
  status = cudaStreamEndCapture(stream, &graph);
  std::printf("end of an invalidated capture: %s\n", cudaGetErrorName(status));
  EXPECT(status == cudaErrorStreamCaptureInvalidated && graph == nullptr,
         "expected cudaErrorStreamCaptureInvalidated and no graph");
  cudaGetLastError();

  // So does synchronising with the device while a global-mode capture is under way.
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  status = cudaDeviceSynchronize();
  std::printf("device synchronize during capture: %s\n", cudaGetErrorName(status));
  EXPECT(status == cudaErrorStreamCaptureUnsupported, "expected cudaErrorStreamCaptureUnsupported");
  status = cudaStreamEndCapture(stream, &graph);
  EXPECT(status == cudaErrorStreamCaptureInvalidated, "end gave %s", cudaGetErrorName(status));
  cudaGetLastError();

  // A stream that joined the capture and was never joined back.
  cudaEvent_t fork;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK(cudaEventRecord(fork, stream));
  CHECK(cudaStreamWaitEvent(other, fork, 0));
  scale<<<4, 256, 0, other>>>(x, 2.0f, 1024);
  status = cudaStreamEndCapture(stream, &graph);
  std::printf("end with an unjoined stream: %s\n", cudaGetErrorName(status));
  EXPECT(status == cudaErrorStreamCaptureUnjoined, "expected cudaErrorStreamCaptureUnjoined");
  cudaGetLastError();
  CHECK(cudaStreamIsCapturing(other, &capture));
  EXPECT(capture == cudaStreamCaptureStatusNone, "the forked stream still captures");

  // Everything works as before afterwards.
  scale<<<4, 256, 0, stream>>>(x, 2.0f, 1024);
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaEventDestroy(fork));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaStreamDestroy(other));
  CHECK(cudaFree(x));
  return 0;
}

int nodesMode() {
  const int n = 1 << 14;
  float* x = nullptr;
  float* out = nullptr;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  CHECK(cudaMallocHost(&out, n * sizeof(float)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int calls = 0;
  float two = 2.0f;
  BuiltGraph built;
  CHECK(buildGraph(x, out, n, &two, &calls, built));
  size_t nodes = 0;
  CHECK(cudaGraphGetNodes(built.graph, nullptr, &nodes));
  std::printf("graph of %zu nodes\n", nodes);
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, built.graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(scaledBy(out, n, 2.0f) && calls == 1, "first launch: out[5] = %f, %d calls", out[5],
         calls);

  // New arguments for one kernel of the executable graph.
  float three = 3.0f;
  void* scaleArgs[] = {&x, &three, const_cast<int*>(&n)};
  cudaKernelNodeParams scaling{};
  scaling.func = reinterpret_cast<void*>(scale);
  scaling.gridDim = dim3(n / 256);
  scaling.blockDim = dim3(256);
  scaling.kernelParams = scaleArgs;
  CHECK(cudaGraphExecKernelNodeSetParams(exec, built.scaleNode, &scaling));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(scaledBy(out, n, 3.0f) && calls == 2, "after new arguments: out[5] = %f", out[5]);

  // An update from a graph of the same shape takes its parameters.
  float five = 5.0f;
  BuiltGraph same;
  CHECK(buildGraph(x, out, n, &five, &calls, same));
  cudaGraphExecUpdateResultInfo info{};
  CHECK(cudaGraphExecUpdate(exec, same.graph, &info));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(scaledBy(out, n, 5.0f) && calls == 3, "after the update: out[5] = %f", out[5]);
  // One of another shape is refused, and the executable graph stays as it was.
  cudaGraph_t other;
  CHECK(cudaGraphCreate(&other, 0));
  cudaGraphNode_t lone;
  CHECK(cudaGraphAddEmptyNode(&lone, other, nullptr, 0));
  const cudaError_t refused = cudaGraphExecUpdate(exec, other, &info);
  std::printf("update from another shape: %s, result %d\n", cudaGetErrorName(refused),
              static_cast<int>(info.result));
  EXPECT(refused == cudaErrorGraphExecUpdateFailure &&
             info.result == cudaGraphExecUpdateErrorTopologyChanged,
         "expected cudaErrorGraphExecUpdateFailure (topology changed)");
  cudaGetLastError();
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(scaledBy(out, n, 5.0f) && calls == 4, "after a refused update: out[5] = %f", out[5]);
  std::printf("4 launches, scaled by 2, 3, 5 and 5\n");

  // The same graph through the generic entry points: it runs, its kernel takes new arguments in
  // the graph and in an executable graph (cudaGraphNodeSetParams, cudaGraphExecNodeSetParams),
  // and an executable graph of the first kind takes it as an update of the same shape.
  float seven = 7.0f;
  BuiltGraph generic;
  CHECK(buildGraphGeneric(x, out, n, &seven, &calls, generic));
  cudaGraphExec_t genericExec;
  CHECK(cudaGraphInstantiate(&genericExec, generic.graph, 0));
  CHECK(cudaGraphLaunch(genericExec, stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(scaledBy(out, n, 7.0f) && calls == 5, "generic graph: out[5] = %f, %d calls", out[5],
         calls);
  float eleven = 11.0f;
  void* elevenArgs[] = {&x, &eleven, const_cast<int*>(&n)};
  cudaGraphNodeParams newScale{};
  newScale.type = cudaGraphNodeTypeKernel;
  newScale.kernel.func = reinterpret_cast<void*>(scale);
  newScale.kernel.gridDim = dim3(n / 256);
  newScale.kernel.blockDim = dim3(256);
  newScale.kernel.kernelParams = elevenArgs;
  CHECK(cudaGraphExecNodeSetParams(genericExec, generic.scaleNode, &newScale));
  CHECK(cudaGraphLaunch(genericExec, stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(scaledBy(out, n, 11.0f) && calls == 6, "generic graph, new arguments: out[5] = %f",
         out[5]);
  // Parameters of another type than the node's are refused.
  cudaGraphNodeParams wrongType{};
  wrongType.type = cudaGraphNodeTypeEmpty;
  const cudaError_t mismatch = cudaGraphNodeSetParams(generic.scaleNode, &wrongType);
  std::printf("empty-node parameters for a kernel node: %s\n", cudaGetErrorName(mismatch));
  EXPECT(mismatch == cudaErrorInvalidValue, "expected cudaErrorInvalidValue");
  cudaGetLastError();
  float thirteen = 13.0f;
  void* thirteenArgs[] = {&x, &thirteen, const_cast<int*>(&n)};
  newScale.kernel.kernelParams = thirteenArgs;
  CHECK(cudaGraphNodeSetParams(generic.scaleNode, &newScale));
  CHECK(cudaGraphExecUpdate(exec, generic.graph, &info));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(scaledBy(out, n, 13.0f) && calls == 7, "update from the generic graph: out[5] = %f",
         out[5]);
  std::printf("generic nodes: scaled by 7, 11 and 13\n");
  CHECK(cudaGraphExecDestroy(genericExec));
  CHECK(cudaGraphDestroy(generic.graph));

  // A cycle cannot be instantiated.
  cudaGraphNode_t second;
  CHECK(cudaGraphAddEmptyNode(&second, other, &lone, 1));
  CHECK(cudaGraphAddDependencies(other, &second, &lone, nullptr, 1));
  cudaGraphExec_t cyclic = nullptr;
  const cudaError_t cycle = cudaGraphInstantiate(&cyclic, other, 0);
  std::printf("instantiating a cycle: %s\n", cudaGetErrorName(cycle));
  EXPECT(cycle != cudaSuccess, "a cycle was instantiated");
  cudaGetLastError();

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(built.graph));
  CHECK(cudaGraphDestroy(same.graph));
  CHECK(cudaGraphDestroy(other));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(x));
  CHECK(cudaFreeHost(out));
  return 0;
}

}  // namespace

namespace {

// Copies `n` floats of `device` and checks each is `expected(i)`.
template <typename Expected>
int expectOnDevice(const float* device, int n, const char* what, Expected expected) {
  float* host = nullptr;
  CHECK(cudaMallocHost(&host, n * sizeof(float)));
  CHECK(cudaMemcpy(host, device, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    EXPECT(host[i] == expected(i), "%s[%d] = %g, expected %g", what, i, host[i], expected(i));
  }
  CHECK(cudaFreeHost(host));
  return 0;
}

// A graph of one alloc node (`bytes` on device 0) followed by `iota` into it; not freed in it.
cudaError_t allocatingGraph(int n, cudaGraph_t& graph, float*& address) {
  cudaError_t status = cudaGraphCreate(&graph, 0);
  if (status != cudaSuccess) return status;
  cudaMemAllocNodeParams allocation{};
  allocation.poolProps.allocType = cudaMemAllocationTypePinned;
  allocation.poolProps.location.type = cudaMemLocationTypeDevice;
  allocation.poolProps.location.id = 0;
  allocation.bytesize = n * sizeof(float);
  cudaGraphNode_t allocated;
  status = cudaGraphAddMemAllocNode(&allocated, graph, nullptr, 0, &allocation);
  if (status != cudaSuccess) return status;
  address = static_cast<float*>(allocation.dptr);
  cudaMemsetParams clear{};
  clear.dst = address;
  clear.elementSize = 4;
  clear.width = n;
  clear.height = 1;
  cudaGraphNode_t cleared;
  status = cudaGraphAddMemsetNode(&cleared, graph, &allocated, 1, &clear);
  if (status != cudaSuccess) return status;
  int count = n;
  void* arguments[] = {&address, &count};
  cudaKernelNodeParams kernel{};
  kernel.func = reinterpret_cast<void*>(iota);
  kernel.gridDim = dim3((n + 255) / 256);
  kernel.blockDim = dim3(256);
  kernel.kernelParams = arguments;
  cudaGraphNode_t filled;
  return cudaGraphAddKernelNode(&filled, graph, &cleared, 1, &kernel);
}

int memoryMode() {
  const int n = 4096;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  size_t freeBefore = 0;
  size_t total = 0;
  CHECK(cudaMemGetInfo(&freeBefore, &total));

  // Captured: allocate, fill, scale, copy out, free; the same address at every launch.
  float* result = nullptr;
  CHECK(cudaMalloc(&result, n * sizeof(float)));
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  float* scratch = nullptr;
  CHECK(cudaMallocAsync(&scratch, n * sizeof(float), stream));
  CHECK(cudaMemsetAsync(scratch, 0, n * sizeof(float), stream));
  iota<<<(n + 255) / 256, 256, 0, stream>>>(scratch, n);
  scale<<<(n + 255) / 256, 256, 0, stream>>>(scratch, 3.0f, n);
  CHECK(cudaMemcpyAsync(result, scratch, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  CHECK(cudaFreeAsync(scratch, stream));
  cudaGraph_t captured;
  CHECK(cudaStreamEndCapture(stream, &captured));
  size_t nodes = 0;
  CHECK(cudaGraphGetNodes(captured, nullptr, &nodes));
  std::vector<cudaGraphNode_t> all(nodes);
  CHECK(cudaGraphGetNodes(captured, all.data(), &nodes));
  int allocNodes = 0;
  int freeNodes = 0;
  for (cudaGraphNode_t node : all) {
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeMemAlloc) {
      ++allocNodes;
      cudaMemAllocNodeParams params{};
      CHECK(cudaGraphMemAllocNodeGetParams(node, &params));
      EXPECT(params.dptr == scratch && params.bytesize == n * sizeof(float),
             "alloc node params: %p, %zu bytes", params.dptr, params.bytesize);
    }
    if (type == cudaGraphNodeTypeMemFree) {
      ++freeNodes;
      void* freed = nullptr;
      CHECK(cudaGraphMemFreeNodeGetParams(node, &freed));
      EXPECT(freed == scratch, "free node frees %p, not %p", freed, scratch);
    }
  }
  std::printf("captured graph of %zu nodes: %d alloc, %d free\n", nodes, allocNodes, freeNodes);
  EXPECT(allocNodes == 1 && freeNodes == 1, "memory nodes captured");
  cudaGraphExec_t capturedExec;
  CHECK(cudaGraphInstantiate(&capturedExec, captured, 0));
  for (int launch = 0; launch < 3; ++launch) {
    CHECK(cudaMemsetAsync(result, 0, n * sizeof(float), stream));
    CHECK(cudaGraphLaunch(capturedExec, stream));
    CHECK(cudaStreamSynchronize(stream));
    if (expectOnDevice(result, n, "captured result", [](int i) { return 3.0f * i; }) != 0) {
      return 1;
    }
  }
  cudaGraphExec_t second;
  const cudaError_t again = cudaGraphInstantiate(&second, captured, 0);
  std::printf("second executable graph: %s\n", cudaGetErrorName(again));
  EXPECT(again != cudaSuccess, "a second executable graph of a graph with memory nodes");
  cudaGetLastError();
  cudaGraph_t clone;
  const cudaError_t cloned = cudaGraphClone(&clone, captured);
  std::printf("clone: %s\n", cudaGetErrorName(cloned));
  EXPECT(cloned != cudaSuccess, "a clone of a graph with memory nodes");
  cudaGetLastError();
  std::printf("captured: 3 launches at one address\n");

  // Built: the allocation outlives the launch, and must be freed before the next one.
  cudaGraph_t building;
  float* kept = nullptr;
  CHECK(allocatingGraph(n, building, kept));
  cudaGraphExec_t buildingExec;
  CHECK(cudaGraphInstantiate(&buildingExec, building, 0));
  unsigned long long used = 0;
  CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
  std::printf("graph memory in use: %llu bytes\n", static_cast<unsigned long long>(used));
  EXPECT(used >= 2 * n * sizeof(float), "graph memory in use: %llu",
         static_cast<unsigned long long>(used));
  CHECK(cudaGraphLaunch(buildingExec, stream));
  scale<<<(n + 255) / 256, 256, 0, stream>>>(kept, 2.0f, n);  // after the launch, in order
  CHECK(cudaStreamSynchronize(stream));
  if (expectOnDevice(kept, n, "kept", [](int i) { return 2.0f * i; }) != 0) return 1;
  const cudaError_t whileLive = cudaGraphLaunch(buildingExec, stream);
  std::printf("launch while its allocation is live: %s\n", cudaGetErrorName(whileLive));
  EXPECT(whileLive == cudaErrorInvalidValue, "relaunch while live");
  cudaGetLastError();
  CHECK(cudaFreeAsync(kept, stream));
  const cudaError_t twice = cudaFree(kept);
  std::printf("freed twice: %s\n", cudaGetErrorName(twice));
  EXPECT(twice == cudaErrorInvalidValue, "a graph allocation freed twice");
  cudaGetLastError();
  CHECK(cudaGraphLaunch(buildingExec, stream));  // freed: it runs again
  // Freed by another graph's free node.
  cudaGraph_t freeing;
  CHECK(cudaGraphCreate(&freeing, 0));
  cudaGraphNode_t freeNode;
  CHECK(cudaGraphAddMemFreeNode(&freeNode, freeing, nullptr, 0, kept));
  const cudaError_t freedTwiceInGraph =
      cudaGraphAddMemFreeNode(&freeNode, freeing, nullptr, 0, kept);
  EXPECT(freedTwiceInGraph == cudaErrorInvalidValue, "two free nodes of one allocation: %s",
         cudaGetErrorName(freedTwiceInGraph));
  cudaGetLastError();
  const cudaError_t notAGraphAllocation =
      cudaGraphAddMemFreeNode(&freeNode, freeing, nullptr, 0, result);
  EXPECT(notAGraphAllocation == cudaErrorInvalidValue, "a free node of cudaMalloc memory: %s",
         cudaGetErrorName(notAGraphAllocation));
  cudaGetLastError();
  cudaGraphExec_t freeingExec;
  CHECK(cudaGraphInstantiate(&freeingExec, freeing, 0));
  CHECK(cudaGraphLaunch(freeingExec, stream));
  CHECK(cudaGraphLaunch(buildingExec, stream));
  CHECK(cudaStreamSynchronize(stream));
  if (expectOnDevice(kept, n, "kept again", [](int i) { return 1.0f * i; }) != 0) return 1;
  std::printf("kept: freed by the program, then by another graph\n");
  CHECK(cudaGraphExecDestroy(buildingExec));

  // Instantiated to free on launch: launched again without a free.
  cudaGraphExec_t autoFree;
  CHECK(
      cudaGraphInstantiateWithFlags(&autoFree, building, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  CHECK(cudaGraphLaunch(autoFree, stream));
  CHECK(cudaGraphLaunch(autoFree, stream));
  CHECK(cudaStreamSynchronize(stream));
  std::printf("auto free on launch: launched twice\n");
  CHECK(cudaFree(kept));

  // A free of ordinary memory cannot be captured.
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const cudaError_t ordinaryFree = cudaFreeAsync(result, stream);
  std::printf("capturing a free of cudaMalloc memory: %s\n", cudaGetErrorName(ordinaryFree));
  EXPECT(ordinaryFree == cudaErrorStreamCaptureUnsupported, "captured free of ordinary memory");
  cudaGraph_t invalidated = nullptr;
  EXPECT(cudaStreamEndCapture(stream, &invalidated) == cudaErrorStreamCaptureInvalidated,
         "the capture is invalidated");
  cudaGetLastError();

  // Everything gone: the memory is the tenant's again.
  CHECK(cudaGraphExecDestroy(autoFree));
  CHECK(cudaGraphExecDestroy(capturedExec));
  CHECK(cudaGraphExecDestroy(freeingExec));
  CHECK(cudaGraphDestroy(captured));
  CHECK(cudaGraphDestroy(building));
  CHECK(cudaGraphDestroy(freeing));
  CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
  EXPECT(used == 0, "graph memory in use after the graphs are gone: %llu",
         static_cast<unsigned long long>(used));
  unsigned long long high = 0;
  CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &high));
  EXPECT(high >= 2 * n * sizeof(float), "high-water mark %llu",
         static_cast<unsigned long long>(high));
  unsigned long long zero = 0;
  CHECK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &zero));
  CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &high));
  EXPECT(high == 0, "high-water mark after a reset: %llu", static_cast<unsigned long long>(high));
  CHECK(cudaDeviceGraphMemTrim(0));
  CHECK(cudaFree(result));
  size_t freeAfter = 0;
  CHECK(cudaMemGetInfo(&freeAfter, &total));
  EXPECT(freeAfter == freeBefore, "free memory %zu before, %zu after", freeBefore, freeAfter);
  std::printf("graph memory given back\n");
  CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace

// Adds to `graph` a kernel node running `kernel` with `args`, one thread, after `dependency`.
template <typename... Args>
cudaError_t addKernel(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t* dependency,
                      void (*kernel)(Args...), void** args) {
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeKernel;
  params.kernel.func = reinterpret_cast<void*>(kernel);
  params.kernel.gridDim = dim3(1);
  params.kernel.blockDim = dim3(1);
  params.kernel.kernelParams = args;
  return cudaGraphAddNode(node, graph, dependency, nullptr, dependency != nullptr ? 1 : 0, &params);
}

// Adds a conditional node of `type` with `size` bodies after `dependency`; its bodies in `bodies`.
cudaError_t addConditional(cudaGraphNode_t* node, cudaGraph_t graph,
                           const cudaGraphNode_t* dependency, cudaGraphConditionalHandle handle,
                           cudaGraphConditionalNodeType type, unsigned size, cudaGraph_t** bodies) {
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = type;
  params.conditional.size = size;
  const cudaError_t status =
      cudaGraphAddNode(node, graph, dependency, nullptr, dependency != nullptr ? 1 : 0, &params);
  *bodies = params.conditional.phGraph_out;
  return status;
}

int readInt(const int* device, int& value) {
  CHECK(cudaMemcpy(&value, device, sizeof value, cudaMemcpyDeviceToHost));
  return 0;
}

int conditionalMode() {
  int* values = nullptr;  // flag, marker, remaining, runs, choice
  CHECK(cudaMalloc(&values, 5 * sizeof(int)));
  int* flag = values;
  int* marker = values + 1;
  int* remaining = values + 2;
  int* runs = values + 3;
  int* choice = values + 4;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // if (*flag) *marker = 1; else *marker = 2; the value reset to 0 at each launch.
  cudaGraph_t ifGraph;
  CHECK(cudaGraphCreate(&ifGraph, 0));
  cudaGraphConditionalHandle ifHandle = 0;
  const cudaError_t made =
      cudaGraphConditionalHandleCreate(&ifHandle, ifGraph, 0, cudaGraphCondAssignDefault);
  if (made == cudaErrorNotSupported) {
    std::printf("conditional handles: %s\n", cudaGetErrorName(made));
    return 3;
  }
  CHECK(made);
  void* decideArgs[] = {&ifHandle, &flag};
  cudaGraphNode_t decided;
  CHECK(addKernel(&decided, ifGraph, nullptr, decide, decideArgs));
  cudaGraphNode_t ifNode;
  cudaGraph_t* ifBodies = nullptr;
  CHECK(addConditional(&ifNode, ifGraph, &decided, ifHandle, cudaGraphCondTypeIf, 2, &ifBodies));
  int one = 1;
  int two = 2;
  void* thenArgs[] = {&marker, &one};
  void* elseArgs[] = {&marker, &two};
  cudaGraphNode_t thenNode;
  cudaGraphNode_t elseNode;
  CHECK(addKernel(&thenNode, ifBodies[0], nullptr, store, thenArgs));
  CHECK(addKernel(&elseNode, ifBodies[1], nullptr, store, elseArgs));
  cudaGraphExec_t ifExec;
  CHECK(cudaGraphInstantiate(&ifExec, ifGraph, 0));
  for (int set : {1, 0, 1}) {
    CHECK(cudaMemset(marker, 0, sizeof(int)));
    CHECK(cudaMemcpy(flag, &set, sizeof set, cudaMemcpyHostToDevice));
    CHECK(cudaGraphLaunch(ifExec, stream));
    CHECK(cudaStreamSynchronize(stream));
    int got = 0;
    if (readInt(marker, got) != 0) return 1;
    EXPECT(got == (set != 0 ? 1 : 2), "if node with flag %d: marker %d", set, got);
  }
  std::printf("if/else: then, else, then\n");

  // while (value) { ++*runs; --*remaining; value = *remaining > 0; }, the value starting at 1
  // and kept between launches (no cudaGraphCondAssignDefault).
  cudaGraph_t loopGraph;
  CHECK(cudaGraphCreate(&loopGraph, 0));
  cudaGraphConditionalHandle loopHandle = 0;
  CHECK(cudaGraphConditionalHandleCreate(&loopHandle, loopGraph, 1, 0));
  cudaGraphNode_t loopNode;
  cudaGraph_t* loopBodies = nullptr;
  CHECK(addConditional(&loopNode, loopGraph, nullptr, loopHandle, cudaGraphCondTypeWhile, 1,
                       &loopBodies));
  void* countArgs[] = {&loopHandle, &remaining, &runs};
  cudaGraphNode_t counted;
  CHECK(addKernel(&counted, loopBodies[0], nullptr, countDown, countArgs));
  cudaGraphExec_t loopExec;
  CHECK(cudaGraphInstantiate(&loopExec, loopGraph, 0));
  const int five = 5;
  CHECK(cudaMemcpy(remaining, &five, sizeof five, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(runs, 0, sizeof(int)));
  CHECK(cudaGraphLaunch(loopExec, stream));
  CHECK(cudaStreamSynchronize(stream));
  int loops = 0;
  if (readInt(runs, loops) != 0) return 1;
  EXPECT(loops == 5, "a while loop over 5 ran its body %d times", loops);
  // The loop left its value at 0, and nothing resets it: launched again, the body never runs.
  CHECK(cudaGraphLaunch(loopExec, stream));
  CHECK(cudaStreamSynchronize(stream));
  if (readInt(runs, loops) != 0) return 1;
  EXPECT(loops == 5, "a while loop whose value stayed 0 ran its body (%d runs)", loops);
  std::printf("while: 5 runs, then none\n");

  // The same loop with its body filled by capturing into it (cudaStreamBeginCaptureToGraph).
  cudaGraph_t capturedLoop;
  CHECK(cudaGraphCreate(&capturedLoop, 0));
  cudaGraphConditionalHandle capturedHandle = 0;
  CHECK(cudaGraphConditionalHandleCreate(&capturedHandle, capturedLoop, 1,
                                         cudaGraphCondAssignDefault));
  cudaGraphNode_t capturedNode;
  cudaGraph_t* capturedBodies = nullptr;
  CHECK(addConditional(&capturedNode, capturedLoop, nullptr, capturedHandle, cudaGraphCondTypeWhile,
                       1, &capturedBodies));
  cudaStream_t capturing;
  CHECK(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCaptureToGraph(capturing, capturedBodies[0], nullptr, nullptr, 0,
                                      cudaStreamCaptureModeGlobal));
  countDown<<<1, 1, 0, capturing>>>(capturedHandle, remaining, runs);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamEndCapture(capturing, nullptr));
  CHECK(cudaStreamDestroy(capturing));
  cudaGraphExec_t capturedExec;
  CHECK(cudaGraphInstantiate(&capturedExec, capturedLoop, 0));
  for (int round = 0; round < 2; ++round) {
    const int three = 3;
    CHECK(cudaMemcpy(remaining, &three, sizeof three, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(runs, 0, sizeof(int)));
    CHECK(cudaGraphLaunch(capturedExec, stream));
    CHECK(cudaStreamSynchronize(stream));
    if (readInt(runs, loops) != 0) return 1;
    EXPECT(loops == 3, "a captured while body over 3 ran %d times (launch %d)", loops, round);
  }
  CHECK(cudaGraphExecDestroy(capturedExec));
  CHECK(cudaGraphDestroy(capturedLoop));
  std::printf("while with a captured body: 3 runs at each launch\n");

  // A while loop added to a capture in progress: *remaining set by a captured kernel, the loop
  // after it, and a captured kernel after the loop copying out how often it ran.
  CHECK(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal));
  store<<<1, 1, 0, capturing>>>(remaining, 4);
  CHECK(cudaGetLastError());
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t inProgress = nullptr;
  const cudaGraphNode_t* before = nullptr;
  size_t beforeCount = 0;
  CHECK(cudaStreamGetCaptureInfo(capturing, &status, nullptr, &inProgress, &before, nullptr,
                                 &beforeCount));
  EXPECT(status == cudaStreamCaptureStatusActive && inProgress != nullptr && beforeCount == 1,
         "capture info: status %d, graph %p, %zu dependencies", static_cast<int>(status),
         static_cast<void*>(inProgress), beforeCount);
  cudaGraphConditionalHandle inProgressHandle = 0;
  CHECK(cudaGraphConditionalHandleCreate(&inProgressHandle, inProgress, 1,
                                         cudaGraphCondAssignDefault));
  cudaGraphNodeParams loopParams{};
  loopParams.type = cudaGraphNodeTypeConditional;
  loopParams.conditional.handle = inProgressHandle;
  loopParams.conditional.type = cudaGraphCondTypeWhile;
  loopParams.conditional.size = 1;
  cudaGraphNode_t inProgressLoop;
  CHECK(cudaGraphAddNode(&inProgressLoop, inProgress, before, nullptr, beforeCount, &loopParams));
  CHECK(cudaStreamUpdateCaptureDependencies(capturing, &inProgressLoop, nullptr, 1,
                                            cudaStreamSetCaptureDependencies));
  int* copied = choice;  // free until the switch below
  copyInt<<<1, 1, 0, capturing>>>(copied, runs);
  CHECK(cudaGetLastError());
  cudaGraph_t inProgressEnded = nullptr;
  CHECK(cudaStreamEndCapture(capturing, &inProgressEnded));
  EXPECT(inProgressEnded == inProgress, "the capture ended with another graph than it built");
  void* bodyArgs[] = {&inProgressHandle, &remaining, &runs};
  cudaGraphNode_t bodyNode;
  CHECK(addKernel(&bodyNode, loopParams.conditional.phGraph_out[0], nullptr, countDown, bodyArgs));
  CHECK(cudaStreamDestroy(capturing));
  cudaGraphExec_t inProgressExec;
  CHECK(cudaGraphInstantiate(&inProgressExec, inProgress, 0));
  CHECK(cudaMemset(runs, 0, sizeof(int)));
  CHECK(cudaMemset(copied, 0xff, sizeof(int)));
  CHECK(cudaGraphLaunch(inProgressExec, stream));
  CHECK(cudaStreamSynchronize(stream));
  int copiedRuns = 0;
  if (readInt(runs, loops) != 0 || readInt(copied, copiedRuns) != 0) return 1;
  EXPECT(loops == 4 && copiedRuns == 4,
         "a while loop added to a capture ran %d times, and the kernel after it saw %d", loops,
         copiedRuns);
  CHECK(cudaGraphExecDestroy(inProgressExec));
  CHECK(cudaGraphDestroy(inProgress));
  std::printf("while added to a capture in progress: 4 runs, then the captured kernel\n");

  // switch (*choice) { case 0: 10; case 1: 11; case 2: 12; } and no case for 3.
  cudaGraph_t switchGraph;
  CHECK(cudaGraphCreate(&switchGraph, 0));
  cudaGraphConditionalHandle switchHandle = 0;
  CHECK(
      cudaGraphConditionalHandleCreate(&switchHandle, switchGraph, 0, cudaGraphCondAssignDefault));
  void* chooseArgs[] = {&switchHandle, &choice};
  cudaGraphNode_t chosen;
  CHECK(addKernel(&chosen, switchGraph, nullptr, decide, chooseArgs));
  cudaGraphNode_t switchNode;
  cudaGraph_t* cases = nullptr;
  CHECK(addConditional(&switchNode, switchGraph, &chosen, switchHandle, cudaGraphCondTypeSwitch, 3,
                       &cases));
  int caseValues[3] = {10, 11, 12};
  void* caseArgs[3][2] = {
      {&marker, &caseValues[0]}, {&marker, &caseValues[1]}, {&marker, &caseValues[2]}};
  for (int i = 0; i < 3; ++i) {
    cudaGraphNode_t caseNode;
    CHECK(addKernel(&caseNode, cases[i], nullptr, store, caseArgs[i]));
  }
  cudaGraphExec_t switchExec;
  CHECK(cudaGraphInstantiate(&switchExec, switchGraph, 0));
  for (int pick : {2, 0, 3}) {
    CHECK(cudaMemset(marker, 0, sizeof(int)));
    CHECK(cudaMemcpy(choice, &pick, sizeof pick, cudaMemcpyHostToDevice));
    CHECK(cudaGraphLaunch(switchExec, stream));
    CHECK(cudaStreamSynchronize(stream));
    int got = 0;
    if (readInt(marker, got) != 0) return 1;
    EXPECT(got == (pick < 3 ? 10 + pick : 0), "switch on %d: marker %d", pick, got);
  }
  std::printf("switch: case 2, case 0, no case\n");

  // Refused: a handle made for another graph, a body destroyed on its own, a while with two
  // bodies.
  cudaGraphNode_t refused;
  cudaGraph_t* unused = nullptr;
  const cudaError_t foreign =
      addConditional(&refused, loopGraph, nullptr, ifHandle, cudaGraphCondTypeIf, 1, &unused);
  EXPECT(foreign == cudaErrorInvalidValue, "another graph's handle gave %s",
         cudaGetErrorName(foreign));
  cudaGetLastError();
  const cudaError_t bodyDestroyed = cudaGraphDestroy(loopBodies[0]);
  EXPECT(bodyDestroyed == cudaErrorInvalidValue, "destroying a body gave %s",
         cudaGetErrorName(bodyDestroyed));
  cudaGetLastError();
  const cudaError_t twoBodies =
      addConditional(&refused, loopGraph, nullptr, loopHandle, cudaGraphCondTypeWhile, 2, &unused);
  EXPECT(twoBodies == cudaErrorInvalidValue, "a while with two bodies gave %s",
         cudaGetErrorName(twoBodies));
  cudaGetLastError();
  std::printf("refusals: %s, %s, %s\n", cudaGetErrorName(foreign), cudaGetErrorName(bodyDestroyed),
              cudaGetErrorName(twoBodies));

  // The executable graphs keep their own copies: they still run once the graphs are gone.
  CHECK(cudaGraphDestroy(ifGraph));
  CHECK(cudaGraphDestroy(loopGraph));
  CHECK(cudaGraphDestroy(switchGraph));
  const int set = 1;
  CHECK(cudaMemset(marker, 0, sizeof(int)));
  CHECK(cudaMemcpy(flag, &set, sizeof set, cudaMemcpyHostToDevice));
  CHECK(cudaGraphLaunch(ifExec, stream));
  CHECK(cudaStreamSynchronize(stream));
  int after = 0;
  if (readInt(marker, after) != 0) return 1;
  EXPECT(after == 1, "the if graph after its graph was destroyed: marker %d", after);
  CHECK(cudaGraphExecDestroy(ifExec));
  CHECK(cudaGraphExecDestroy(loopExec));
  CHECK(cudaGraphExecDestroy(switchExec));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(values));
  return 0;
}

void addTen(void* calls) {
  *static_cast<int*>(calls) += 10;
}

bool sameNodes(std::vector<cudaGraphNode_t> got, std::vector<cudaGraphNode_t> expected) {
  if (got.size() != expected.size()) return false;
  for (cudaGraphNode_t node : expected) {
    bool found = false;
    for (cudaGraphNode_t each : got) found = found || each == node;
    if (!found) return false;
  }
  return true;
}

// The dependencies (or, with `dependents`, the dependent nodes) of `node`.
int neighbours(cudaGraphNode_t node, bool dependents, std::vector<cudaGraphNode_t>& out) {
  size_t count = 0;
  CHECK(dependents ? cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &count)
                   : cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count));
  out.assign(count, nullptr);
  if (count > 0) {
    CHECK(dependents ? cudaGraphNodeGetDependentNodes(node, out.data(), nullptr, &count)
                     : cudaGraphNodeGetDependencies(node, out.data(), nullptr, &count));
  }
  return 0;
}

// x = 0, x += i, x *= factor over n floats: a memset node and two kernel nodes of `blocks` blocks,
// each after the one before. Holds the kernels' arguments (their parameters point into it), so it
// stays where it was made.
struct ScaledIota {
  float* x = nullptr;
  int n = 0;
  float factor = 1;
  void* iotaArgs[2] = {};
  void* scaleArgs[3] = {};
  cudaKernelNodeParams iotaParams{};
  cudaKernelNodeParams scaleParams{};
  cudaGraphNode_t zeroNode = nullptr;
  cudaGraphNode_t iotaNode = nullptr;
  cudaGraphNode_t scaleNode = nullptr;

  ScaledIota(float* x_, int n_, float factor_) : x(x_), n(n_), factor(factor_) {}
  ScaledIota(const ScaledIota&) = delete;
  ScaledIota& operator=(const ScaledIota&) = delete;

  cudaError_t addTo(cudaGraph_t graph, unsigned blocks) {
    cudaMemsetParams zeroParams{};
    zeroParams.dst = x;
    zeroParams.elementSize = 4;
    zeroParams.width = n;
    zeroParams.height = 1;
    cudaError_t status = cudaGraphAddMemsetNode(&zeroNode, graph, nullptr, 0, &zeroParams);
    if (status != cudaSuccess) return status;
    iotaArgs[0] = &x;
    iotaArgs[1] = &n;
    iotaParams.func = reinterpret_cast<void*>(iota);
    iotaParams.gridDim = dim3(blocks);
    iotaParams.blockDim = dim3(n / blocks);
    iotaParams.kernelParams = iotaArgs;
    status = cudaGraphAddKernelNode(&iotaNode, graph, &zeroNode, 1, &iotaParams);
    if (status != cudaSuccess) return status;
    scaleArgs[0] = &x;
    scaleArgs[1] = &factor;
    scaleArgs[2] = &n;
    scaleParams = iotaParams;
    scaleParams.func = reinterpret_cast<void*>(scale);
    scaleParams.kernelParams = scaleArgs;
    return cudaGraphAddKernelNode(&scaleNode, graph, &iotaNode, 1, &scaleParams);
  }
};

int structureMode() {
  const int n = 256;
  float* x = nullptr;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  int calls = 0;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // The child: x = 0, x += i, x *= 2.
  cudaGraph_t child;
  CHECK(cudaGraphCreate(&child, 0));
  ScaledIota childNodes(x, n, 2.0f);
  CHECK(childNodes.addTo(child, 1));
  int size = n;

  // The parent: two host functions (counting 1 and 10), then the child, then an empty node.
  cudaGraph_t parent;
  CHECK(cudaGraphCreate(&parent, 0));
  cudaHostNodeParams oneParams{countCall, &calls};
  cudaGraphNode_t hostA;
  cudaGraphNode_t hostB;
  CHECK(cudaGraphAddHostNode(&hostA, parent, nullptr, 0, &oneParams));
  CHECK(cudaGraphAddHostNode(&hostB, parent, &hostA, 1, &oneParams));
  cudaGraphNode_t childNode;
  const cudaGraphNode_t both[] = {hostA, hostB};
  CHECK(cudaGraphAddChildGraphNode(&childNode, parent, both, 2, child));
  cudaGraphNode_t last;
  CHECK(cudaGraphAddEmptyNode(&last, parent, &childNode, 1));

  // Read back: one root, the edges, each node's neighbours.
  size_t count = 0;
  CHECK(cudaGraphGetRootNodes(parent, nullptr, &count));
  std::vector<cudaGraphNode_t> roots(count);
  CHECK(cudaGraphGetRootNodes(parent, roots.data(), &count));
  EXPECT(roots.size() == 1 && roots[0] == hostA, "%zu root nodes", roots.size());
  size_t edges = 0;
  CHECK(cudaGraphGetEdges(parent, nullptr, nullptr, nullptr, &edges));
  std::vector<cudaGraphNode_t> from(edges);
  std::vector<cudaGraphNode_t> to(edges);
  CHECK(cudaGraphGetEdges(parent, from.data(), to.data(), nullptr, &edges));
  EXPECT(edges == 4, "%zu edges (expected 4)", edges);
  for (size_t i = 0; i < edges; ++i) {
    const bool known =
        (from[i] == hostA && to[i] == hostB) || (from[i] == hostA && to[i] == childNode) ||
        (from[i] == hostB && to[i] == childNode) || (from[i] == childNode && to[i] == last);
    EXPECT(known, "edge %zu is not one the graph was given", i);
  }
  std::vector<cudaGraphNode_t> found;
  if (neighbours(childNode, false, found) != 0) return 1;
  EXPECT(sameNodes(found, {hostA, hostB}), "the child node depends on %zu nodes", found.size());
  if (neighbours(hostA, true, found) != 0) return 1;
  EXPECT(sameNodes(found, {hostB, childNode}), "%zu nodes depend on the first host node",
         found.size());
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  CHECK(cudaGraphNodeGetType(childNode, &type));
  EXPECT(type == cudaGraphNodeTypeGraph, "the child node is of type %d", static_cast<int>(type));
  cudaGraph_t embedded = nullptr;
  CHECK(cudaGraphChildGraphNodeGetGraph(childNode, &embedded));
  size_t embeddedNodes = 0;
  CHECK(cudaGraphGetNodes(embedded, nullptr, &embeddedNodes));
  EXPECT(embedded != child && embeddedNodes == 3, "the child node holds %zu nodes", embeddedNodes);
  // The node's graph is the node's: destroying it on its own is refused, and it stays usable.
  const cudaError_t embeddedDestroyed = cudaGraphDestroy(embedded);
  EXPECT(embeddedDestroyed == cudaErrorInvalidValue, "destroying a child node's graph gave %s",
         cudaGetErrorName(embeddedDestroyed));
  cudaGetLastError();
  CHECK(cudaGraphGetNodes(embedded, nullptr, &embeddedNodes));
  std::printf("structure: 1 root, %zu edges, a child graph of %zu nodes\n", edges, embeddedNodes);

  // Changes: the edge between the host nodes removed (twice is an error), the second one now
  // adds 10, and the original child graph gains a node the copy does not have.
  CHECK(cudaGraphRemoveDependencies(parent, &hostA, &hostB, nullptr, 1));
  const cudaError_t removedTwice = cudaGraphRemoveDependencies(parent, &hostA, &hostB, nullptr, 1);
  EXPECT(removedTwice == cudaErrorInvalidValue, "removing a missing edge gave %s",
         cudaGetErrorName(removedTwice));
  cudaGetLastError();
  CHECK(cudaGraphGetRootNodes(parent, nullptr, &count));
  EXPECT(count == 2, "%zu roots after the edge was removed", count);
  cudaHostNodeParams tenParams{addTen, &calls};
  CHECK(cudaGraphHostNodeSetParams(hostB, &tenParams));
  cudaHostNodeParams readBack{};
  CHECK(cudaGraphHostNodeGetParams(hostB, &readBack));
  EXPECT(readBack.fn == addTen && readBack.userData == &calls, "the host node reads back wrong");
  float hundred = 100.0f;
  void* spoilArgs[] = {&x, &hundred, &size};
  cudaKernelNodeParams spoilParams = childNodes.scaleParams;
  spoilParams.kernelParams = spoilArgs;
  cudaGraphNode_t spoiler;
  CHECK(cudaGraphAddKernelNode(&spoiler, child, &childNodes.scaleNode, 1, &spoilParams));

  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, parent, 0));
  std::vector<float> out(n);
  for (int launch = 1; launch <= 2; ++launch) {
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(out.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
      EXPECT(out[i] == 2.0f * static_cast<float>(i), "launch %d: x[%d] = %f", launch, i, out[i]);
    }
    EXPECT(calls == 11 * launch, "after %d launches the host nodes counted %d", launch, calls);
  }
  // In the executable graph only: the second host node back to counting 1.
  CHECK(cudaGraphExecHostNodeSetParams(exec, hostB, &oneParams));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(calls == 24, "after the executable graph's host node changed: %d", calls);
  std::printf("child graph: x = 2i at each launch, the original's new node not in it\n");

  const char* dot = "graphs_structure.dot";
  CHECK(cudaGraphDebugDotPrint(parent, dot, 0));
  std::FILE* file = std::fopen(dot, "r");
  EXPECT(file != nullptr, "no DOT file was written");
  char text[4096] = {};
  const size_t read = std::fread(text, 1, sizeof text - 1, file);
  std::fclose(file);
  std::remove(dot);
  EXPECT(
      read > 0 && std::strstr(text, "digraph") != nullptr && std::strstr(text, "kernel") != nullptr,
      "the DOT file does not describe the graph: %s", text);
  std::printf("DOT: %zu bytes\n", read);

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(parent));
  CHECK(cudaGraphDestroy(child));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(x));
  return 0;
}

// The nodes of `graph` of `type`, in the order they were added.
std::vector<cudaGraphNode_t> nodesOfType(cudaGraph_t graph, cudaGraphNodeType type) {
  size_t count = 0;
  std::vector<cudaGraphNode_t> found;
  if (cudaGraphGetNodes(graph, nullptr, &count) != cudaSuccess) return found;
  std::vector<cudaGraphNode_t> nodes(count);
  if (cudaGraphGetNodes(graph, nodes.data(), &count) != cudaSuccess) return found;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType each = cudaGraphNodeTypeEmpty;
    if (cudaGraphNodeGetType(node, &each) == cudaSuccess && each == type) found.push_back(node);
  }
  return found;
}

// Launches `exec` once and reads x back into `out`.
int launchAndRead(cudaGraphExec_t exec, cudaStream_t stream, const float* x,
                  std::vector<float>& out) {
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemcpy(out.data(), x, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return 0;
}

int paramsMode() {
  const int n = 512;
  float* x = nullptr;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  float* pinned = nullptr;
  float* otherPinned = nullptr;
  CHECK(cudaMallocHost(&pinned, n * sizeof(float)));
  CHECK(cudaMallocHost(&otherPinned, n * sizeof(float)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // x = 0 (bytes), x += i, x copied out to pinned memory.
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream));
  iota<<<n / 128, 128, 0, stream>>>(x, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpyAsync(pinned, x, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  cudaGraph_t graph;
  CHECK(cudaStreamEndCapture(stream, &graph));
  const std::vector<cudaGraphNode_t> memsets = nodesOfType(graph, cudaGraphNodeTypeMemset);
  const std::vector<cudaGraphNode_t> kernels = nodesOfType(graph, cudaGraphNodeTypeKernel);
  const std::vector<cudaGraphNode_t> copies = nodesOfType(graph, cudaGraphNodeTypeMemcpy);
  EXPECT(memsets.size() == 1 && kernels.size() == 1 && copies.size() == 1,
         "%zu memsets, %zu kernels, %zu copies", memsets.size(), kernels.size(), copies.size());

  cudaMemsetParams memset{};
  CHECK(cudaGraphMemsetNodeGetParams(memsets[0], &memset));
  EXPECT(memset.dst == x && memset.value == 0 && memset.height == 1 &&
             memset.width * memset.elementSize == n * sizeof(float),
         "the memset reads back as %zu elements of %u bytes", memset.width, memset.elementSize);
  cudaMemcpy3DParms copy{};
  CHECK(cudaGraphMemcpyNodeGetParams(copies[0], &copy));
  EXPECT(copy.srcPtr.ptr == x && copy.dstPtr.ptr == pinned &&
             copy.extent.width == n * sizeof(float) && copy.extent.height == 1,
         "the copy reads back as %zu bytes from %p to %p", copy.extent.width, copy.srcPtr.ptr,
         copy.dstPtr.ptr);
  cudaKernelNodeParams kernel{};
  CHECK(cudaGraphKernelNodeGetParams(kernels[0], &kernel));
  EXPECT(kernel.gridDim.x == n / 128 && kernel.blockDim.x == 128 &&
             kernel.kernelParams != nullptr && *static_cast<float**>(kernel.kernelParams[0]) == x &&
             *static_cast<int*>(kernel.kernelParams[1]) == n,
         "the kernel reads back as <<<%u, %u>>>", kernel.gridDim.x, kernel.blockDim.x);
  std::printf("params: memset, copy and kernel read back\n");

  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<float> out(n);
  if (launchAndRead(exec, stream, x, out) != 0) return 1;
  EXPECT(out[7] == 7.0f && pinned[7] == 7.0f, "first launch: x[7] = %f", out[7]);

  // In the executable graph: x = 1.0f as words, the copy going to the other buffer, no kernel.
  cudaMemsetParams ones{};
  ones.dst = x;
  ones.value = 0x3f800000;
  ones.elementSize = 4;
  ones.width = n;
  ones.height = 1;
  CHECK(cudaGraphExecMemsetNodeSetParams(exec, memsets[0], &ones));
  cudaMemcpy3DParms redirected = copy;
  redirected.dstPtr.ptr = otherPinned;
  CHECK(cudaGraphExecMemcpyNodeSetParams(exec, copies[0], &redirected));
  CHECK(cudaGraphNodeSetEnabled(exec, kernels[0], 0));
  unsigned int enabled = 1;
  CHECK(cudaGraphNodeGetEnabled(exec, kernels[0], &enabled));
  EXPECT(enabled == 0, "the kernel still reads as enabled");
  pinned[7] = -1.0f;
  if (launchAndRead(exec, stream, x, out) != 0) return 1;
  EXPECT(out[7] == 1.0f && otherPinned[7] == 1.0f && pinned[7] == -1.0f,
         "with the kernel off: x[7] = %f, copied %f, old destination %f", out[7], otherPinned[7],
         pinned[7]);
  CHECK(cudaGraphNodeSetEnabled(exec, kernels[0], 1));
  if (launchAndRead(exec, stream, x, out) != 0) return 1;
  EXPECT(out[7] == 8.0f, "with the kernel on again: x[7] = %f", out[7]);
  // The graph itself is unchanged by all of that.
  CHECK(cudaGraphMemsetNodeGetParams(memsets[0], &memset));
  EXPECT(memset.value == 0, "the graph's memset changed with the executable graph's");
  std::printf("params: executable graph changed, memset 1.0, kernel off and on\n");

  // Refused: a copy that would change its kind of memory.
  cudaMemcpy3DParms toDevice = copy;
  toDevice.dstPtr.ptr = x;
  toDevice.kind = cudaMemcpyDeviceToDevice;
  const cudaError_t kindChanged = cudaGraphExecMemcpyNodeSetParams(exec, copies[0], &toDevice);
  EXPECT(kindChanged == cudaErrorInvalidValue, "changing a copy's memory kind gave %s",
         cudaGetErrorName(kindChanged));
  cudaGetLastError();

  // In the graph, then into the executable graph by an update: x = 2.0f as words.
  cudaMemsetParams twos = ones;
  twos.value = 0x40000000;
  CHECK(cudaGraphMemsetNodeSetParams(memsets[0], &twos));
  cudaGraphExecUpdateResultInfo info{};
  CHECK(cudaGraphExecUpdate(exec, graph, &info));
  if (launchAndRead(exec, stream, x, out) != 0) return 1;
  EXPECT(out[7] == 9.0f && pinned[7] == 9.0f, "after the update: x[7] = %f, copied %f", out[7],
         pinned[7]);
  std::printf("params: graph changed and taken over by an update\n");

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFreeHost(otherPinned));
  CHECK(cudaFree(x));
  return 0;
}

// A user object's state, as its destructor and a slow host node leave it.
struct Tracked {
  std::atomic<bool> hostNodeDone{false};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> hostNodeDoneFirst{false};  // when the destructor ran
};

void destroyTracked(void* data) {
  auto* tracked = static_cast<Tracked*>(data);
  tracked->hostNodeDoneFirst = tracked->hostNodeDone.load();
  tracked->destroyed = true;
}

void slowHostNode(void* data) {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  static_cast<Tracked*>(data)->hostNodeDone = true;
}

// Whether the destructor has run within two seconds (it runs on a thread of the driver's).
bool destroyedSoon(const Tracked& tracked) {
  for (int i = 0; i < 200 && !tracked.destroyed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return tracked.destroyed;
}

int userObjectsMode() {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Tracked tracked;
  cudaUserObject_t object;
  CHECK(cudaUserObjectCreate(&object, &tracked, destroyTracked, 1, cudaUserObjectNoDestructorSync));
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  cudaHostNodeParams slow{slowHostNode, &tracked};
  cudaGraphNode_t hostNode;
  CHECK(cudaGraphAddHostNode(&hostNode, graph, nullptr, 0, &slow));
  CHECK(cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT(!tracked.destroyed, "the object went with the graph, its executable graph still alive");
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaStreamSynchronize(stream));
  EXPECT(destroyedSoon(tracked), "the object outlived its last executable graph");
  EXPECT(tracked.hostNodeDoneFirst, "the object was destroyed before the launch using it ran");
  std::printf("user object: destroyed after the last launch ran\n");

  // References by hand: 2 made, 1 more, the graph takes 1 of its own and gives it back.
  Tracked counted;
  cudaUserObject_t second;
  CHECK(cudaUserObjectCreate(&second, &counted, destroyTracked, 2, cudaUserObjectNoDestructorSync));
  CHECK(cudaUserObjectRetain(second, 1));
  cudaGraph_t holder;
  CHECK(cudaGraphCreate(&holder, 0));
  CHECK(cudaGraphRetainUserObject(holder, second, 1, 0));
  const cudaError_t tooMany = cudaGraphReleaseUserObject(holder, second, 2);
  EXPECT(tooMany == cudaErrorInvalidValue, "releasing more than the graph holds gave %s",
         cudaGetErrorName(tooMany));
  cudaGetLastError();
  CHECK(cudaGraphReleaseUserObject(holder, second, 1));
  CHECK(cudaUserObjectRelease(second, 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT(!counted.destroyed, "destroyed with a reference left");
  CHECK(cudaUserObjectRelease(second, 1));
  EXPECT(destroyedSoon(counted), "not destroyed when its last reference went");
  CHECK(cudaGraphDestroy(holder));
  cudaUserObject_t refused;
  const cudaError_t noFlag = cudaUserObjectCreate(&refused, &counted, destroyTracked, 1, 0);
  EXPECT(noFlag == cudaErrorInvalidValue, "a user object without its flag gave %s",
         cudaGetErrorName(noFlag));
  cudaGetLastError();
  std::printf("user object: counts kept, refusals %s, %s\n", cudaGetErrorName(tooMany),
              cudaGetErrorName(noFlag));
  CHECK(cudaStreamDestroy(stream));
  return 0;
}

// The nodes `stream`'s next captured operation will depend on.
int captureDependencies(cudaStream_t stream, std::vector<cudaGraphNode_t>& nodes,
                        cudaGraph_t* graph = nullptr) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* dependencies = nullptr;
  size_t count = 0;
  CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, graph, &dependencies, nullptr, &count));
  EXPECT(status == cudaStreamCaptureStatusActive, "the stream does not capture (status %d)",
         static_cast<int>(status));
  nodes.assign(dependencies, dependencies + count);
  return 0;
}

bool holds(const std::vector<cudaGraphNode_t>& nodes, cudaGraphNode_t node) {
  for (cudaGraphNode_t each : nodes) {
    if (each == node) return true;
  }
  return false;
}

int captureGraphMode() {
  const int n = 1024;
  float* x = nullptr;
  float* sum = nullptr;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  CHECK(cudaMalloc(&sum, n * sizeof(float)));
  cudaStream_t main_stream;
  cudaStream_t side_stream;
  CHECK(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
  cudaEvent_t fork;
  cudaEvent_t join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  CHECK(cudaStreamBeginCapture(main_stream, cudaStreamCaptureModeGlobal));
  cudaGraph_t building = nullptr;
  std::vector<cudaGraphNode_t> next;
  if (captureDependencies(main_stream, next, &building) != 0) return 1;
  EXPECT(building != nullptr && next.empty(), "a new capture: graph %p, %zu dependencies",
         static_cast<void*>(building), next.size());
  CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), main_stream));
  iota<<<n / 256, 256, 0, main_stream>>>(x, n);  // x[i] = i
  CHECK(cudaGetLastError());
  if (captureDependencies(main_stream, next) != 0) return 1;
  EXPECT(next.size() == 1, "after a kernel: %zu dependencies", next.size());
  const cudaGraphNode_t iotaNode = next[0];
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  CHECK(cudaGraphNodeGetType(iotaNode, &type));
  EXPECT(type == cudaGraphNodeTypeKernel, "the last captured node is of type %d",
         static_cast<int>(type));
  size_t count = 0;
  CHECK(cudaGraphGetNodes(building, nullptr, &count));
  EXPECT(count == 2, "the graph in progress has %zu nodes", count);

  // x *= 3, a node added by hand after the captured kernel; what the stream captures next waits
  // for it instead.
  float three = 3.0f;
  int size = n;
  void* scaleArgs[] = {&x, &three, &size};
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeKernel;
  params.kernel.func = reinterpret_cast<void*>(scale);
  params.kernel.gridDim = dim3(n / 256);
  params.kernel.blockDim = dim3(256);
  params.kernel.kernelParams = scaleArgs;
  cudaGraphNode_t added;
  CHECK(cudaGraphAddNode(&added, building, next.data(), nullptr, next.size(), &params));
  CHECK(cudaStreamUpdateCaptureDependencies(main_stream, &added, nullptr, 1,
                                            cudaStreamSetCaptureDependencies));
  if (captureDependencies(main_stream, next) != 0) return 1;
  EXPECT(next.size() == 1 && next[0] == added, "after the update: %zu dependencies", next.size());

  // Fork: the side stream's first operation depends on the point the event marks.
  CHECK(cudaEventRecord(fork, main_stream));
  CHECK(cudaStreamWaitEvent(side_stream, fork, 0));
  if (captureDependencies(side_stream, next) != 0) return 1;
  EXPECT(next.size() == 1 && next[0] == added, "a forked stream depends on %zu nodes", next.size());
  CHECK(cudaMemsetAsync(sum, 0, n * sizeof(float), side_stream));
  accumulate<<<n / 256, 256, 0, side_stream>>>(sum, x, n);  // sum = 3i
  CHECK(cudaGetLastError());
  std::vector<cudaGraphNode_t> sideLast;
  if (captureDependencies(side_stream, sideLast) != 0) return 1;
  CHECK(cudaEventRecord(join, side_stream));
  CHECK(cudaStreamWaitEvent(main_stream, join, 0));
  if (captureDependencies(main_stream, next) != 0) return 1;
  EXPECT(sideLast.size() == 1 && holds(next, sideLast[0]) && holds(next, added),
         "after the join the origin depends on %zu nodes", next.size());
  accumulate<<<n / 256, 256, 0, main_stream>>>(sum, x, n);  // sum = 6i
  CHECK(cudaGetLastError());

  // Refused: a node of no graph of this capture, flags that are neither add nor set, a stream
  // that does not capture.
  cudaGraph_t other;
  CHECK(cudaGraphCreate(&other, 0));
  cudaGraphNode_t foreignNode;
  CHECK(cudaGraphAddEmptyNode(&foreignNode, other, nullptr, 0));
  const cudaError_t foreign = cudaStreamUpdateCaptureDependencies(
      main_stream, &foreignNode, nullptr, 1, cudaStreamAddCaptureDependencies);
  EXPECT(foreign == cudaErrorInvalidValue, "another graph's node gave %s",
         cudaGetErrorName(foreign));
  cudaGetLastError();
  const cudaError_t badFlags =
      cudaStreamUpdateCaptureDependencies(main_stream, &added, nullptr, 1, 7);
  EXPECT(badFlags == cudaErrorInvalidValue, "flags 7 gave %s", cudaGetErrorName(badFlags));
  cudaGetLastError();
  cudaStream_t idle;
  CHECK(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking));
  const cudaError_t notCapturing = cudaStreamUpdateCaptureDependencies(
      idle, &added, nullptr, 1, cudaStreamSetCaptureDependencies);
  EXPECT(notCapturing == cudaErrorIllegalState, "a stream that does not capture gave %s",
         cudaGetErrorName(notCapturing));
  cudaGetLastError();

  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(main_stream, &graph));
  EXPECT(graph == building, "the capture ended with another graph than it built");
  CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::printf("captured graph of %zu nodes, one added by hand\n", count);
  EXPECT(count == 6, "expected 6 nodes (2 memsets, 3 kernels, 1 added)");
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int launch = 0; launch < 2; ++launch) {
    CHECK(cudaGraphLaunch(exec, main_stream));
    CHECK(cudaStreamSynchronize(main_stream));
    std::vector<float> out(n);
    CHECK(cudaMemcpy(out.data(), sum, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
      EXPECT(out[i] == 6.0f * static_cast<float>(i), "launch %d: sum[%d] = %f", launch, i, out[i]);
    }
  }
  std::printf("2 launches: the added node ran between the captured kernels\n");
  std::printf("refusals: %s, %s, %s\n", cudaGetErrorName(foreign), cudaGetErrorName(badFlags),
              cudaGetErrorName(notCapturing));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaGraphDestroy(other));
  CHECK(cudaEventDestroy(fork));
  CHECK(cudaEventDestroy(join));
  CHECK(cudaStreamDestroy(idle));
  CHECK(cudaStreamDestroy(main_stream));
  CHECK(cudaStreamDestroy(side_stream));
  CHECK(cudaFree(x));
  CHECK(cudaFree(sum));
  return 0;
}

// Holds a stream until the main thread lets it go.
void CUDART_CB holdUntilReleased(void* released) {
  while (!static_cast<std::atomic<bool>*>(released)->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// On `producer`: held until released, then stores `value` at `where` and records `produced`.
int produceLater(cudaStream_t producer, std::atomic<bool>& released, int* where, int value,
                 cudaEvent_t produced) {
  released = false;
  CHECK(cudaLaunchHostFunc(producer, holdUntilReleased, &released));
  store<<<1, 1, 0, producer>>>(where, value);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(produced, producer));
  return 0;
}

// Launches `exec` on `stream` while the producer is held, checks the graph waits (its record of
// `done` stays pending), lets the producer go, and reads what the graph copied.
int launchHeld(cudaGraphExec_t exec, cudaStream_t stream, std::atomic<bool>& released,
               cudaEvent_t done, const int* copied, int& value) {
  CHECK(cudaGraphLaunch(exec, stream));
  const cudaError_t pending = cudaEventQuery(done);
  EXPECT(pending == cudaErrorNotReady, "the graph's event record node did not wait (%s)",
         cudaGetErrorName(pending));
  released = true;
  CHECK(cudaEventSynchronize(done));
  return readInt(copied, value);
}

// Launches `exec` once and checks x[i] == factor * i.
int expectScaledIota(cudaGraphExec_t exec, cudaStream_t stream, const float* x, int n, float factor,
                     const char* what) {
  std::vector<float> out(n);
  if (launchAndRead(exec, stream, x, out) != 0) return 1;
  for (int i = 0; i < n; ++i) {
    EXPECT(out[i] == factor * static_cast<float>(i), "%s: x[%d] = %f, expected %f", what, i, out[i],
           factor * static_cast<float>(i));
  }
  return 0;
}

int destroyNodeMode() {
  const int n = 256;
  float* x = nullptr;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  int calls = 0;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // x = 0, x += i, x *= 2, then a host function counting the launches.
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  ScaledIota built(x, n, 2.0f);
  CHECK(built.addTo(graph, 1));
  const cudaGraphNode_t zero = built.zeroNode;
  const cudaGraphNode_t counted = built.iotaNode;
  const cudaGraphNode_t doubled = built.scaleNode;
  cudaHostNodeParams countParams{countCall, &calls};
  cudaGraphNode_t host;
  CHECK(cudaGraphAddHostNode(&host, graph, &doubled, 1, &countParams));

  // Made before the node goes: an executable graph, a clone.
  cudaGraphExec_t before;
  cudaGraphInstantiateParams instantiation{};
  instantiation.flags = cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload;
  instantiation.uploadStream = stream;
  CHECK(cudaGraphInstantiateWithParams(&before, graph, &instantiation));
  unsigned long long flags = 0;
  CHECK(cudaGraphExecGetFlags(before, &flags));
  EXPECT(flags == cudaGraphInstantiateFlagAutoFreeOnLaunch,
         "cudaGraphExecGetFlags gave %llx (the upload flag is not one it returns)", flags);
  cudaGraph_t clone;
  CHECK(cudaGraphClone(&clone, graph));

  CHECK(cudaGraphDestroyNode(counted));
  size_t count = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  EXPECT(count == 3, "%zu nodes after one of 4 was destroyed", count);
  std::vector<cudaGraphNode_t> nodes(count);
  CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  EXPECT(sameNodes(nodes, {zero, doubled, host}), "the graph's nodes are not the 3 left");
  CHECK(cudaGraphGetRootNodes(graph, nullptr, &count));
  EXPECT(count == 2, "%zu roots: the memset and the scale kernel lost their edges", count);
  size_t edges = 0;
  CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  cudaGraphNode_t from = nullptr;
  cudaGraphNode_t to = nullptr;
  CHECK(cudaGraphGetEdges(graph, &from, &to, nullptr, &edges));
  EXPECT(edges == 1 && from == doubled && to == host, "%zu edges left (expected scale -> host)",
         edges);
  cudaGraphNodeType type;
  const cudaError_t typeOfGone = cudaGraphNodeGetType(counted, &type);
  EXPECT(typeOfGone == cudaErrorInvalidValue, "the destroyed node's type: %s",
         cudaGetErrorName(typeOfGone));
  cudaGetLastError();
  const cudaError_t destroyedTwice = cudaGraphDestroyNode(counted);
  EXPECT(destroyedTwice == cudaErrorInvalidValue, "destroying it again gave %s",
         cudaGetErrorName(destroyedTwice));
  cudaGetLastError();
  std::printf("destroy-node: 3 nodes, 2 roots and 1 edge left\n");

  // The graph runs without it: x = 0, scaled, and the host node still counts.
  cudaGraphExec_t after;
  CHECK(cudaGraphInstantiate(&after, graph, 0));
  CHECK(cudaGraphExecGetFlags(after, &flags));
  EXPECT(flags == 0, "cudaGraphExecGetFlags gave %llx for no flags", flags);
  if (expectScaledIota(after, stream, x, n, 0.0f, "without the iota node") != 0) return 1;
  EXPECT(calls == 1, "the host node ran %d times", calls);
  // The executable graph made before still has it, and cannot take the changed graph.
  if (expectScaledIota(before, stream, x, n, 2.0f, "the executable graph made before") != 0) {
    return 1;
  }
  cudaGraphExecUpdateResultInfo info{};
  const cudaError_t updated = cudaGraphExecUpdate(before, graph, &info);
  EXPECT(updated == cudaErrorGraphExecUpdateFailure &&
             info.result == cudaGraphExecUpdateErrorTopologyChanged,
         "updating it from the changed graph gave %s (result %d)", cudaGetErrorName(updated),
         static_cast<int>(info.result));
  cudaGetLastError();
  std::printf("destroy-node: the graph runs without it, an executable graph made before with it\n");

  // The clone made before has all four, each found from the original's handle.
  cudaGraphNode_t clonedCounted = nullptr;
  CHECK(cudaGraphNodeFindInClone(&clonedCounted, counted, clone));
  CHECK(cudaGraphNodeGetType(clonedCounted, &type));
  EXPECT(type == cudaGraphNodeTypeKernel && clonedCounted != counted,
         "the clone's copy of the destroyed node has type %d", static_cast<int>(type));
  cudaGraphNode_t clonedHost = nullptr;
  CHECK(cudaGraphNodeFindInClone(&clonedHost, host, clone));
  CHECK(cudaGraphNodeGetType(clonedHost, &type));
  EXPECT(type == cudaGraphNodeTypeHost, "the clone's host node has type %d",
         static_cast<int>(type));
  cudaGraphExec_t clonedExec;
  CHECK(cudaGraphInstantiate(&clonedExec, clone, 0));
  if (expectScaledIota(clonedExec, stream, x, n, 2.0f, "the clone") != 0) return 1;
  // Not found: a node of neither graph's clone, a node removed from the clone, a graph that is
  // no clone.
  cudaGraphNode_t added;
  CHECK(cudaGraphAddEmptyNode(&added, graph, &host, 1));
  cudaGraphNode_t none = nullptr;
  const cudaError_t newer = cudaGraphNodeFindInClone(&none, added, clone);
  CHECK(cudaGraphDestroyNode(clonedHost));
  const cudaError_t removedInClone = cudaGraphNodeFindInClone(&none, host, clone);
  const cudaError_t notAClone = cudaGraphNodeFindInClone(&none, host, graph);
  EXPECT(newer == cudaErrorInvalidValue && removedInClone == cudaErrorInvalidValue &&
             notAClone == cudaErrorInvalidValue && none == nullptr,
         "cudaGraphNodeFindInClone gave %s, %s, %s", cudaGetErrorName(newer),
         cudaGetErrorName(removedInClone), cudaGetErrorName(notAClone));
  cudaGetLastError();
  std::printf("destroy-node: a clone made before keeps it, found in the clone\n");

  // A child graph node takes its graph with it.
  cudaGraph_t child;
  CHECK(cudaGraphCreate(&child, 0));
  cudaGraphNode_t childEmpty;
  CHECK(cudaGraphAddEmptyNode(&childEmpty, child, nullptr, 0));
  cudaGraphNode_t childNode;
  CHECK(cudaGraphAddChildGraphNode(&childNode, graph, nullptr, 0, child));
  cudaGraph_t embedded = nullptr;
  CHECK(cudaGraphChildGraphNodeGetGraph(childNode, &embedded));
  CHECK(cudaGraphGetNodes(embedded, nullptr, &count));
  CHECK(cudaGraphDestroyNode(childNode));
  const cudaError_t embeddedGone = cudaGraphGetNodes(embedded, nullptr, &count);
  EXPECT(embeddedGone == cudaErrorInvalidValue, "the destroyed child node's graph: %s",
         cudaGetErrorName(embeddedGone));
  cudaGetLastError();
  CHECK(cudaGraphGetNodes(child, nullptr, &count));  // the program's own graph is not touched
  EXPECT(count == 1, "the graph given to the child node has %zu nodes", count);

  // A graph with memory nodes keeps its nodes.
  cudaGraph_t allocating;
  float* allocated = nullptr;
  CHECK(allocatingGraph(n, allocating, allocated));
  cudaGraphNode_t tail;
  CHECK(cudaGraphAddEmptyNode(&tail, allocating, nullptr, 0));
  const cudaError_t memoryGraph = cudaGraphDestroyNode(tail);
  EXPECT(memoryGraph == cudaErrorInvalidValue,
         "destroying a node of a graph with memory nodes gave %s", cudaGetErrorName(memoryGraph));
  cudaGetLastError();
  const cudaError_t nullNode = cudaGraphDestroyNode(nullptr);
  const cudaError_t nullFlags = cudaGraphExecGetFlags(after, nullptr);
  EXPECT(nullNode == cudaErrorInvalidValue && nullFlags == cudaErrorInvalidValue,
         "null arguments gave %s, %s", cudaGetErrorName(nullNode), cudaGetErrorName(nullFlags));
  cudaGetLastError();
  std::printf("destroy-node: a child node's graph goes with it; the refusals\n");

  CHECK(cudaGraphDestroy(allocating));
  CHECK(cudaGraphExecDestroy(clonedExec));
  CHECK(cudaGraphExecDestroy(after));
  CHECK(cudaGraphExecDestroy(before));
  CHECK(cudaGraphDestroy(clone));
  CHECK(cudaGraphDestroy(child));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(x));
  return 0;
}

int kernelAttributesMode() {
  const int n = 256;
  float* x = nullptr;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  ScaledIota nodes(x, n, 3.0f);
  CHECK(nodes.addTo(graph, 2));
  const cudaGraphNode_t zero = nodes.zeroNode;
  const cudaGraphNode_t counted = nodes.iotaNode;
  const cudaGraphNode_t scaled = nodes.scaleNode;

  // Never set: zeros.
  cudaLaunchAttributeValue value{};
  value.priority = 7;
  CHECK(cudaGraphKernelNodeGetAttribute(counted, cudaLaunchAttributePriority, &value));
  EXPECT(value.priority == 0, "an unset priority reads %d", value.priority);
  CHECK(cudaGraphKernelNodeGetAttribute(counted, cudaLaunchAttributeCooperative, &value));
  EXPECT(value.cooperative == 0, "an unset cooperative attribute reads %d", value.cooperative);

  // Set and read back.
  cudaLaunchAttributeValue priority{};
  priority.priority = -1;
  CHECK(cudaGraphKernelNodeSetAttribute(counted, cudaLaunchAttributePriority, &priority));
  cudaLaunchAttributeValue window{};
  window.accessPolicyWindow.base_ptr = x;
  window.accessPolicyWindow.num_bytes = n * sizeof(float);
  window.accessPolicyWindow.hitRatio = 0.5f;
  window.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  window.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  CHECK(cudaGraphKernelNodeSetAttribute(counted, cudaLaunchAttributeAccessPolicyWindow, &window));
  cudaLaunchAttributeValue cooperative{};
  cooperative.cooperative = 1;
  CHECK(cudaGraphKernelNodeSetAttribute(counted, cudaLaunchAttributeCooperative, &cooperative));
  cudaLaunchAttributeValue oneBlockClusters{};
  oneBlockClusters.clusterDim.x = 1;
  oneBlockClusters.clusterDim.y = 1;
  oneBlockClusters.clusterDim.z = 1;
  CHECK(cudaGraphKernelNodeSetAttribute(counted, cudaLaunchAttributeClusterDimension,
                                        &oneBlockClusters));
  CHECK(cudaGraphKernelNodeGetAttribute(counted, cudaLaunchAttributePriority, &value));
  EXPECT(value.priority == -1, "the priority reads %d", value.priority);
  CHECK(cudaGraphKernelNodeGetAttribute(counted, cudaLaunchAttributeAccessPolicyWindow, &value));
  EXPECT(value.accessPolicyWindow.base_ptr == x &&
             value.accessPolicyWindow.num_bytes == n * sizeof(float) &&
             value.accessPolicyWindow.hitRatio == 0.5f &&
             value.accessPolicyWindow.hitProp == cudaAccessPropertyPersisting,
         "the access policy window reads back wrong");
  CHECK(cudaGraphKernelNodeGetAttribute(counted, cudaLaunchAttributeCooperative, &value));
  EXPECT(value.cooperative == 1, "the cooperative attribute reads %d", value.cooperative);
  std::printf("kernel-attributes: priority, access policy window and cooperative read back\n");

  // New parameters keep them; copied to the other kernel node.
  CHECK(cudaGraphKernelNodeSetParams(counted, &nodes.iotaParams));
  CHECK(cudaGraphKernelNodeGetAttribute(counted, cudaLaunchAttributeCooperative, &value));
  EXPECT(value.cooperative == 1, "after new parameters the node is cooperative: %d",
         value.cooperative);
  CHECK(cudaGraphKernelNodeCopyAttributes(scaled, counted));
  CHECK(cudaGraphKernelNodeGetAttribute(scaled, cudaLaunchAttributePriority, &value));
  EXPECT(value.priority == -1, "the copied priority reads %d", value.priority);
  CHECK(cudaGraphKernelNodeGetAttribute(scaled, cudaLaunchAttributeCooperative, &value));
  EXPECT(value.cooperative == 1, "the copied cooperative attribute reads %d", value.cooperative);

  // The graph, its kernels cooperative, does what it says, twice.
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int launch = 0; launch < 2; ++launch) {
    if (expectScaledIota(exec, stream, x, n, 3.0f, "cooperative kernel nodes") != 0) return 1;
  }
  std::printf("kernel-attributes: kept by new parameters, copied, launched: x = 3i\n");

  // Refused: clusters of several blocks (not supported), attributes of streams or of single
  // launches only, a node that is no kernel.
  cudaLaunchAttributeValue pairs = oneBlockClusters;
  pairs.clusterDim.x = 2;
  const cudaError_t clusters =
      cudaGraphKernelNodeSetAttribute(counted, cudaLaunchAttributeClusterDimension, &pairs);
  cudaGetLastError();
  cudaLaunchAttributeValue policy{};
  policy.syncPolicy = cudaSyncPolicySpin;
  const cudaError_t streamOnly =
      cudaGraphKernelNodeSetAttribute(counted, cudaLaunchAttributeSynchronizationPolicy, &policy);
  cudaGetLastError();
  const cudaError_t notAKernel =
      cudaGraphKernelNodeSetAttribute(zero, cudaLaunchAttributePriority, &priority);
  cudaGetLastError();
  EXPECT(clusters == cudaErrorNotSupported && streamOnly == cudaErrorInvalidValue &&
             notAKernel == cudaErrorInvalidValue,
         "refusals: %s, %s, %s", cudaGetErrorName(clusters), cudaGetErrorName(streamOnly),
         cudaGetErrorName(notAKernel));
  std::printf("kernel-attributes: the refusals\n");

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(x));
  return 0;
}

int eventNodesMode() {
  int* values = nullptr;  // [0] the graph's copy, [1] what the producer stores
  CHECK(cudaMalloc(&values, 2 * sizeof(int)));
  CHECK(cudaMemset(values, 0, 2 * sizeof(int)));
  cudaStream_t stream;
  cudaStream_t producer;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  cudaEvent_t produced;
  cudaEvent_t done;
  cudaEvent_t other;
  CHECK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&other, cudaEventDisableTiming));
  std::atomic<bool> released{false};

  // wait(produced) -> copyInt(values[0] <- values[1]) -> record(done), built node by node.
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  cudaGraphNode_t wait;
  cudaGraphNode_t copy;
  cudaGraphNode_t record;
  CHECK(cudaGraphAddEventWaitNode(&wait, graph, nullptr, 0, produced));
  int* to = values;
  int* from = values + 1;
  void* copyArgs[] = {&to, &from};
  cudaKernelNodeParams copying{};
  copying.func = reinterpret_cast<void*>(copyInt);
  copying.gridDim = dim3(1);
  copying.blockDim = dim3(1);
  copying.kernelParams = copyArgs;
  CHECK(cudaGraphAddKernelNode(&copy, graph, &wait, 1, &copying));
  CHECK(cudaGraphAddEventRecordNode(&record, graph, &copy, 1, done));
  cudaGraphNodeType waitType;
  cudaGraphNodeType recordType;
  CHECK(cudaGraphNodeGetType(wait, &waitType));
  CHECK(cudaGraphNodeGetType(record, &recordType));
  EXPECT(waitType == cudaGraphNodeTypeWaitEvent && recordType == cudaGraphNodeTypeEventRecord,
         "node types %d and %d", waitType, recordType);
  cudaEvent_t readBack = nullptr;
  CHECK(cudaGraphEventWaitNodeGetEvent(wait, &readBack));
  EXPECT(readBack == produced, "the wait node's event read back wrong");
  CHECK(cudaGraphEventRecordNodeGetEvent(record, &readBack));
  EXPECT(readBack == done, "the record node's event read back wrong");
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));

  int value = 0;
  if (produceLater(producer, released, from, 42, produced) != 0) return 1;
  if (launchHeld(exec, stream, released, done, to, value) != 0) return 1;
  EXPECT(value == 42, "the graph copied %d, not what was produced before its event (42)", value);
  // A second launch waits for the event's latest record as of that launch.
  if (produceLater(producer, released, from, 43, produced) != 0) return 1;
  if (launchHeld(exec, stream, released, done, to, value) != 0) return 1;
  EXPECT(value == 43, "the second launch copied %d, not 43", value);

  // The executable graph's wait node given another event; the graph's own node keeps its own.
  CHECK(cudaGraphExecEventWaitNodeSetEvent(exec, wait, other));
  if (produceLater(producer, released, from, 7, other) != 0) return 1;
  if (launchHeld(exec, stream, released, done, to, value) != 0) return 1;
  EXPECT(value == 7, "after cudaGraphExecEventWaitNodeSetEvent the graph copied %d, not 7", value);
  CHECK(cudaGraphEventWaitNodeGetEvent(wait, &readBack));
  EXPECT(readBack == produced, "the graph's wait node took the executable graph's event");
  std::printf("event nodes: waited for 42, 43 and 7\n");

  // The same nodes made by capture.
  cudaGraph_t captured;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK(cudaStreamWaitEvent(stream, produced, cudaEventWaitExternal));
  copyInt<<<1, 1, 0, stream>>>(to, from);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecordWithFlags(done, stream, cudaEventRecordExternal));
  CHECK(cudaStreamEndCapture(stream, &captured));
  size_t count = 0;
  CHECK(cudaGraphGetNodes(captured, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CHECK(cudaGraphGetNodes(captured, nodes.data(), &count));
  EXPECT(count == 3, "the capture made %zu nodes, not 3", count);
  cudaGraphNodeType types[3];
  for (int i = 0; i < 3; ++i) CHECK(cudaGraphNodeGetType(nodes[i], &types[i]));
  EXPECT(types[0] == cudaGraphNodeTypeWaitEvent && types[1] == cudaGraphNodeTypeKernel &&
             types[2] == cudaGraphNodeTypeEventRecord,
         "captured node types %d, %d, %d", types[0], types[1], types[2]);
  cudaGraphExec_t capturedExec;
  CHECK(cudaGraphInstantiate(&capturedExec, captured, 0));
  if (produceLater(producer, released, from, 99, produced) != 0) return 1;
  if (launchHeld(capturedExec, stream, released, done, to, value) != 0) return 1;
  EXPECT(value == 99, "the captured graph copied %d, not 99", value);
  std::printf("event nodes: captured as wait, kernel, record; waited for 99\n");

  // Refusals.
  cudaGraphNode_t refused;
  const cudaError_t noEvent = cudaGraphAddEventRecordNode(&refused, graph, nullptr, 0, nullptr);
  const cudaError_t wrongKind = cudaGraphEventRecordNodeGetEvent(wait, &readBack);
  (void)cudaGetLastError();
  EXPECT(noEvent != cudaSuccess && wrongKind != cudaSuccess, "refusals %s, %s",
         cudaGetErrorName(noEvent), cudaGetErrorName(wrongKind));
  std::printf("event nodes: refusals %s, %s\n", cudaGetErrorName(noEvent),
              cudaGetErrorName(wrongKind));

  CHECK(cudaGraphExecDestroy(capturedExec));
  CHECK(cudaGraphDestroy(captured));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaEventDestroy(produced));
  CHECK(cudaEventDestroy(done));
  CHECK(cudaEventDestroy(other));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaStreamDestroy(producer));
  CHECK(cudaFree(values));
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: %s <mode>\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  int result = 2;
  if (std::strcmp(mode, "capture") == 0) result = captureMode();
  if (std::strcmp(mode, "capture-errors") == 0) result = captureErrors();
  if (std::strcmp(mode, "nodes") == 0) result = nodesMode();
  if (std::strcmp(mode, "capture-graph") == 0) result = captureGraphMode();
  if (std::strcmp(mode, "structure") == 0) result = structureMode();
  if (std::strcmp(mode, "params") == 0) result = paramsMode();
  if (std::strcmp(mode, "user-objects") == 0) result = userObjectsMode();
  if (std::strcmp(mode, "memory") == 0) result = memoryMode();
  if (std::strcmp(mode, "conditional") == 0) result = conditionalMode();
  if (std::strcmp(mode, "event-nodes") == 0) result = eventNodesMode();
  if (std::strcmp(mode, "destroy-node") == 0) result = destroyNodeMode();
  if (std::strcmp(mode, "kernel-attributes") == 0) result = kernelAttributesMode();
  if (result == 2) std::printf("unknown mode %s\n", mode);
  if (result == 0) std::printf("%s: PASSED\n", mode);
  return result;
}
