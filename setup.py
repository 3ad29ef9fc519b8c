"""Build opforge._C with torch.utils.cpp_extension.

The extension holds every operator's schema and kernels; Python reaches them through
``torch.ops.opforge``. CUDA kernels are compiled when torch has CUDA, a CUDA toolkit is found and
a GPU is visible (``OPFORGE_CUDA=0/1`` forces the choice: CI sets 1, so that the CUDA sources
keep compiling on its machines without a GPU). The resolved configuration is printed, with the
reason for the choice.

Environment knobs:
  OPFORGE_CUDA=0|1        force a CPU-only or a CUDA build (default: auto, as above)
  TORCH_CUDA_ARCH_LIST    arches to build (default: the visible GPUs', 9.0 as 9.0a; else 9.0a)
  CUDA_HOME / CUDA_PATH   the CUDA toolkit (default: found from nvcc)
  MAX_JOBS                parallel compile jobs (default: all cores)
  OPFORGE_DEBUG=1         -O0 -g, device code with -lineinfo
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _is_toolkit(path: str | None) -> bool:
    return (
        bool(path)
        and os.path.isfile(os.path.join(path, "bin", "nvcc"))
        and bool(
            glob.glob(os.path.join(path, "include", "cuda_runtime.h"))
            + glob.glob(os.path.join(path, "targets", "*", "include", "cuda_runtime.h"))
        )
    )


def find_cuda_home() -> str | None:
    """Find the real CUDA toolkit.

    ``nvcc`` on PATH may be a wrapper script or a link outside the toolkit (here:
    /usr/local/bin/nvcc), which makes torch's own guess (dirname of dirname) wrong. We try,
    in order: $CUDA_HOME/$CUDA_PATH, the resolved nvcc's toolkit, the TOP that nvcc itself
    reports in a dry run, and /usr/local/cuda.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if _is_toolkit(os.environ.get(var)):
            return os.path.realpath(os.environ[var])
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidate = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if _is_toolkit(candidate):
            return candidate
        try:
            dry = subprocess.run(
                [nvcc, "-v", "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                capture_output=True,
                text=True,
                timeout=60,
            )
            m = re.search(r"TOP=(\S+)", dry.stdout + dry.stderr)
            if m and _is_toolkit(os.path.realpath(m.group(1))):
                return os.path.realpath(m.group(1))
        except (OSError, subprocess.SubprocessError):
            pass
    for candidate in ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]:
        if _is_toolkit(candidate):
            return os.path.realpath(candidate)
    return None


def pip_nvidia_include_dirs() -> list[str]:
    """Header folders of pip's nvidia-* wheels (cublas_v2.h, cusparse.h, ... live there)."""
    dirs: list[str] = []
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    return [d for d in dirs if os.path.isdir(d)]


def env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    return value.lower() not in ("0", "false", "no", "off")


def links_libstdcxx_dynamically(cxx: str) -> bool:
    """Whether ``cxx`` links a shared object against libstdc++.so (the one torch uses).

    A compiler that links libstdc++ statically into the extension gives it a private copy of the
    C++ library next to torch's: seen with a relocated GCC 13 (/opt/gcc, set as CXX on our GPU
    machines), where the first number formatted into an error message crashed the process.
    """
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write(
                "#include <sstream>\nstd::string f(long x) { std::ostringstream s; s << x; return s.str(); }\n"
            )
        try:
            subprocess.run(
                [cxx, "-shared", "-fPIC", "-o", out, src], check=True, capture_output=True, timeout=120
            )
            with open(out, "rb") as f:
                return b"libstdc++.so" in f.read()
        except (OSError, subprocess.SubprocessError):
            return False


def choose_cxx() -> str | None:
    """Keep $CXX unless it links libstdc++ statically; then take the first c++/g++ that doesn't.

    Returns a note for the printed configuration when the compiler was switched.
    """
    current = os.environ.get("CXX") or "c++"
    if links_libstdcxx_dynamically(current):
        return None
    for candidate in ("c++", "g++", "/usr/bin/c++", "/usr/bin/g++"):
        path = shutil.which(candidate)
        if path and os.path.realpath(path) != os.path.realpath(shutil.which(current) or current):
            if links_libstdcxx_dynamically(path):
                os.environ["CXX"] = path
                cc = os.path.join(os.path.dirname(path), "gcc" if "g++" in os.path.basename(path) else "cc")
                if os.path.exists(cc):
                    os.environ["CC"] = cc
                return (
                    f"{path} (CXX={current} links libstdc++ statically: a second C++ runtime beside torch's)"
                )
    return f"{current} (WARNING: it links libstdc++ statically and no other C++ compiler was found)"


