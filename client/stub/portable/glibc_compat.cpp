// What lets a library or program linked on Debian 12 (glibc 2.36) load on glibc 2.28 (RHEL 8,
// Ubuntu 20.04, Debian 11): it must not refer to any symbol version newer than GLIBC_2.28, or the
// loader refuses it ("version `GLIBC_2.34' not found"). The linker binds each call to the newest
// (default) version the build machine's libc defines, so every function and variable in
// glibc_symbols.def is linked with -Wl,--wrap=<name> and lands here, in __wrap_<name>:
//
// - Functions that still exist at an old version (the pthread_*, dl* and shm_* functions, which
//   lived in libpthread, libdl and librt before glibc 2.34 moved them into libc) are reached at
//   that version by a jump, which passes every argument on untouched. The loader matches a
//   version by its name only, not by the library that defined it at link time, so
//   pthread_create@GLIBC_2.2.5 resolves to libpthread.so.0 on an old glibc and to libc.so.6's
//   compatibility symbol on a new one; what links this names libpthread.so.0, libdl.so.2 and
//   librt.so.1 as needed for that reason.
// - stat, fstat and lstat became functions at 2.33; before, the headers turned them into calls of
//   __xstat and friends with a structure version, which every glibc still exports.
// - gettid (2.30), arc4random (2.36), _dl_find_object (2.35) and __libc_single_threaded (2.32)
//   have no old version: they are done here with older means. __libc_single_threaded is a
//   variable libstdc++'s inline code reads to skip atomic reference counting in a process with one
//   thread; a private one that always says "not single-threaded" makes it always use atomics,
//   which is correct in every process, only not as fast in a single-threaded one.
//
// x86_64 only: the versions and the jump are x86_64's (other architectures start at later
// versions).
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#if !defined(__x86_64__)
#error "glibc_compat.cpp names x86_64's glibc versions"
#endif

// __wrap_<name>: a jump to <name>@<version> through the PLT, in .text.
// clang-format off
#define GPUPROXY_FORWARD(name, version)                              \
  __asm__(".pushsection .text\n"                                     \
          ".symver gpuproxy_old_" #name ", " #name "@" #version "\n" \
          ".globl __wrap_" #name "\n"                                \
          ".hidden __wrap_" #name "\n"                               \
          ".type __wrap_" #name ", @function\n"                      \
          "__wrap_" #name ":\n"                                      \
          "  jmp gpuproxy_old_" #name "@PLT\n"                       \
          ".size __wrap_" #name ", . - __wrap_" #name "\n"           \
          ".popsection\n");
// clang-format on
#define GPUPROXY_STAND_IN(name)
#include "glibc_symbols.def"
#undef GPUPROXY_FORWARD
#undef GPUPROXY_STAND_IN

#define GPUPROXY_WRAP extern "C" __attribute__((visibility("hidden")))

// What <sys/stat.h> called before glibc 2.33. 1 is x86_64's _STAT_VER (struct stat's layout).
extern "C" int gpuproxy_old_xstat(int, const char*, struct stat*);
extern "C" int gpuproxy_old_lxstat(int, const char*, struct stat*);
extern "C" int gpuproxy_old_fxstat(int, int, struct stat*);
extern "C" int gpuproxy_old_fxstatat(int, int, const char*, struct stat*, int);
__asm__(".symver gpuproxy_old_xstat, __xstat@GLIBC_2.2.5");
__asm__(".symver gpuproxy_old_lxstat, __lxstat@GLIBC_2.2.5");
__asm__(".symver gpuproxy_old_fxstat, __fxstat@GLIBC_2.2.5");
__asm__(".symver gpuproxy_old_fxstatat, __fxstatat@GLIBC_2.4");
constexpr int kStatVersion = 1;

