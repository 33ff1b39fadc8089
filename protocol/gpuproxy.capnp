# gpuproxy control plane: what a client stub and gpuproxyctl say to gpuproxyd over a Unix socket.
#
# Conventions:
# - Every CUDA-facing method answers with `result`, a CUresult. The daemon never turns a client's
#   mistake into an RPC exception: exceptions mean the transport broke.
# - Handles (contexts, streams, events, modules, functions) are opaque 64-bit values chosen by the
#   daemon, scoped to one session, never reused within it, and never 0, 1 or 2 (the values CUDA
#   reserves for the NULL, legacy and per-thread streams).
# - Stream 0 means the legacy NULL stream of the context named in the same call.
# - Device pointers are the daemon's real device addresses, so kernel arguments travel verbatim.

@0xc6b9d05eac4d418b;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("gpuproxy::protocol");

const protocolVersion :UInt32 = 4;

# Largest payload one Session.submit carries; the stub splits larger copies.
const maxTransferChunk :UInt64 = 4194304;

struct DeviceAttribute {
  attribute @0 :Int32;   # a CUdevice_attribute value
  value @1 :Int32;
}

struct DeviceInfo {
  index @0 :UInt32;
  name @1 :Text;
  uuid @2 :Data;                           # 16 bytes, as cuDeviceGetUuid returns it
  totalMemory @3 :UInt64;
  attributes @4 :List(DeviceAttribute);    # every attribute the device answers
  streamPriorities @5 :PriorityBand;       # cuCtxGetStreamPriorityRange of the device
}

struct KernelParameter {
  offset @0 :UInt32;   # byte offset in the packed parameter buffer
  size @1 :UInt32;     # bytes
}

struct KernelLayout {
  parameters @0 :List(KernelParameter);
  parameterBytes @1 :UInt32;        # size of the packed buffer cuLaunchKernel sends
  maxThreadsPerBlock @2 :Int32;
  sharedSizeBytes @3 :Int32;        # static shared memory
  numRegs @4 :Int32;
  localSizeBytes @5 :Int32;         # per thread
  constSizeBytes @6 :Int32;         # user constant memory
  ptxVersion @7 :Int32;             # the PTX target it came from, e.g. 75 (CU_FUNC_ATTRIBUTE_PTX_VERSION)
  binaryVersion @8 :Int32;          # the architecture it runs as, e.g. 90
}

# A capability that carries one file descriptor and nothing else: the receiver takes the descriptor
# with Capability::Client::getFd(). The connection must be a Unix socket that passes descriptors.
interface SharedFile {}

# Bootstrap capability of the client socket. Who the client is comes from the socket (SO_PEERCRED),
# never from anything it sends.
interface Gateway {
  # Once per connection: a second attach on the same connection answers
  # CUDA_ERROR_ALREADY_ACQUIRED and creates nothing (a process that wants another session opens
  # another connection, which counts against its tenant's connection limit).
  attach @0 (protocolVersion :UInt32)
      -> (result :Int32, session :Session, backend :Text, driverVersion :Int32,
          devices :List(DeviceInfo));
}

# One attached client process. Everything created through it belongs to it and is freed when the
# client disconnects, however that happens.
#
# Stream operations (launches, copies, memsets, event records and waits, synchronisations and
# queries) are not methods: they are ring records (protocol/RING_FORMAT.md), written into the
# client's command ring or carried by `submit`, and the daemon has one decoder and one executor
# for them whichever way they come.
interface Session {
  # Contexts: each lives on one device; resources belong to the context that created them.
  createContext @0 (device :UInt32, flags :UInt32) -> (result :Int32, context :UInt64);
  destroyContext @1 (context :UInt64) -> (result :Int32);
  retainPrimaryContext @2 (device :UInt32) -> (result :Int32, context :UInt64);
  releasePrimaryContext @3 (device :UInt32) -> (result :Int32);
  resetPrimaryContext @4 (device :UInt32) -> (result :Int32);
  setPrimaryContextFlags @5 (device :UInt32, flags :UInt32) -> (result :Int32);
  getPrimaryContextState @6 (device :UInt32) -> (result :Int32, flags :UInt32, active :Bool);