# CUDA_HOME must be right before torch.utils.cpp_extension is imported: it reads it once.
CUDA_HOME = find_cuda_home()
if CUDA_HOME:
    os.environ["CUDA_HOME"] = CUDA_HOME

import torch  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402


def gpu_visible() -> bool:
    """Whether torch sees a CUDA GPU (False, not an error, when the driver is missing or broken)."""
    try:
        return torch.cuda.is_available()
    except Exception:  # a broken driver must not break a CPU build
        return False


def choose_cuda(want_cuda: bool | None, torch_has_cuda: bool, toolkit: str | None) -> tuple[bool, str]:
    """(build the CUDA kernels?, why) from OPFORGE_CUDA (None: unset) and what this machine has.

    Unset, they are built when all three are there: a CUDA build of torch, a CUDA toolkit, a GPU.
    Without a GPU they would take most of the build time (13.5 of 22.6 minutes of a first
    ``make test`` on 2 cores) for kernels that nothing here can run.
    """
    if want_cuda is not None:
        return want_cuda, f"forced by OPFORGE_CUDA={int(want_cuda)}"
    if not torch_has_cuda:
        return False, "this torch is a CPU-only build"
    if toolkit is None:
        return False, "no CUDA toolkit found: set CUDA_HOME, or put nvcc on PATH"
    if not gpu_visible():
        return False, "no GPU visible; OPFORGE_CUDA=1 builds them"
    return True, "a GPU is visible; OPFORGE_CUDA=0 leaves them out"


def resolve_arch_list() -> str:
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    try:
        if torch.cuda.is_available():
            caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
            # Hopper (9.0) as 9.0a: its arch-specific code (wgmma, TMA) runs on H100/H200 only.
            return ";".join(
                f"{major}.{minor}" + ("a" if (major, minor) == (9, 0) else "") for major, minor in caps
            )
    except Exception:  # a broken driver must not break a CPU build
        pass
    return "9.0a"


def sources(with_cuda: bool) -> list[str]:
    cpp = sorted(glob.glob("csrc/**/*.cpp", recursive=True))
    if not with_cuda:
        # Launchers that include ATen's CUDA headers sit in cuda/ folders too.
        cpp = [s for s in cpp if "/cuda/" not in s]
        return cpp
    return cpp + sorted(glob.glob("csrc/**/*.cu", recursive=True))


class BuildExt(BuildExtension):
    """torch's BuildExtension, linking without -Bsymbolic-functions.

    Debian's and Ubuntu's Pythons link extensions with ``-Wl,-Bsymbolic-functions``. GCC 13
    emits libstdc++ template code such as ``std::ostream::_M_insert<long>`` into our library;
    with that flag the calls bind to those local copies instead of libstdc++'s, and the first
    number formatted into an error message crashed the process (seen with torch 2.11 on Ubuntu
    24.04). Without the flag the dynamic linker binds them to libstdc++'s own definitions.
    """

    def build_extensions(self) -> None:
        for attr in ("linker_so", "linker_so_cxx"):
            cmd = getattr(self.compiler, attr, None)
            if cmd:
                setattr(self.compiler, attr, [arg for arg in cmd if "Bsymbolic" not in arg])
        super().build_extensions()

    # opforge/_build_config.py's text, set by main(). The loader compares its TORCH_VERSION with the
    # torch it runs under, to fail with a clear message.
    build_config = ""

    def run(self) -> None:
        super().run()
        # Next to the built _C: build_lib is what a wheel packs. In-place and editable builds load it
        # from the source tree; a wheel build leaves the source tree's copy alone, since it describes
        # the _C the developer's editable build put there (CPU or CUDA).
        dirs = [self.build_lib, ROOT] if self.inplace else [self.build_lib]
        for d in dirs:
            os.makedirs(os.path.join(d, "opforge"), exist_ok=True)
            with open(os.path.join(d, "opforge", "_build_config.py"), "w") as f:
                f.write(self.build_config)


