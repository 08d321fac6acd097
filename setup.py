"""The compiled hot paths, one extension per layer (storage/_native.pyx, scheduler/_native.pyx,
api/_native.pyx; the msgpack helpers they share are storage/_msgpack.pxd), built from source
with the machine's C compiler when pip installs the project. Each is optional: one that
cannot be built (no compiler) is left out, the install goes on, and hourglass runs its
pure-Python twins (storage/native.py, scheduler/native.py, api/native.py)."""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: module -> source, lowest layer first
NATIVE = {"storage._native": "storage/_native.pyx",
          "scheduler._native": "scheduler/_native.pyx",
          "api._native": "api/_native.pyx"}


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # (distutils' errors, a missing compiler, ...)
            self._skip("the compiled hot paths", exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skip(ext.name, exc)

    @staticmethod
    def _skip(what: str, exc: Exception) -> None:
        print(f"WARNING: {what} not built ({exc}); hourglass will run its pure-Python twins",
              file=sys.stderr)


try:
    from Cython.Build import cythonize
except ImportError:  # built without Cython (not through pip's isolated build): pure Python
    extensions = []
else:
    extensions = cythonize(
        [Extension(name, [source], extra_compile_args=["-O2"]) for name, source in NATIVE.items()],
        language_level=3, quiet=True)

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
