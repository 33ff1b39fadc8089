#pragma once
// Shared memory between the daemon and one client: an anonymous memfd that the daemon creates,
// seals and passes over the Unix socket (SCM_RIGHTS). No name in /dev/shm, so it works when the
// two processes live in different IPC (and mount) namespaces, and it disappears with its last
// descriptor and mapping, whichever process dies first.

#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "ipc/unique_fd.hpp"

#if defined(__SANITIZE_THREAD__)
#define GPUPROXY_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GPUPROXY_THREAD_SANITIZER 1
#endif
#endif
#ifndef GPUPROXY_THREAD_SANITIZER
#define GPUPROXY_THREAD_SANITIZER 0
#endif

namespace gpuproxy::ipc {

// A range of this process's address space held by an inaccessible (PROT_NONE) mapping, so that
// nothing else lands there until a segment is mapped over it.
//
// Same-address mapping protocol (the pinned host heap must have one virtual address in both
// processes, because the application hands those pointers to the daemon inside records and to
// kernels as device-mapped host pointers):
//   1. one side reserves a range here: `reserve(bytes)` finds a free one in its own process;
//   2. it creates or maps the segment into the reservation (`SharedSegment::create(..., &r)`);
//   3. it tells the other side the address over the control plane; the other side maps with
//      `SharedSegment::map(fd, bytes, address)`, which uses MAP_FIXED_NOREPLACE and throws
//      (EEXIST) rather than clobber its own mappings;
//   4. on failure the first side retries with `reserve(bytes, failedAddress + bytes)`.
// Either side may go first. The client's address space is the more crowded one (the application,
// its libraries, the CUDA runtime's own reservations), so asking the client first succeeds more
// often; the default hint sits far from both the heap and the mmap area of a typical process.
class AddressReservation {
public:
#if GPUPROXY_THREAD_SANITIZER
  // ThreadSanitizer keeps most of the address space for its shadow memory and refuses mappings
  // there; its "high application" range, from 0x7e8000000000 up, is open to the program.
  static constexpr std::uintptr_t kDefaultHint = 0x7e8000000000;
  static constexpr unsigned kHintSlots = 1u << 9;
#else
  // Where `reserve` starts looking: 32 TiB, well above brk and below the top-down mmap area of a
  // 47-bit address space.
  static constexpr std::uintptr_t kDefaultHint = std::uintptr_t{1} << 45;
  // How many 1 GiB slots above kDefaultHint a caller may pick from at random (forked processes
  // that all start at the same hint would otherwise collide in the daemon).
  static constexpr unsigned kHintSlots = 1u << 14;
#endif
  // Candidates are aligned to 2 MiB so that huge pages stay possible.
  static constexpr std::size_t kAlignment = std::size_t{2} << 20;

  // The first free kAlignment-aligned range of `bytes` at or above `hint` (at most 64 tries, each
  // `bytes` rounded up to kAlignment further). Throws std::system_error when none is free.
  static AddressReservation reserve(std::size_t bytes, std::uintptr_t hint = kDefaultHint);
  // A hint at a random one of the kHintSlots 1 GiB slots above kDefaultHint. Memory that another
  // process must map at the same address goes there: far from where the kernel places mappings
  // by itself, and, being random, unlikely to be where another client's memory already lies in
  // that process.
  static std::uintptr_t randomHint();
  // Exactly at `address` or throws std::system_error (EEXIST when something is already there).
  static AddressReservation reserveAt(void* address, std::size_t bytes);

  AddressReservation() = default;
  ~AddressReservation();
  AddressReservation(AddressReservation&& other) noexcept;
  AddressReservation& operator=(AddressReservation&& other) noexcept;
  AddressReservation(const AddressReservation&) = delete;
  AddressReservation& operator=(const AddressReservation&) = delete;