def main() -> None:
    want_cuda = env_flag("OPFORGE_CUDA")
    torch_has_cuda = torch.version.cuda is not None
    with_cuda, cuda_reason = choose_cuda(want_cuda, torch_has_cuda, CUDA_HOME)
    if with_cuda and not (torch_has_cuda and CUDA_HOME):
        sys.exit(
            "opforge: OPFORGE_CUDA=1 but "
            + (
                "this torch has no CUDA"
                if not torch_has_cuda
                else "no CUDA toolkit was found (set CUDA_HOME)"
            )
        )

    cxx_note = choose_cxx()
    debug = env_flag("OPFORGE_DEBUG") or False
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    opt = ["-O0", "-g"] if debug else ["-O3"]
    # -fopenmp: at::parallel_for is inlined from ATen's headers as an OpenMP region; without the
    # flag it silently runs on one thread. The OpenMP runtime resolves to the libgomp torch loads.
    # -ffp-contract=off: no fused multiply-adds behind our back (GCC fuses by default where FMA is
    # available, e.g. in the AVX2 variants), so IoUs round exactly like torchvision's.
    cxx_flags = [
        *opt,
        "-fopenmp",
        "-ffp-contract=off",
        "-fdiagnostics-color=always",
        "-Wall",
        "-Wno-unused-parameter",
        "-Wno-unknown-pragmas",
        "-Wno-psabi",  # notes that vector-typed helpers change ABI across ISAs: ours are TU-internal
    ]  # torch picks -std (C++17 or C++20 by version)
    define_macros = [("OPFORGE_WITH_CUDA", "1" if with_cuda else "0")]
    include_dirs = [os.path.join(ROOT, "csrc")]
    arch_list = None
    nvcc_flags: list[str] = []
    if with_cuda:
        arch_list = resolve_arch_list()
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
        # Toolkit headers first, then the pip wheels' (which add cublas_v2.h, cusparse.h, ...).
        include_dirs += [os.path.join(CUDA_HOME, "include"), *pip_nvidia_include_dirs()]
        nvcc_flags = [*opt, "--expt-relaxed-constexpr", "-lineinfo", "-Xptxas=-warn-spills"]
        # Hopper-only kernels (wgmma, setmaxnreg) have code only in a 9.0a build; the launchers
        # find out at run time which kernels this binary can run on the GPU (*_available()).
        if debug:
            nvcc_flags.append("-G")

    ext_cls = CUDAExtension if with_cuda else CppExtension
    ext = ext_cls(
        name="opforge._C",
        sources=sources(with_cuda),
        include_dirs=include_dirs,
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags} if with_cuda else {"cxx": cxx_flags},
        extra_link_args=["-fopenmp"],
        py_limited_api=False,
    )

    print(
        "opforge build configuration:\n"
        f"  torch            {torch.__version__} (CUDA {torch.version.cuda})\n"
        f"  C++ compiler     {cxx_note or os.environ.get('CXX', 'c++')}\n"
        f"  CUDA kernels     {'yes' if with_cuda else 'no'} ({cuda_reason})\n"
        f"  CUDA toolkit     {CUDA_HOME or 'not found'}\n"
        f"  arch list        {arch_list or '-'}\n"
        f"  include dirs     {' '.join(include_dirs)}\n"
        f"  jobs             {os.environ['MAX_JOBS']}\n"
        f"  mode             {'debug' if debug else 'release'}",
        flush=True,
    )

    BuildExt.build_config = (
        "# Written by setup.py at build time.\n"
        f"TORCH_VERSION = {torch.__version__!r}\n"
        f"TORCH_CUDA = {torch.version.cuda!r}\n"
        f"WITH_CUDA = {bool(with_cuda)!r}\n"
        f"CUDA_ARCH_LIST = {arch_list!r}\n"
    )

    setup(
        # The extension's C++ ABI is torch's of this exact release, so the package (a wheel above
        # all) requires it. A requirement can't name a local version (+cu130, +cpu): that part is
        # checked by the loader against TORCH_VERSION, with a message naming the build it needs.
        install_requires=[f"torch=={torch.__version__.split('+')[0]}", "numpy"],
        packages=find_packages(include=["opforge", "opforge.*"]),
        ext_modules=[ext],
        cmdclass={"build_ext": BuildExt.with_options(use_ninja=True)},
    )


main()
