#pragma once
// The stub is built with hidden visibility so that nothing but the CUDA driver API leaks out of
// it; every CUDA entry point it defines is marked with GPUPROXY_EXPORT (the linker version script
// generated from cuda.h then decides the final export list).
#define GPUPROXY_EXPORT extern "C" __attribute__((visibility("default")))
