"""Side-by-side benchmark of hourglass against its peers (issue 7, "Side by side").

Run it with ``python -m bench.peers.run``; see ``bench/peers/README.md``.
"""
