"""What reading the write-ahead stream costs a follower, by the way it reads: nats-py pull
fetches of 1 message (a follower at the stream's end) or of 256 (one that trails), against
a push (ordered) consumer. One local nats-server (JetStream, R1 stream), ``--n`` messages of
``--size`` bytes (a W1 record: 1000 messages, ~203-221 KB); per message, this process's CPU
(nats-py's loop) and the server's (psutil: 10 ms ticks, so coarse over 300 messages):

    PYTHONPATH=. .venv/bin/python -m bench.nats_fetch [--n 300] [--size 203000] [--buffer 32768]

``--buffer``: nats-py's socket read size (``nats.aio.client.DEFAULT_BUFFER_SIZE``).
docs/cluster.md ("Measured") has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time

import nats
import nats.aio.client
import psutil
from nats.js import api

from bench.support.nats_cluster import NATS_SERVER
from bench.support.server_process import free_port

MODES = ("pull1", "pull256", "push")


async def read_all(js: object, mode: str, n: int) -> None:
    if mode.startswith("pull"):
        batch = 1 if mode == "pull1" else 256
        sub = await js.pull_subscribe(  # type: ignore[attr-defined]
            "s.x", stream="S", config=api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=1,
                ack_policy=api.AckPolicy.NONE, mem_storage=True, num_replicas=1,
                max_ack_pending=-1))
        got = 0
        while got < n:
            for m in await sub.fetch(batch, timeout=5):
                _ = bytes(m.data), m.metadata
                got += 1
        await sub.unsubscribe()
        return
    done = asyncio.Event()
    count = [0]

    async def on_message(m: object) -> None:
        _ = bytes(m.data), m.metadata  # type: ignore[attr-defined]
        count[0] += 1
        if count[0] >= n:
            done.set()

    sub = await js.subscribe(  # type: ignore[attr-defined]
        "s.x", stream="S", cb=on_message, ordered_consumer=True,
        config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                                  opt_start_seq=1))
    await asyncio.wait_for(done.wait(), 60)
    await sub.unsubscribe()


async def main(n: int, size: int, rounds: int) -> None:
    port = free_port()
    store = tempfile.mkdtemp(prefix="hg-nats-fetch-")
    proc = subprocess.Popen([str(NATS_SERVER), "-js", "-sd", store, "-p", str(port),
                             "-a", "127.0.0.1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.x"])
        payload = os.urandom(size)
        for _ in range(n):
            await js.publish("s.x", payload)
        server = psutil.Process(proc.pid)
        for r in range(rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                s0, c0 = sum(server.cpu_times()[:2]), time.process_time()
                await read_all(js, mode, n)
                c1, s1 = time.process_time(), sum(server.cpu_times()[:2])
                print(f"{mode:8s} client {(c1 - c0) / n * 1e3:.3f} ms a message, "
                      f"server {(s1 - s0) / n * 1e3:.3f}")
        await nc.close()
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--size", type=int, default=203_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--buffer", type=int, default=None)
    args = ap.parse_args()
    if args.buffer:
        nats.aio.client.DEFAULT_BUFFER_SIZE = args.buffer
    asyncio.run(main(args.n, args.size, args.rounds))
