"""The compiled hot paths (storage/_native.pyx), built from source with the machine's C
compiler when pip installs the project. Optional: without a compiler the build goes on and
hourglass runs its pure-Python twins (storage/native.py)."""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # built without Cython (not through pip's isolated build): pure Python
    extensions = []
else:
    extensions = cythonize(
        [Extension("storage._native", ["storage/_native.pyx"], optional=True,
                   extra_compile_args=["-O2"])],
        language_level=3, quiet=True)

setup(ext_modules=extensions)
