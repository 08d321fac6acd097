"""Code the tests share and the benchmarks reuse: in-process servers, server processes, the
crash workload with its ledger and verifier, the analysis workload."""
