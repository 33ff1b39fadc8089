#include "ipc/shared_segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <system_error>
#include <utility>

namespace gpuproxy::ipc {

namespace {

[[noreturn]] void throwErrno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

std::size_t roundUp(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::string hex(std::uintptr_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), kDigits[value & 0xf]);
    value >>= 4;
  } while (value != 0);
  return "0x" + out;
}

// Maps `bytes` at exactly `address` without replacing anything already there. Returns nullptr
// with errno set on failure. Kernels before 4.17 ignore MAP_FIXED_NOREPLACE and treat the address
// as a hint, so a different result counts as "occupied" too.
void* mapExactly(void* address, std::size_t bytes, int prot, int flags, int fd, off_t offset = 0) {
  void* result = ::mmap(address, bytes, prot, flags | MAP_FIXED_NOREPLACE, fd, offset);
  if (result == MAP_FAILED) return nullptr;
  if (result != address) {
    ::munmap(result, bytes);
    errno = EEXIST;
    return nullptr;
  }
  return result;
}

}  // namespace

std::size_t pageSize() {
  static const std::size_t kPage = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return kPage;
}

// ---- AddressReservation ----

std::uintptr_t AddressReservation::randomHint() {
  std::random_device random;
  const std::uint64_t slot = ((static_cast<std::uint64_t>(random()) << 32) | random()) % kHintSlots;
  return kDefaultHint + slot * (std::uint64_t{1} << 30);
}

AddressReservation AddressReservation::reserve(std::size_t bytes, std::uintptr_t hint) {
  if (bytes == 0) throw std::system_error(EINVAL, std::generic_category(), "reserve 0 bytes");
  const std::size_t length = roundUp(bytes, pageSize());
  const std::size_t stride = roundUp(length, kAlignment);
  std::uintptr_t candidate = roundUp(hint, kAlignment);
  for (int attempt = 0; attempt < 64; ++attempt, candidate += stride) {
    void* address = reinterpret_cast<void*>(candidate);
    if (mapExactly(address, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1)) {
      return AddressReservation(address, length);
    }
    if (errno != EEXIST) break;
  }
  throwErrno("no free " + std::to_string(length) + "-byte address range at or above " + hex(hint));
}

AddressReservation AddressReservation::reserveAt(void* address, std::size_t bytes) {
  const std::size_t length = roundUp(bytes, pageSize());
  if (mapExactly(address, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1) ==
      nullptr) {
    throwErrno("reserve " + std::to_string(length) + " bytes at " +
               hex(reinterpret_cast<std::uintptr_t>(address)));
  }
  return AddressReservation(address, length);
}

AddressReservation::~AddressReservation() {
  if (address_ != nullptr) ::munmap(address_, bytes_);
}

