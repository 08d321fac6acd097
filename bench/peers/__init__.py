"""Side-by-side benchmark of hourglass against its peers.

Run it with ``python -m bench.peers.run``; see ``bench/peers/README.md``.
"""