  void* address() const {
    return address_;
  }
  std::size_t size() const {
    return bytes_;
  }
  // Forgets the range without unmapping it (a segment has been mapped over it and owns it now).
  void* release();

private:
  AddressReservation(void* address, std::size_t bytes) : address_(address), bytes_(bytes) {}
  void* address_ = nullptr;
  std::size_t bytes_ = 0;
};

// A mapped memfd segment. Owns the mapping and the descriptor; both go away on destruction.
class SharedSegment {
public:
  // The seals every segment carries before anyone else sees it: nobody (in particular a client
  // with the descriptor) can shrink it under the daemon's mapping, which would turn the daemon's
  // next access into SIGBUS, nor grow it, nor change the seals.
  static constexpr int kRequiredSeals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW;

  // Creates a zero-filled segment of `bytes` (rounded up to the page size), seals it and maps it
  // read-write. `name` shows up in /proc/PID/maps and fd listings ("memfd:NAME"). With
  // `placeInto`, the segment is mapped over that reservation (same size) and takes it over.
  // Throws std::system_error naming the failing call.
  static SharedSegment create(const std::string& name, std::size_t bytes,
                              AddressReservation* placeInto = nullptr);

  // Maps a segment received from the other side, taking ownership of `fd`. Before trusting it:
  // the size must be exactly `expectedBytes` and kRequiredSeals must be set (which also proves it
  // is a memfd: other files have no seals). With `fixedAddress`, maps exactly there or throws
  // (EEXIST when the range is in use in this process). Throws std::system_error otherwise.
  static SharedSegment map(UniqueFd fd, std::size_t expectedBytes, void* fixedAddress = nullptr);
  // The same checks, then maps over the start of `placeInto` (at least `expectedBytes` long),
  // which it takes over; the rest of the reservation, if any, is unmapped. Unlike `fixedAddress`,
  // no other thread's mmap can land in the range between reserving and mapping.
  static SharedSegment map(UniqueFd fd, std::size_t expectedBytes, AddressReservation& placeInto);
  // Maps the window `[offset, offset + bytes)` of a received file exactly at `address` (all three
  // page-aligned), after the same checks except that the file may be larger than the window:
  // kRequiredSeals' shrink seal set, and the file holds the window. Throws std::system_error
  // (EEXIST when the range is in use in this process, EINVAL for a file or window refused).
  static SharedSegment mapWindow(UniqueFd fd, std::uint64_t offset, std::size_t bytes,
                                 void* address);

  SharedSegment() = default;
  ~SharedSegment();
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return bytes_; }
  std::span<std::byte> bytes() const { return {data_, bytes_}; }
  // The descriptor to pass to the other side (borrowed; still owned by this segment).
  int fd() const { return fd_.get(); }
  bool valid() const { return data_ != nullptr; }

private:
  SharedSegment(UniqueFd fd, std::byte* data, std::size_t bytes)
      : fd_(std::move(fd)), data_(data), bytes_(bytes) {}
  void unmap();

  UniqueFd fd_;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// The system page size (segment sizes and fixed addresses are multiples of it).
std::size_t pageSize();

// The file behind a range of this process's memory, when another process can map the same
// memory: the range lies in one MAP_SHARED mapping of a file (a memfd, such as a SharedSegment's)
// and a descriptor for it can be had, from /proc/self/map_files (which needs CAP_SYS_ADMIN) or
// among this process's open descriptors (opened read-write).
struct SharedWindow {
  UniqueFd fd;                   // a descriptor of our own
  std::uint64_t fileOffset = 0;  // where the range starts in the file
};
// `address` and `bytes` page-aligned. nullopt: private or anonymous memory, a range spanning
// mappings, or no descriptor to be had.
std::optional<SharedWindow> sharedWindowOf(const void* address, std::size_t bytes);

// Makes [address, address + bytes) shareable where it is: when the range lies wholly in private,
// anonymous, read-write mappings (malloc's larger blocks, an mmap of its own, the heap), its pages
// are copied into a new memfd (sealed as SharedSegment's are) that is mapped over them at the same
// address, MAP_FIXED, with the same contents. `address` and `bytes` page-aligned. What another
// thread writes to the range while it is copied is lost, and the pages stay shared across a
// fork(), so the caller does this only for memory it was asked to share (cuMemHostRegister of a
// range of whole pages). nullopt, and the memory untouched, for anything else.
std::optional<SharedWindow> shareInPlace(void* address, std::size_t bytes);

}  // namespace gpuproxy::ipc