  # Memory.
  memAlloc @7 (context :UInt64, bytes :UInt64) -> (result :Int32, pointer :UInt64);
  memFree @8 (pointer :UInt64) -> (result :Int32);
  memGetInfo @9 (context :UInt64) -> (result :Int32, free :UInt64, total :UInt64);

  # Modules and kernels.
  loadModule @10 (context :UInt64, image :Data) -> (result :Int32, module :UInt64);
  unloadModule @11 (module :UInt64) -> (result :Int32);
  getFunction @12 (module :UInt64, name :Text)
      -> (result :Int32, function :UInt64, layout :KernelLayout);

  # Streams.
  createStream @13 (context :UInt64, flags :UInt32, priority :Int32)
      -> (result :Int32, stream :UInt64);
  destroyStream @14 (stream :UInt64) -> (result :Int32);

  # Events.
  createEvent @15 (context :UInt64, flags :UInt32) -> (result :Int32, event :UInt64);
  destroyEvent @16 (event :UInt64) -> (result :Int32);
  eventElapsedTime @17 (start :UInt64, end :UInt64) -> (result :Int32, milliseconds :Float32);

  # Command records over the socket, for a client without a data plane (GPUPROXY_TRANSPORT=rpc,
  # no shared segment could be had) or with a record its ring cannot hold. `commands` is one or
  # more command records back to back, exactly as they would be written into a command ring; they
  # are executed in order, after every command already published in the client's ring. Host bytes
  # travel in the call: a record's host region kMessage (3) names `[offset, offset + bytes)` of a
  # buffer of `payloadBytes` bytes (at most maxTransferChunk) that starts as `payload` and is
  # zero beyond it; copies to the host write into that buffer. The answer comes once every record
  # with a completion token has its Completion: `completions` holds the completion records
  # (Completion, AsyncError) in the order the daemon wrote them, and `payload` the buffer after
  # the commands ran when any of them wrote into it (else empty). A record that breaks the
  # format's framing ends the session, as it would on the ring.
  submit @18 (commands :Data, payload :Data, payloadBytes :UInt64)
      -> (completions :Data, payload :Data);

  # The data plane (protocol/RING_FORMAT.md): a sealed memfd segment holding a command ring and a
  # completion ring per device the session can see (ring i for device ordinal i), the control
  # words, the staging area and the pinned host heap, and for each command ring the eventfd the
  # client writes to wake the daemon (`doorbells`, in ring order). Once per session; a second call
  # after a successful one answers CUDA_ERROR_ALREADY_MAPPED.
  # Before answering any other call the daemon executes every command the client published in its
  # command rings, so a client's calls keep their order across both paths.
  #
  # Pinned heap: with `address` 0 there is none, and the daemon maps the segment wherever it likes.
  # Otherwise the client has reserved `reservedBytes` of its address space at `address` (page
  # aligned) and asks for a heap of `pinnedHeapBytes` (the daemon may grant less, down to 0); the
  # daemon maps the segment at exactly `address`, so that pointers into the heap are the same in
  # both processes. Answers that create nothing and invite a retry:
  # - CUDA_ERROR_INVALID_VALUE with `segmentBytes` set: the segment needs more than `reservedBytes`;
  # - CUDA_ERROR_ALREADY_MAPPED with `segmentBytes` set: the range is taken in the daemon.
  openDataPlane @19 (pinnedHeapBytes :UInt64, address :UInt64, reservedBytes :UInt64)
      -> (result :Int32, segment :SharedFile, doorbells :List(SharedFile), segmentBytes :UInt64,
          pinnedHeapBytes :UInt64);