// On x86_64 struct stat and struct stat64 are the same structure.
GPUPROXY_WRAP int __wrap_stat(const char* path, struct stat* buffer) {
  return gpuproxy_old_xstat(kStatVersion, path, buffer);
}
GPUPROXY_WRAP int __wrap_stat64(const char* path, struct stat* buffer) {
  return gpuproxy_old_xstat(kStatVersion, path, buffer);
}
GPUPROXY_WRAP int __wrap_lstat(const char* path, struct stat* buffer) {
  return gpuproxy_old_lxstat(kStatVersion, path, buffer);
}
GPUPROXY_WRAP int __wrap_lstat64(const char* path, struct stat* buffer) {
  return gpuproxy_old_lxstat(kStatVersion, path, buffer);
}
GPUPROXY_WRAP int __wrap_fstat(int fd, struct stat* buffer) {
  return gpuproxy_old_fxstat(kStatVersion, fd, buffer);
}
GPUPROXY_WRAP int __wrap_fstat64(int fd, struct stat* buffer) {
  return gpuproxy_old_fxstat(kStatVersion, fd, buffer);
}
GPUPROXY_WRAP int __wrap_fstatat(int directory, const char* path, struct stat* buffer, int flags) {
  return gpuproxy_old_fxstatat(kStatVersion, directory, path, buffer, flags);
}
GPUPROXY_WRAP int __wrap_fstatat64(int directory, const char* path, struct stat* buffer,
                                   int flags) {
  return gpuproxy_old_fxstatat(kStatVersion, directory, path, buffer, flags);
}

GPUPROXY_WRAP pid_t __wrap_gettid() {
  return static_cast<pid_t>(syscall(SYS_gettid));
}

// libstdc++'s std::random_device ("default" token). getrandom is GLIBC_2.25; like arc4random it
// does not fail once the kernel's pool is initialised, so a failure other than EINTR is fatal.
GPUPROXY_WRAP uint32_t __wrap_arc4random() {
  uint32_t value = 0;
  for (;;) {
    const ssize_t got = getrandom(&value, sizeof value, 0);
    if (got == static_cast<ssize_t>(sizeof value)) return value;
    if (got < 0 && errno != EINTR) __builtin_trap();
  }
}

namespace {

struct FindObject {
  uintptr_t address;
  dl_find_object* result;
  bool found;
};

int findObject(dl_phdr_info* info, size_t, void* data) {
  auto* find = static_cast<FindObject*>(data);
  uintptr_t start = UINTPTR_MAX;
  uintptr_t end = 0;
  bool contains = false;
  const void* ehFrame = nullptr;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& header = info->dlpi_phdr[i];
    const uintptr_t segment = info->dlpi_addr + header.p_vaddr;
    if (header.p_type == PT_LOAD) {
      if (segment < start) start = segment;
      if (segment + header.p_memsz > end) end = segment + header.p_memsz;
      if (find->address >= segment && find->address < segment + header.p_memsz) contains = true;
    } else if (header.p_type == PT_GNU_EH_FRAME) {
      ehFrame = reinterpret_cast<const void*>(segment);
    }
  }
  if (!contains) return 0;
  std::memset(find->result, 0, sizeof *find->result);
  find->result->dlfo_map_start = reinterpret_cast<void*>(start);
  find->result->dlfo_map_end = reinterpret_cast<void*>(end);
  find->result->dlfo_eh_frame = const_cast<void*>(ehFrame);
  find->found = true;
  return 1;
}

}  // namespace

// The unwinder in libgcc_eh (linked in with -static-libgcc) finds an address's unwind tables with
// _dl_find_object when it was built on glibc 2.35 or newer, and has no other way then. Before
// 2.35 it walked the loaded objects with dl_iterate_phdr, which is what this does. dlfo_link_map
// is left null: the unwinder does not read it.
GPUPROXY_WRAP int __wrap__dl_find_object(void* address, dl_find_object* result) {
  FindObject find{reinterpret_cast<uintptr_t>(address), result, false};
  dl_iterate_phdr(findObject, &find);
  return find.found ? 0 : -1;
}

extern "C" {
__attribute__((visibility("hidden"))) char __wrap___libc_single_threaded = 0;
}
