"""Builds relax_straggler and its two extensions.

relax_straggler._core: the torch-free engine (csrc/core) and the kernel-record statistics
(csrc/cupti/kernel_stats.cpp) with their pybind11 bindings (csrc/python); the offline
analysis and the monitor service need nothing else, so they start without loading torch.
With a CUDA torch and the toolkit's CUPTI it also holds the CUPTI collector
(csrc/cupti/cupti_collector.cpp, RS_WITH_CUPTI), linked against libcupti.
relax_straggler._C: the LibTorch glue (csrc/torch: stage timer, timed collective backend,
the latter compiled as one unit, csrc/torch/comm_unit.cpp) against the installed torch. A CPU torch gives a CppExtension; a torch built with CUDA adds
the CUDA-event pool (csrc/torch/cuda_event_pool.cpp) and defines WITH_CUDA.
CMakeLists.txt builds csrc/core alone for its C++ tests.
"""

import contextlib
import glob
import os
import re
import sys
import time
from typing import Iterator

import pybind11
import torch
from setuptools import Extension, find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_LOG = os.environ.get("RELAX_STRAGGLER_BUILD_LOG", "")
# Python's CFLAGS carry -g: debug info cost 30 % (the engine) to 60 % (the LibTorch glue)
# more compile time and 30x the libraries' size; RELAX_STRAGGLER_DEBUG_INFO=1 keeps it
# (make build DEBUG_INFO=1).
DEBUG_INFO = [] if os.environ.get("RELAX_STRAGGLER_DEBUG_INFO") == "1" else ["-g0"]
WARNINGS = ["-O3", "-Wall", "-Wextra"]


def _cupti() -> tuple[str, str] | None:
    """(include dir, library dir) of the CUDA toolkit's CUPTI when torch is built with CUDA
    and the toolkit ships CUPTI; None otherwise (a CPU build: no collector)."""
    home = cpp_extension.CUDA_HOME
    if torch.version.cuda is None or home is None:
        return None
    for include, lib in ((os.path.join(home, "include"), os.path.join(home, "lib64")),
                         (os.path.join(home, "extras", "CUPTI", "include"), os.path.join(home, "extras", "CUPTI", "lib64"))):
        if os.path.exists(os.path.join(include, "cupti.h")) and glob.glob(os.path.join(lib, "libcupti.so*")):
            return include, lib
    return None


def _core_extension() -> Extension:
    sources = (sorted(glob.glob("csrc/core/**/*.cpp", recursive=True)) + ["csrc/cupti/kernel_stats.cpp"]
               + sorted(glob.glob("csrc/python/*.cpp")))
    include_dirs = [os.path.join(ROOT, "csrc"), os.path.join(ROOT, "csrc", "python"), "/usr/include/eigen3"]
    kwargs: dict = {}
    cupti = _cupti()
    if cupti is not None:
        include, lib = cupti
        sources.append("csrc/cupti/cupti_collector.cpp")
        kwargs = dict(define_macros=[("RS_WITH_CUPTI", None)], libraries=["cupti"], library_dirs=[lib],
                      runtime_library_dirs=[lib])
        include_dirs.append(include)
    return Extension(
        name="relax_straggler._core",
        sources=sources,
        include_dirs=include_dirs,
        language="c++",
        extra_compile_args={"cxx": ["-std=c++17", "-fvisibility=hidden", *WARNINGS, *DEBUG_INFO,
                                    "-isystem", pybind11.get_include()]},
        **kwargs,
    )


def _unit_parts(unit: str) -> set[str]:
    """The source files a translation unit such as csrc/torch/comm_unit.cpp includes."""
    folder = os.path.dirname(unit)
    with open(unit, encoding="utf-8") as fh:
        return {os.path.join(folder, m.group(1)) for m in re.finditer(r'^#include "([^"]+\.cpp)"', fh.read(), re.M)}


def _torch_extension() -> Extension:
    with_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    glue = sorted(glob.glob("csrc/torch/*.cpp"))
    glue = [s for s in glue if s not in _unit_parts("csrc/torch/comm_unit.cpp")]
    if not with_cuda:
        glue = [s for s in glue if not s.endswith("cuda_event_pool.cpp")]
    kwargs = dict(
        name="relax_straggler._C",
        # The stage timer merges its intervals with the engine's csrc/core/intervals.
        sources=["csrc/core/intervals.cpp", *glue],
        include_dirs=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, "csrc", "torch")],
        # torch's headers as system headers: -Wall -Wextra then report our code only.
        extra_compile_args={"cxx": WARNINGS + DEBUG_INFO
                            + [f for p in cpp_extension.include_paths() for f in ("-isystem", p)]},
    )
    if with_cuda:
        kwargs["define_macros"] = [("WITH_CUDA", None)]
        return cpp_extension.CUDAExtension(**kwargs)
    return cpp_extension.CppExtension(**kwargs)


@contextlib.contextmanager
def _output_to(log_path: str, what: str) -> Iterator[None]:
    """Sends this process's stdout and stderr (the compiler's and ninja's output included)
    to log_path, appended, while one line on the terminal says what is built, where the log
    is and how long it took. A failed build prints the log's last 40 lines and exits with
    status 1 (SystemExit), without the traceback of the build machinery."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(1), "w")
    print(f"{what} (log: {log_path}) ...", end=" ", file=terminal, flush=True)
    start = time.monotonic()

    def restore() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)

    with terminal, open(log_path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        except Exception:
            restore()
            with open(log_path) as fh:
                tail = fh.readlines()[-40:]
            print(f"failed; the last lines of {log_path}:", "".join(tail), sep="\n", end="", file=terminal)
            raise SystemExit(1) from None
        restore()
        print(f"{time.monotonic() - start:.0f} s", file=terminal)


class BuildExtension(cpp_extension.BuildExtension):
    """Builds each extension in its own folder: both compile csrc/core/intervals.cpp, with
    different flags, and a shared object file would be rebuilt (and both relinked) by
    every build. With RELAX_STRAGGLER_BUILD_LOG=PATH the compiler output goes to PATH
    (written anew by each build) and each extension prints one line (make build)."""

    def run(self) -> None:
        if BUILD_LOG:
            os.makedirs(os.path.dirname(os.path.abspath(BUILD_LOG)), exist_ok=True)
            open(BUILD_LOG, "w").close()
        super().run()

    def build_extension(self, ext: Extension) -> None:
        base = self.build_temp
        self.build_temp = os.path.join(base, ext.name)
        quiet = _output_to(BUILD_LOG, f"building {ext.name}: {len(ext.sources)} C++ files") if BUILD_LOG \
            else contextlib.nullcontext()
        try:
            with quiet:
                super().build_extension(ext)
        finally:
            self.build_temp = base


setup(
    name="relax_straggler",
    version="0.1.0",
    description="Straggler detection for distributed PyTorch training",
    packages=find_packages(include=["relax_straggler", "relax_straggler.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "numpy"],
    # RELAX_STRAGGLER_NO_EXT=1: install the package (editable) around an extension that
    # `setup.py build_ext --inplace` builds and rebuilds incrementally (make build).
    ext_modules=[] if os.environ.get("RELAX_STRAGGLER_NO_EXT") else [_core_extension(), _torch_extension()],
    entry_points={"console_scripts": ["relax-straggler=relax_straggler.cli:main"]},
    cmdclass={"build_ext": BuildExtension},
)