  # Pinned host memory (cuMemHostAlloc): `[offset, offset + bytes)` of the pinned heap region is
  # now one allocation of the client's. The daemon checks the range (page aligned, inside the
  # heap, overlapping no other: CUDA_ERROR_INVALID_VALUE, or CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
  # for an overlap), charges it to the tenant's pinned memory limit (CUDA_ERROR_OUT_OF_MEMORY, and
  # nothing changes) and registers it with the GPUs as device-mapped host memory.
  registerPinned @20 (offset :UInt64, bytes :UInt64) -> (result :Int32);
  # cuMemFreeHost: the allocation that starts at `offset` is no longer pinned. Answers once the
  # client's work queued before it has completed (it may use the memory), as cuMemFreeHost does.
  unregisterPinned @21 (offset :UInt64) -> (result :Int32);

  # cuMemHostRegister of memory the client already has, when it lies in a shared mapping of a
  # sealed memfd (SharedFile carries its descriptor): the daemon maps `[fileOffset, fileOffset +
  # bytes)` of that file at `address` in its own address space (page aligned; CUDA_ERROR_INVALID_VALUE
  # otherwise, or when the file is not a memfd sealed against shrinking or does not hold the range),
  # so that the memory is the same at the same address in both processes, then charges and
  # registers it as registerPinned does. CUDA_ERROR_ALREADY_MAPPED: the daemon has something else
  # at that address; CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: it overlaps a registered range.
  registerHostRange @27 (file :SharedFile, fileOffset :UInt64, address :UInt64, bytes :UInt64)
      -> (result :Int32);
  # cuMemHostUnregister of such a range (by its `address`): answers, as unregisterPinned does,
  # once the client's work queued before it has completed; then the daemon's mapping goes.
  # CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED when no range starts there.
  unregisterHostRange @28 (address :UInt64) -> (result :Int32);

  # Device printf output of the client's kernels (vprintf on the sim backend): what they printed
  # up to the last synchronisation, which the stub writes to the application's stdout. A
  # DeviceOutput completion record says there is some. The daemon keeps at most the client's
  # printf FIFO size of it (CU_LIMIT_PRINTF_FIFO_SIZE: 1 MiB unless setLimit changed it) between
  # two calls, as a GPU's printf buffer does; `lostBytes` counts what was dropped, oldest output
  # first, when a client printed more.
  takeDeviceOutput @22 () -> (text :Data, lostBytes :UInt64);

  # A module image larger than one transfer chunk (maxTransferChunk) travels in pieces, so that
  # no message is large and the daemon holds no image it has not charged. beginModuleImage
  # announces `bytes` for a module of `context` and charges them to the tenant's memory limit on
  # the context's device until the upload ends (CUDA_ERROR_OUT_OF_MEMORY beyond it; a session has
  # at most 4 uploads open). appendModuleImage adds the next piece, in order: `piece` over the
  # control socket, or `stagingBytes` at `stagingOffset` of the data-plane segment's staging
  # region, which the stub may reuse once the call is answered (at most maxTransferChunk each;
  # more than announced is CUDA_ERROR_INVALID_VALUE). loadModuleImage loads the whole image as
  # loadModule does and ends the upload, as does any error it answers.
  beginModuleImage @23 (context :UInt64, bytes :UInt64) -> (result :Int32, upload :UInt64);
  appendModuleImage @24 (upload :UInt64, piece :Data, stagingOffset :UInt64, stagingBytes :UInt64)
      -> (result :Int32);
  loadModuleImage @25 (upload :UInt64) -> (result :Int32, module :UInt64);

  # A module-scope variable (__device__, __constant__, __managed__) of `module` by its mangled
  # name: where it lies and how many bytes it spans (cuModuleGetGlobal). Its range counts as the
  # client's own memory for copies and memsets while the module is loaded. CUDA_ERROR_NOT_FOUND
  # when the module has no variable of that name. `managed`: a __managed__ variable, which the
  # host must reach too; the stub gives it managed memory with placeManagedVariable.
  getGlobal @26 (module :UInt64, name :Text)
      -> (result :Int32, pointer :UInt64, bytes :UInt64, managed :Bool);

