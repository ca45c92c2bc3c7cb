// conveyor/internal/invariant.h: checks of the machinery's invariants (build-only, like the rest
// of pinned/internal/: never installed, so no public header may include it). The slot ring's free
// list, the index queues and the loader's engine use it: a broken invariant has one policy.
//
// CONVEYOR_CHECK(cond, what): always on. For bookkeeping that, if wrong, would hand a user a
// corrupt batch (a slot in two places, a job that does not exist, a permit with no index behind
// it): stopping the process with the broken invariant named is better than training on wrong
// data, and better than an exception that a caller could catch and carry on after. Each costs one
// branch.
// CONVEYOR_DEBUG_CHECK(cond, what): the same, in debug builds only (NDEBUG unset), for checks that
// cost more than a branch on the hot path.
// Misuse of a public API (an illegal slot transition asked of SlotRing, a bad option) is not an
// invariant: it throws std::logic_error or std::invalid_argument at the API, as documented there.
#pragma once

#include <cstdio>
#include <exception>

namespace conveyor::detail {

[[noreturn]] inline void invariant_failed(const char* what, const char* file, int line) noexcept {
  std::fprintf(stderr, "conveyor: internal invariant broken at %s:%d: %s\n", file, line, what);
  std::terminate();
}

}  // namespace conveyor::detail

#define CONVEYOR_CHECK(cond, what) \
  ((cond) ? static_cast<void>(0) : ::conveyor::detail::invariant_failed(what, __FILE__, __LINE__))

#ifdef NDEBUG
#define CONVEYOR_DEBUG_CHECK(cond, what) static_cast<void>(0)
#else
#define CONVEYOR_DEBUG_CHECK(cond, what) CONVEYOR_CHECK(cond, what)
#endif
