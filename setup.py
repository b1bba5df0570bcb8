"""Builds the native core `fastfeed._native` from csrc/.

No build-time dependency on CUDA or torch: pinning happens at run time through torch's cudart.
xxHash (csrc/third_party/xxhash, BSD-2) and libdeflate's decompressor (csrc/third_party/libdeflate, MIT; a static C
library built first) are vendored; OpenSSL's libcrypto is linked when its header is found.
libjpeg (turbo) is linked when its header is found, enabling the lossless progressive->baseline transcoder;
without it the extension still builds and `fastfeed._native.HAVE_LIBJPEG` is False.

Set FASTFEED_SANITIZE=address,undefined or FASTFEED_SANITIZE=thread to build an instrumented extension.
"""
import glob
import os
import sysconfig

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

# The sources compile one per core (FASTFEED_BUILD_JOBS=N to choose): on a 2-core machine the sanitizer build
# that the tests run went from 81 s to half that.
ParallelCompile("FASTFEED_BUILD_JOBS", default=0).install()


def _have_header(name: str) -> bool:
    dirs = ["/usr/include", "/usr/local/include", sysconfig.get_paths()["include"]]
    dirs += glob.glob("/usr/include/*-linux-gnu")
    return any(os.path.exists(os.path.join(d, name)) for d in dirs)


sources = sorted(glob.glob("csrc/*.cpp"))
macros = []
libraries = ["pthread"]
include_dirs, library_dirs, runtime_dirs = [], [], []
# A libjpeg unpacked outside the system (FASTFEED_LIBJPEG_DIR=<root of an unpacked libjpeg62-turbo(-dev) .deb>),
# for hosts that have the library but not its headers and no package manager.
jpeg_root = os.environ.get("FASTFEED_LIBJPEG_DIR")
if jpeg_root:
    include_dirs += [f"{jpeg_root}/usr/include", f"{jpeg_root}/usr/include/x86_64-linux-gnu"]
    library_dirs += [f"{jpeg_root}/usr/lib/x86_64-linux-gnu"]
    runtime_dirs += library_dirs
    macros.append(("FASTFEED_HAVE_LIBJPEG", "1"))
    libraries.append(":libjpeg.so.62")
elif _have_header("jpeglib.h") and os.environ.get("FASTFEED_NO_LIBJPEG") != "1":
    macros.append(("FASTFEED_HAVE_LIBJPEG", "1"))
    libraries.append("jpeg")

# OpenSSL's libcrypto gives the native tar writer its sha256 (SHA-NI where the CPU has it, ~2 GB/s; CPython's
# hashlib uses the same library). Without its header the writer is left out: `fastfeed._native.HAVE_TAR_WRITER`.
if _have_header("openssl/evp.h") and os.environ.get("FASTFEED_NO_OPENSSL") != "1":
    macros.append(("FASTFEED_HAVE_OPENSSL", "1"))
    libraries.append("crypto")

compile_args = ["-O3", "-Wall", "-Wextra", "-fvisibility=hidden"]
link_args = []
sanitize = os.environ.get("FASTFEED_SANITIZE", "").strip()
if sanitize:
    # -O0: the pybind11 glue compiles in half the time of -O1, and the sanitizers check every access either way.
    compile_args = ["-O0", "-g1", "-fno-omit-frame-pointer", f"-fsanitize={sanitize}"]
    link_args = [f"-fsanitize={sanitize}"]

# `make setup` compiles the core in place while the large wheels download, then installs the package with
# FASTFEED_SKIP_NATIVE=1 so that pip does not compile it a second time.
skip_native = os.environ.get("FASTFEED_SKIP_NATIVE") == "1"

# libdeflate (the PNG decode's inflate, csrc/png_decode.cpp) is C: a static library of its own, linked into the
# extension, so that the C++ flags never reach it.
DEFLATE = "csrc/third_party/libdeflate"
deflate_lib = ("fastfeed_deflate", {
    "sources": sorted(glob.glob(f"{DEFLATE}/lib/*.c") + glob.glob(f"{DEFLATE}/lib/*/*.c")),
    "include_dirs": [DEFLATE],
    "cflags": (["-O0", "-g1", f"-fsanitize={sanitize}"] if sanitize else ["-O2"]) + ["-w"],  # its warnings are not ours
})


class BuildExt(build_ext):
    """build_ext that builds the C library first (`build_ext --inplace` alone would not)."""

    def run(self):
        if self.distribution.has_c_libraries():
            self.run_command("build_clib")
        super().run()


setup(
    libraries=[] if skip_native else [deflate_lib],
    ext_modules=[] if skip_native else [
        Pybind11Extension(
            "fastfeed._native",
            sources,
            cxx_std=17,
            define_macros=macros,
            libraries=libraries,
            include_dirs=include_dirs,
            library_dirs=library_dirs,
            runtime_library_dirs=runtime_dirs,
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