  # Moves managed variable `name` of `module` to `address`: memory of the client's that is
  # registered with the module's device (its managed memory), at least as large as the variable,
  # with the variable's value unless `keepValue` (the memory holds it already: the same library's
  # module in another context put it there). The module's kernels use it there from then on.
  # CUDA_ERROR_INVALID_VALUE for memory that is not such; CUDA_ERROR_NOT_FOUND for no such
  # managed variable; CUDA_ERROR_NOT_SUPPORTED once a kernel of the module has been launched, or
  # where the backend cannot (cuda: the driver places managed variables in gpuproxyd's process).
  placeManagedVariable @30 (module :UInt64, name :Text, address :UInt64, keepValue :Bool)
      -> (result :Int32);

  # cuCtxSetLimit of a limit that reaches the device: CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE
  # or CU_LIMIT_MALLOC_HEAP_SIZE (`limit` as CUlimit numbers it) for the client's contexts on the
  # device of `context`. `value` is what the daemon granted (it may round or clamp, as the driver
  # does). CUDA_ERROR_INVALID_VALUE: the heap size, once the client's device heap exists (a module
  # whose kernels call malloc or free has been loaded, as the CUDA programming guide says);
  # CUDA_ERROR_UNSUPPORTED_LIMIT: any other limit.
  setLimit @29 (context :UInt64, limit :UInt32, value :UInt64) -> (result :Int32, value :UInt64);

  # Interprocess sharing (cuIpc*), between processes of one tenant on one device. A handle is
  # `device` (the daemon's index) and `token`: 16 unguessable bytes the daemon made for one
  # allocation or event, meaningful only to this daemon and only to the tenant that made it; a
  # handle of another tenant's is refused exactly as a made-up one is (CUDA_ERROR_INVALID_VALUE).
  #
  # The allocation holding `pointer` (cuMemAlloc memory of the caller's), exported: the same
  # token for it every time, until it is freed. CUDA_ERROR_INVALID_VALUE for any other pointer.
  ipcExportMemory @31 (pointer :UInt64) -> (result :Int32, device :UInt32, token :Data);
  # The exported allocation mapped for the caller in `context`, at its exporter's address (one
  # address space per GPU): `pointer` is its start, `bytes` its size. Opened again by the same
  # client, the same mapping with one more reference. CUDA_ERROR_INVALID_CONTEXT in the exporting
  # client itself (as the driver refuses a process its own handle), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
  # from a context on another device (through gpuproxy no two devices are peers).
  ipcOpenMemory @32 (context :UInt64, device :UInt32, token :Data)
      -> (result :Int32, pointer :UInt64, bytes :UInt64);
  # One reference of a mapping ipcOpenMemory gave, given back; the last one unmaps it.
  # CUDA_ERROR_INVALID_VALUE for a pointer that is not such a mapping's start.
  ipcCloseMemory @33 (pointer :UInt64) -> (result :Int32);
  # An event made with CU_EVENT_INTERPROCESS, exported. CUDA_ERROR_INVALID_HANDLE for any other.
  ipcExportEvent @34 (event :UInt64) -> (result :Int32, device :UInt32, token :Data);
  # The exported event, as an event of the caller's in `context` (destroyed with destroyEvent):
  # records and waits on either side are on the one event. Errors as ipcOpenMemory's.
  ipcOpenEvent @35 (context :UInt64, device :UInt32, token :Data)
      -> (result :Int32, event :UInt64);

  # Virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, ...).
  # A reservation is a range of device addresses with no memory behind it; physical memory is an
  # allocation with no address, charged to the tenant like any; a mapping puts physical memory
  # (all or part of it) behind part of a reservation, and the client's kernels and copies reach
  # it once access is set. Each is the client's (on its device), not a context's: as with the
  # driver, destroying a context leaves them; they go when given back or with the client. Sizes, addresses and offsets of mappings are multiples of the granularity
  # (protocol/limits.hpp). Through gpuproxy no two devices are peers, so memory of one device is
  # mapped only into reservations made on that device (CUDA_ERROR_NOT_SUPPORTED otherwise).
  #
  # `bytes` (a multiple of the host page size) of addresses, aligned to `alignment` (0 or a power
  # of two) at least.
  memAddressReserve @36 (context :UInt64, bytes :UInt64, alignment :UInt64)
      -> (result :Int32, pointer :UInt64);
  # A reservation given back: `pointer` and `bytes` exactly as reserved, nothing mapped in it.
  memAddressFree @37 (pointer :UInt64, bytes :UInt64) -> (result :Int32);
  # Physical memory on the client's device ordinal `device`, in no context (it is the client's
  # until released, as cuMemCreate's memory outlives the context that was current);
  # `handle` names it (cuMemGenericAllocationHandle).
  memCreate @38 (device :UInt32, bytes :UInt64) -> (result :Int32, handle :UInt64);
  # The handle given back; the memory is freed once no mapping uses it any more.
  memRelease @39 (handle :UInt64) -> (result :Int32);
  # `bytes` of `handle`'s memory from `offset` on, mapped at `pointer`: inside one reservation,
  # over nothing mapped yet. Not accessible until memSetAccess.
  memMap @40 (pointer :UInt64, bytes :UInt64, offset :UInt64, handle :UInt64) -> (result :Int32);
  # The mappings that exactly make up [pointer, pointer + bytes) removed, once the work the client
  # queued before has completed (as cuMemUnmap waits).
  memUnmap @41 (pointer :UInt64, bytes :UInt64) -> (result :Int32);
  # The access of the device the mappings are on to the mappings that exactly make up
  # [pointer, pointer + bytes): `flags` as CUmemAccess_flags numbers them, NONE or READWRITE.
  memSetAccess @42 (pointer :UInt64, bytes :UInt64, flags :UInt32) -> (result :Int32);
  # Physical memory `handle` of the caller's, exported (cuMemExportToShareableHandle): the same
  # token for it every time, while any client holds it. `device` is the daemon's index.
  # CUDA_ERROR_INVALID_VALUE for a handle the caller does not hold.
  memExport @43 (handle :UInt64) -> (result :Int32, device :UInt32, token :Data);
  # Memory exported on daemon device `device` by a client of the caller's tenant (the caller
  # itself included), as physical memory of the caller's (cuMemImportFromShareableHandle): a
  # handle of its own, released with memRelease, of `bytes`; `ordinal` is the device as the
  # caller numbers it. The memory stays its maker's, charged to its tenant, while any client
  # holds or maps it. CUDA_ERROR_INVALID_VALUE for a token of no live export on that device or
  # another tenant's; CUDA_ERROR_INVALID_DEVICE for a device the caller cannot see.
  memImport @44 (device :UInt32, token :Data)
      -> (result :Int32, handle :UInt64, bytes :UInt64, ordinal :UInt32);
}

# ---------------------------------------------------------------------------------------------
# Admin plane: gpuproxyctl on the admin socket.

struct DeviceStatus {
  index @0 :UInt32;
  name @1 :Text;
  memoryTotal @2 :UInt64;
  memoryUsed @3 :UInt64;       # the daemon's exact accounting: bytes allocated by clients
  clients @4 :UInt32;
  stickyError @5 :Int32;       # CUDA_SUCCESS unless a kernel poisoned the device's context
  faultingClientPid @6 :UInt32;
  kernelsQueued @7 :UInt64;    # kernels held by the dispatcher, waiting for the scheduler
  kernelsInFlight @8 :UInt64;  # kernels the dispatcher has submitted that have not completed
  streamPriorities @9 :PriorityBand;            # the device's range (cuCtxGetStreamPriorityRange)
  latencyCriticalPriorities @10 :PriorityBand;  # what latency-critical tenants' streams run at
  bestEffortPriorities @11 :PriorityBand;       # ... and best-effort tenants' streams
  hasSmPartition @12 :Bool;                     # --best-effort-sms is on for this device
  smPartition @13 :SmPartitionStatus;           # meaningful when hasSmPartition
  # Backend calls that may block for long (preparing modules: decoding, the JIT; registering
  # pinned host memory), run on the device's own blocking-call thread rather than the one
  # serving clients.
  blockingCalls @14 :UInt64;            # ended
  blockingCallNanoseconds @15 :UInt64;  # time the ended ones took, all together
  blockingCallsPending @16 :UInt32;     # given and not ended (queued or running)
  computeCapability @17 :UInt32;        # major * 10 + minor, as the device reports it (90: 9.0)
  # Of memoryUsed: allocations whose exporting process let go of them (freed them, or ended)
  # while another process still has them open by interprocess handle; freed at the last close.
  memoryKeptForImporters @18 :UInt64;
}

