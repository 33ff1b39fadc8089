// For programs (not libraries) linked on glibc 2.34 or newer that must start on an older glibc,
// with glibc_compat.cpp: their start code (crt1.o) calls __libc_start_main@GLIBC_2.34, which runs
// the program's constructors (DT_INIT, .init_array) itself and is passed no `init` function. The
// old __libc_start_main@GLIBC_2.2.5 runs only the `init` it is given (programs used to bring
// __libc_start_main their own, __libc_csu_init), so the jump to it passes one that does what
// __libc_csu_init did. Newer glibc's GLIBC_2.2.5 version still honours `init` (for old programs),
// so the constructors run once on either. Linked with -Wl,--wrap=__libc_start_main.
#if !defined(__x86_64__)
#error "program_start.cpp names x86_64's glibc version"
#endif

using Constructor = void (*)(int, char**, char**);

extern "C" {
// The linker provides these in every program; crti.o defines _init.
extern const Constructor __init_array_start[] __attribute__((visibility("hidden")));
extern const Constructor __init_array_end[] __attribute__((visibility("hidden")));
void _init();

int gpuproxy_old_libc_start_main(int (*main)(int, char**, char**), int argc, char** argv,
                                 Constructor init, void (*fini)(), void (*loaderFini)(),
                                 void* stackEnd);
}
__asm__(".symver gpuproxy_old_libc_start_main, __libc_start_main@GLIBC_2.2.5");

namespace {

// __libc_csu_init of glibc before 2.34 (the loader has run the preinit array already).
void runConstructors(int argc, char** argv, char** environment) {
  _init();
  for (const Constructor* constructor = __init_array_start; constructor != __init_array_end;
       ++constructor) {
    (*constructor)(argc, argv, environment);
  }
}

}  // namespace

extern "C" __attribute__((visibility("hidden"))) int __wrap___libc_start_main(
    int (*main)(int, char**, char**), int argc, char** argv, Constructor init, void (*fini)(),
    void (*loaderFini)(), void* stackEnd) {
  return gpuproxy_old_libc_start_main(main, argc, argv, init ? init : runConstructors, fini,
                                      loaderFini, stackEnd);
}
