"""Code only the tests use: in-process servers and engines. What the benchmarks reuse too (a
server subprocess, the crash and analysis workloads) is in the top-level ``support`` package."""
