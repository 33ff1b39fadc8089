#pragma once
// What the PTX conformance suite's kernels (conformance.cu, conformance_sm90.cu) share: each
// thread reads one row of inputs (In) and writes its results into kSlots slots of its own,
// which tests/programs/ptx_conformance.cpp compares with its CPU reference.

struct In {
  unsigned long long a;
  unsigned long long b;
  unsigned long long c;
};

// Results per thread; unused slots stay as the host filled them.
constexpr int kSlots = 64;

#define SLOT(index, value) out[(index)] = static_cast<unsigned long long>(value)
