"""What the tests and the benchmarks share: a real ``hourglass serve`` in a subprocess
(``server_process``), the crash workload with its ledger and verdict (``crash``), the
analysis workload's synthetic stores (``analysis_workload``), streams parked with the
pusher over socket pairs (``push_streams``). It imports the product's
packages (storage) and nothing of ``tests`` or ``bench``: both import it, and ``tests``
imports ``bench`` only to test it."""