# Stream priorities from `greatest` (highest priority, lowest number) to `least`, as CUDA numbers
# them.
struct PriorityBand {
  least @0 :Int32;
  greatest @1 :Int32;
}

# How a device's SMs are split between the classes (green contexts), as the driver made it.
struct SmPartitionStatus {
  totalSms @0 :UInt32;
  bestEffortSms @1 :UInt32;
  latencyCriticalSms @2 :UInt32;
}

struct ClientStatus {
  pid @0 :UInt32;
  uid @1 :UInt32;
  gid @2 :UInt32;
  command @3 :Text;             # /proc/PID/comm at attach
  device @4 :Int32;             # first device the client used, -1 before it made a context
  devices @5 :List(UInt32);     # every device the client has a context on
  memoryUsed @6 :UInt64;
  kernelsLaunched @7 :UInt64;
  gpuTimeNs @8 :UInt64;         # measured GPU time of its completed kernels
  connectedSeconds @9 :Float64;
  tenant @10 :Text;             # the tenant of the socket it connected through
  cgroup @11 :Text;             # its cgroup path (/proc/PID/cgroup) at attach
  moduleBytes @12 :UInt64;      # device memory its loaded modules take (included in memoryUsed)
  pinnedMemoryUsed @13 :UInt64; # pinned host memory it holds (cuMemHostAlloc)
  tenantId @14 :UInt32;         # the id of `tenant` (TenantStatus.id)
  podUid @15 :Text;             # Kubernetes pod UID from its cgroup at attach; empty outside a pod
  containerId @16 :Text;        # container id from its cgroup at attach; empty outside a pod
  queuedOperations @17 :UInt64; # operations it has queued on the GPUs that have not finished
  queuedBytes @18 :UInt64;      # daemon memory held for them (kernel parameters, copied data)
}

enum TenantClass {
  bestEffort @0;
  latencyCritical @1;
}

enum TenantOrigin {
  config @0;    # from the tenants file (--config); a reload adds, changes and removes these
  runtime @1;   # created through the admin interface; removed only through it
}

# The Kubernetes allocation a tenant was created for by the device plugin: the extended resource
# and the device ids the kubelet allocated. Empty `resource` for every other tenant.
struct Allocation {
  resource @0 :Text;
  deviceIds @1 :List(Text);
}

# The pod that holds an allocation, in Kubernetes' names (from the kubelet's PodResources API).
struct PodReference {
  podNamespace @0 :Text;
  podName @1 :Text;
  containers @2 :List(Text);
}

struct TenantStatus {
  name @0 :Text;
  socket @1 :Text;
  hasMemoryLimit @2 :Bool;
  memoryLimit @3 :UInt64;       # bytes per device (meaningful when hasMemoryLimit)
  memoryUsed @4 :UInt64;        # bytes held now, summed over devices and clients
  memoryUsedPerDevice @5 :List(UInt64);   # indexed by device
  weight @6 :UInt32;
  class @7 :TenantClass;
  devices @8 :List(UInt32);     # devices its clients may use
  clients @9 :UInt32;
  kernelsLaunched @10 :UInt64;
  gpuTimeNs @11 :UInt64;
  oomCount @12 :UInt64;         # allocations refused because of its limit
  gpuTimeNs10s @13 :UInt64;     # measured GPU time of its kernels over the last 10 s
  gpuShare10s @14 :Float64;     # that, as a fraction (0..1) of all tenants' GPU time in the window
  pinnedMemoryUsed @15 :UInt64;       # pinned host memory its clients hold
  hasPinnedMemoryLimit @16 :Bool;
  pinnedMemoryLimit @17 :UInt64;      # bytes (meaningful when hasPinnedMemoryLimit)
  id @18 :UInt32;               # given by the daemon at creation, never given to another tenant
  origin @19 :TenantOrigin;
  allocation @20 :Allocation;   # set for a device plugin's allocation
  pod @21 :PodReference;        # the pod holding that allocation, once the plugin has seen it
  boundPodUid @22 :Text;        # the pod UID its socket is bound to (first pod seen); empty before
  connections @23 :UInt32;      # open connections on its socket
  maxConnections @24 :UInt32;   # how many it may have open at once
  objects @25 :List(ObjectCount);  # driver objects its clients hold, each kind against its cap
}

