"""Builds relax_straggler and its extension relax_straggler._C against the installed torch.

A CPU torch gives a CppExtension; a torch built with CUDA adds the CUDA-event pool
(csrc/torch/cuda_event_pool.cpp) and defines WITH_CUDA. The engine in csrc/core is
compiled into the extension; CMakeLists.txt builds it alone for its C++ tests.
"""

import glob
import os

import torch
from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _sources(with_cuda: bool) -> list[str]:
    core = sorted(glob.glob("csrc/core/**/*.cpp", recursive=True))
    glue = sorted(glob.glob("csrc/torch/*.cpp"))
    if not with_cuda:
        glue = [s for s in glue if not s.endswith("cuda_event_pool.cpp")]
    return core + glue


def _extension():
    with_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    kwargs = dict(
        name="relax_straggler._C",
        sources=_sources(with_cuda),
        include_dirs=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, "csrc", "torch"), "/usr/include/eigen3"],
        # torch's headers as system headers: -Wall -Wextra then report our code only.
        extra_compile_args={"cxx": ["-O3", "-Wall", "-Wextra"]
                            + [f for p in cpp_extension.include_paths() for f in ("-isystem", p)]},
    )
    if with_cuda:
        kwargs["define_macros"] = [("WITH_CUDA", None)]
        return cpp_extension.CUDAExtension(**kwargs)
    return cpp_extension.CppExtension(**kwargs)


setup(
    name="relax_straggler",
    version="0.1.0",
    description="Straggler detection for distributed PyTorch training",
    packages=find_packages(include=["relax_straggler", "relax_straggler.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "numpy"],
    # RELAX_STRAGGLER_NO_EXT=1: install the package (editable) around an extension that
    # `setup.py build_ext --inplace` builds and rebuilds incrementally (make build).
    ext_modules=[] if os.environ.get("RELAX_STRAGGLER_NO_EXT") else [_extension()],
    entry_points={"console_scripts": ["relax-straggler=relax_straggler.cli:main"]},
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
