"""The CMake build step of the kvferry Python package (pyproject.toml names the backend).

build_ext configures and builds the _kvferry target with CMake and copies the extension into
the wheel beside the package's .py files. Environment:
  KVFERRY_CMAKE_BUILD_DIR  CMake build directory (default build-pip); an existing one is
                           reused, so CI packages the libraries it has already built
  KVFERRY_CMAKE_BUILD_TYPE (default: Release in a fresh directory, else the directory's)
  KVFERRY_CMAKE_ARGS       extra cmake arguments, split on spaces (e.g. -DKVFERRY_WERROR=ON)
  KVFERRY_BUILD_JOBS       parallel build jobs (default: what CMake picks)
"""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(ROOT, "build-pip"), exist_ok=True)  # egg_base must exist


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.join(ROOT, os.environ.get("KVFERRY_CMAKE_BUILD_DIR", "build-pip"))
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DKVFERRY_PYTHON=ON",
                     "-DPython3_EXECUTABLE=" + sys.executable]
        build_type = os.environ.get("KVFERRY_CMAKE_BUILD_TYPE")
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            # A fresh directory: only what the module needs, optimised.
            configure += ["-G", "Ninja", "-DKVFERRY_BUILD_TESTS=OFF", "-DKVFERRY_BUILD_BENCH=OFF"]
            build_type = build_type or "Release"
        if build_type:  # else an existing directory keeps its own
            configure.append("-DCMAKE_BUILD_TYPE=" + build_type)
        configure += os.environ.get("KVFERRY_CMAKE_ARGS", "").split()
        subprocess.run(configure, check=True)
        build = ["cmake", "--build", build_dir, "--target", "_kvferry"]
        if os.environ.get("KVFERRY_BUILD_JOBS"):
            build += ["-j", os.environ["KVFERRY_BUILD_JOBS"]]
        subprocess.run(build, check=True)
        built = glob.glob(os.path.join(build_dir, "python", "kvferry", "_kvferry*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one _kvferry*.so under {build_dir}/python/kvferry, "
                               f"found {built}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built[0], target)


setup(
    ext_modules=[CMakeExtension("kvferry._kvferry")],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own build tree, away from CMake's build/.
    options={"build": {"build_base": os.path.join("build-pip", "setuptools")},
             "egg_info": {"egg_base": "build-pip"}},
)
