// The interface through which the stage timer (relax_straggler._C, csrc/torch/stage_timer.h)
// tells an observer in another extension module (relax_straggler._core: the kernel-record
// collector, csrc/cupti/cupti_collector.h) where its sections begin and end, with neither
// module linking the other: Python hands the timer a PyCapsule named
// kSectionObserverCapsule whose pointer is a SectionObserver, and the timer copies it.
//
// Plain C++ types only (no CUDA, no torch, no Python): both modules are built by the same
// compiler from this one definition.
#pragma once

namespace relax_straggler {

// Called at each begin (begin = 1) and end (begin = 0) of a section the stage timer times,
// on sampled steps only, from the thread that opened or closed the section, with the timer's
// lock held: it must be quick and must not call back into the timer.
using SectionObserverFn = void (*)(void* ctx, int stage, int begin);

struct SectionObserver {
  SectionObserverFn fn = nullptr;  // nullptr: no observer
  void* ctx = nullptr;             // passed back to fn; kept alive by the capsule's owner
};

inline constexpr const char* kSectionObserverCapsule = "relax_straggler.section_observer";

}  // namespace relax_straggler