AddressReservation::AddressReservation(AddressReservation&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

AddressReservation& AddressReservation::operator=(AddressReservation&& other) noexcept {
  if (this != &other) {
    if (address_ != nullptr) ::munmap(address_, bytes_);
    address_ = std::exchange(other.address_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void* AddressReservation::release() {
  bytes_ = 0;
  return std::exchange(address_, nullptr);
}

// ---- SharedSegment ----

SharedSegment SharedSegment::create(const std::string& name, std::size_t bytes,
                                    AddressReservation* placeInto) {
  if (bytes == 0) throw std::system_error(EINVAL, std::generic_category(), "segment of 0 bytes");
  const std::size_t length = roundUp(bytes, pageSize());
  if (placeInto != nullptr && placeInto->size() != length) {
    throw std::system_error(EINVAL, std::generic_category(),
                            "segment '" + name + "' does not match its address reservation");
  }
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throwErrno("memfd_create('" + name + "')");
  if (::ftruncate(fd.get(), static_cast<off_t>(length)) != 0) {
    throwErrno("ftruncate(memfd '" + name + "', " + std::to_string(length) + ")");
  }
  // Sealed before the descriptor leaves this process, so no other process ever sees it unsealed.
  if (::fcntl(fd.get(), F_ADD_SEALS, kRequiredSeals) != 0) {
    throwErrno("fcntl(F_ADD_SEALS) on memfd '" + name + "'");
  }
  void* data = nullptr;
  if (placeInto != nullptr) {
    // MAP_FIXED is right here, unlike anywhere else: the range is our own reservation, and
    // replacing it atomically leaves no window in which another thread's mmap could land there.
    data = ::mmap(placeInto->address(), length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                  fd.get(), 0);
    if (data == MAP_FAILED) throwErrno("mmap(memfd '" + name + "') over its reservation");
    placeInto->release();
  } else {
    data = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (data == MAP_FAILED) throwErrno("mmap(memfd '" + name + "')");
  }
  return SharedSegment(std::move(fd), static_cast<std::byte*>(data), length);
}

namespace {

// What map() checks before it trusts a received descriptor.
void checkReceived(int fd, std::size_t expectedBytes) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) throwErrno("fstat(shared segment)");
  if (!S_ISREG(info.st_mode) || info.st_size < 0 ||
      static_cast<std::size_t>(info.st_size) != expectedBytes) {
    throw std::system_error(EINVAL, std::generic_category(),
                            "shared segment has " + std::to_string(info.st_size) +
                                " bytes, expected " + std::to_string(expectedBytes));
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) throwErrno("fcntl(F_GET_SEALS) on shared segment (not a memfd?)");
  if ((seals & SharedSegment::kRequiredSeals) != SharedSegment::kRequiredSeals) {
    throw std::system_error(
        EPERM, std::generic_category(),
        "shared segment is not sealed against resizing (seals " + std::to_string(seals) + ")");
  }
}

}  // namespace

SharedSegment SharedSegment::map(UniqueFd fd, std::size_t expectedBytes,
                                 AddressReservation& placeInto) {
  checkReceived(fd.get(), expectedBytes);
  if (placeInto.address() == nullptr || placeInto.size() < expectedBytes) {
    throw std::system_error(EINVAL, std::generic_category(),
                            "address reservation of " + std::to_string(placeInto.size()) +
                                " bytes is too small for a " + std::to_string(expectedBytes) +
                                "-byte segment");
  }
  auto* base = static_cast<std::byte*>(placeInto.address());
  // MAP_FIXED over our own reservation, as in create().
  void* data =
      ::mmap(base, expectedBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd.get(), 0);
  if (data == MAP_FAILED) throwErrno("mmap(shared segment) over its reservation");
  const std::size_t mapped = roundUp(expectedBytes, pageSize());
  const std::size_t reserved = placeInto.size();
  placeInto.release();
  if (reserved > mapped) ::munmap(base + mapped, reserved - mapped);
  return SharedSegment(std::move(fd), static_cast<std::byte*>(data), expectedBytes);
}

SharedSegment SharedSegment::map(UniqueFd fd, std::size_t expectedBytes, void* fixedAddress) {
  checkReceived(fd.get(), expectedBytes);
  void* data = nullptr;
  if (fixedAddress != nullptr) {
    if (reinterpret_cast<std::uintptr_t>(fixedAddress) % pageSize() != 0) {
      throw std::system_error(EINVAL, std::generic_category(),
                              "fixed address " +
                                  hex(reinterpret_cast<std::uintptr_t>(fixedAddress)) +
                                  " is not page-aligned");
    }
    data = mapExactly(fixedAddress, expectedBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get());
    if (data == nullptr) {
      throwErrno("mmap(shared segment) at " + hex(reinterpret_cast<std::uintptr_t>(fixedAddress)));
    }
  } else {
    data = ::mmap(nullptr, expectedBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (data == MAP_FAILED) throwErrno("mmap(shared segment)");
  }
  return SharedSegment(std::move(fd), static_cast<std::byte*>(data), expectedBytes);
}

SharedSegment SharedSegment::mapWindow(UniqueFd fd, std::uint64_t offset, std::size_t bytes,
                                       void* address) {
  const auto start = reinterpret_cast<std::uintptr_t>(address);
  if (bytes == 0 || offset % pageSize() != 0 || bytes % pageSize() != 0 ||
      start % pageSize() != 0) {
    throw std::system_error(EINVAL, std::generic_category(),
                            "window of " + std::to_string(bytes) + " bytes at file offset " +
                                std::to_string(offset) + ", address " + hex(start) +
                                " is not page-aligned");
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throwErrno("fstat(shared window)");
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  // Without the shrink seal the sender could truncate the file under our mapping, and our next
  // access to it would be SIGBUS.
  if (!S_ISREG(info.st_mode) || seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    throw std::system_error(EINVAL, std::generic_category(),
                            "shared window is not a memfd sealed against shrinking");
  }
  if (info.st_size < 0 || offset > static_cast<std::uint64_t>(info.st_size) ||
      bytes > static_cast<std::uint64_t>(info.st_size) - offset) {
    throw std::system_error(EINVAL, std::generic_category(),
                            "shared window [" + std::to_string(offset) + ", +" +
                                std::to_string(bytes) + ") lies outside its " +
                                std::to_string(info.st_size) + "-byte file");
  }
  void* data = mapExactly(address, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                          static_cast<off_t>(offset));
  if (data == nullptr) throwErrno("mmap(shared window) at " + hex(start));
  return SharedSegment(std::move(fd), static_cast<std::byte*>(data), bytes);
}

SharedSegment::~SharedSegment() {
  unmap();
}

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : fd_(std::move(other.fd_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    unmap();
    fd_ = std::move(other.fd_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void SharedSegment::unmap() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
  fd_.reset();
}

std::optional<SharedWindow> sharedWindowOf(const void* address, std::size_t bytes) {
  const auto start = reinterpret_cast<std::uintptr_t>(address);
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return std::nullopt;
  // "low-high perms offset major:minor inode path"
  unsigned long long low = 0, high = 0, offset = 0, inode = 0;
  unsigned major = 0, minor = 0;
  char perms[8] = {};
  bool found = false;
  char line[4096];
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &low, &high, perms, &offset, &major,
                    &minor, &inode) != 7) {
      continue;
    }
    if (start >= low && start < high) {
      found = true;
      break;
    }
  }
  std::fclose(maps);
  if (!found || bytes > high - start || perms[3] != 's' || inode == 0) return std::nullopt;
  SharedWindow window;
  window.fileOffset = offset + (start - low);
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/map_files/%llx-%llx", low, high);
  window.fd = UniqueFd(::open(path, O_RDWR | O_CLOEXEC));
  if (window.fd) return window;
  // Without the privilege: one of our descriptors of the same file, if it is open read-write.
  DIR* descriptors = ::opendir("/proc/self/fd");
  if (descriptors == nullptr) return std::nullopt;
  while (const dirent* entry = ::readdir(descriptors)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(descriptors)) continue;
    struct stat info {};
    if (::fstat(static_cast<int>(fd), &info) != 0 || info.st_ino != inode ||
        info.st_dev != makedev(major, minor)) {
      continue;
    }
    const int flags = ::fcntl(static_cast<int>(fd), F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) continue;
    window.fd = UniqueFd(::fcntl(static_cast<int>(fd), F_DUPFD_CLOEXEC, 0));
    if (window.fd) break;
  }
  ::closedir(descriptors);
  if (!window.fd) return std::nullopt;
  return window;
}

std::optional<SharedWindow> shareInPlace(void* address, std::size_t bytes) {
  const auto start = reinterpret_cast<std::uintptr_t>(address);
  if (bytes == 0 || start % pageSize() != 0 || bytes % pageSize() != 0 || start + bytes < start) {
    return std::nullopt;
  }
  // Every page of the range in a private anonymous read-write mapping ("[heap]" counts; files,
  // shared memory, the stack and read-only memory do not).
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return std::nullopt;
  std::uintptr_t covered = start;
  char line[4096];
  while (covered < start + bytes && std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long long low = 0, high = 0, offset = 0, inode = 0;
    unsigned major = 0, minor = 0;
    char perms[8] = {};
    char path[4096] = {};
    const int fields = std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %4095s", &low, &high, perms,
                                   &offset, &major, &minor, &inode, path);
    if (fields < 7 || high <= covered || low > covered) continue;
    const bool anonymous = inode == 0 && (fields == 7 || std::strcmp(path, "[heap]") == 0);
    if (!anonymous || std::strncmp(perms, "rw-p", 4) != 0) break;
    covered = high;
  }
  std::fclose(maps);
  if (covered < start + bytes) return std::nullopt;

  UniqueFd fd(::memfd_create("gpuproxy-registered", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return std::nullopt;
  void* copy = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (copy == MAP_FAILED) return std::nullopt;
  std::memcpy(copy, address, bytes);
  ::munmap(copy, bytes);
  if (::fcntl(fd.get(), F_ADD_SEALS, SharedSegment::kRequiredSeals) != 0) return std::nullopt;
  // MAP_FIXED over memory the caller owns, replaced in one step: no other mapping can land in
  // between.
  if (::mmap(address, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd.get(), 0) !=
      address) {
    return std::nullopt;
  }
  SharedWindow window;
  window.fd = std::move(fd);
  return window;
}

}  // namespace gpuproxy::ipc
