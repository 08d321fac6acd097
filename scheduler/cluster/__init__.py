"""Cluster mode over NATS JetStream (docs/cluster.md). Imported only when ``--cluster`` is
given: single-node mode never imports nats."""
