"""The compiled hot paths (storage/_native.pyx), built from source with the machine's C
compiler when pip installs the project. Optional: when they cannot be built (no compiler),
the install goes on without them and hourglass runs their pure-Python twins
(storage/native.py)."""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # (distutils' errors, a missing compiler, ...)
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skip(exc)

    @staticmethod
    def _skip(exc: Exception) -> None:
        print(f"WARNING: storage._native not built ({exc}); hourglass will run its "
              "pure-Python twins", file=sys.stderr)


try:
    from Cython.Build import cythonize
except ImportError:  # built without Cython (not through pip's isolated build): pure Python
    extensions = []
else:
    extensions = cythonize(
        [Extension("storage._native", ["storage/_native.pyx"], extra_compile_args=["-O2"])],
        language_level=3, quiet=True)

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
