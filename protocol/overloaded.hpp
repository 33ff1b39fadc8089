#pragma once
// Visiting the decoded variants of ring_format.hpp with one lambda per alternative:
//   std::visit(Overloaded{[](const Completion&) {...}, [](const AsyncError&) {...}}, decoded);

namespace gpuproxy::protocol {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace gpuproxy::protocol