# Driver objects of one kind a tenant holds ("contexts", "streams", "events", "modules").
struct ObjectCount {
  kind @0 :Text;
  held @1 :UInt32;
  limit @2 :UInt32;
}

struct DaemonStatus {
  backend @0 :Text;             # "cuda" or "sim"
  version @1 :Text;
  pid @2 :UInt32;
  uptimeSeconds @3 :Float64;
  driverVersion @4 :Int32;
  devices @5 :List(DeviceStatus);
  clients @6 :List(ClientStatus);
  tenants @7 :List(TenantStatus);
  scheduler @8 :Text;           # "fair" or "fifo": how kernels of different clients share a GPU
}

# A change to a live tenant. Only the fields marked `has...` change.
struct TenantLimitsUpdate {
  hasMemoryLimit @0 :Bool;
  memoryLimit @1 :UInt64;       # bytes per device
  clearMemoryLimit @2 :Bool;    # no limit at all
  hasWeight @3 :Bool;
  weight @4 :UInt32;
  hasClass @5 :Bool;
  class @6 :TenantClass;
  hasPinnedMemoryLimit @7 :Bool;
  pinnedMemoryLimit @8 :UInt64;       # bytes of pinned host memory
  clearPinnedMemoryLimit @9 :Bool;    # no pinned memory limit at all
}

# A tenant created at run time. The daemon listens for its clients on
# `<socketDirectory>/gpuproxy.sock`, creating the directories that are missing.
struct TenantSpec {
  name @0 :Text;                # letters, digits, '-', '_', '.'; at most 64
  socketDirectory @1 :Text;     # an absolute path without '..'
  hasMemoryLimit @2 :Bool;
  memoryLimit @3 :UInt64;       # bytes per device
  hasPinnedMemoryLimit @4 :Bool;
  pinnedMemoryLimit @5 :UInt64;
  weight @6 :UInt32;            # 1..10000; 0 means the default, 1
  class @7 :TenantClass;
  hasDevices @8 :Bool;          # false: every device
  devices @9 :List(UInt32);     # the daemon's device indices the tenant sees, numbered from 0
  maxConnections @10 :UInt32;   # 0: the daemon's default
  allocation @11 :Allocation;   # the device plugin's allocation, if it made the tenant
}

interface Admin {
  status @0 () -> (status :DaemonStatus);
  # Changes a tenant's limits now. Lowering the memory limit below what the tenant uses blocks its
  # new allocations and frees nothing. `error` is empty on success, else says why nothing changed.
  setTenantLimits @1 (tenant :Text, update :TenantLimitsUpdate) -> (error :Text);
  # Ends a client's session the way a crash would: everything it held is reclaimed. `pid` must be
  # a process id (1 to 4194304).
  evict @2 (pid :UInt32) -> (error :Text, evicted :UInt32);
  # Creates a tenant now, with its socket. `error` is empty on success, else says why nothing was
  # created (name taken or invalid, directory unusable, a limit out of range).
  createTenant @3 (spec :TenantSpec) -> (error :Text, id :UInt32, socket :Text);
  # Removes a tenant created at run time: its socket is closed and removed and every client that
  # came through it is ended, everything it held reclaimed. Tenants from the tenants file are
  # removed by editing the file and reloading (SIGHUP).
  removeTenant @4 (name :Text) -> (error :Text, connectionsEnded :UInt32);
  # Records which pod holds a tenant's allocation (the device plugin, from PodResources), for
  # status and metrics. An empty `pod.podName` forgets it.
  setTenantPod @5 (name :Text, pod :PodReference) -> (error :Text);
}
