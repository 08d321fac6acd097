"""The in-memory side of a consumer group (scheduler/groups.py drives it and stores it):
its streams, the leases of its receives, receipts, and the plan of an ack.

Everything here runs under the group's lock and does no I/O. An ack (or a nack) is planned
first (``Group.plan``), its RocksDB write built from the plan, and the plan applied in memory
(``Group.apply``) only once that write succeeded, so a failed write changes nothing.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import threading
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import filterfalse, repeat

import msgspec

from scheduler.native import native
from storage.constants import (
    GROUP_PATTERN,
    META_GROUP_ACK_PREFIX,
    META_GROUP_STATE_PREFIX,
    PROP_ORIGIN_BORN_AT,
    PROP_ORIGIN_MESSAGE_ID,
    PROP_ORIGIN_OFFSET,
    PROP_RECONSUME_TIME,
    TOPIC_DLQ_PREFIX,
    TOPIC_RETRY_PREFIX,
)
from storage.errors import InvalidArgument, NotFound
from storage.keys import SEP
from storage.records import LogRecord

RECEIPTS_MAX = 1000
KEPT_RECEIPTS = 2_000  # receipts a group keeps as issued (~90 bytes each), for the usual ack
MAIN, RETRY = 0, 1  # the streams of a group
INTERNAL_PROPERTIES = frozenset({PROP_ORIGIN_MESSAGE_ID, PROP_RECONSUME_TIME,
                                 PROP_ORIGIN_OFFSET, PROP_ORIGIN_BORN_AT})

# A receipt is text: "4" (version), the stream (0/1), the lease id in hex, ".", a tag, ".",
# the offset in hex. The tag is 8 bytes of a keyed BLAKE2s under the lease's key, itself an
# HMAC-SHA256 under a key the server keeps in RocksDB (scheduler/groups.py) over topic, group,
# version, stream and lease id (``Seal``): a receipt cannot be forged or altered, nor used in
# another group or topic. Version 4: offsets 4q .. 4q + 3 share one BLAKE2s-256 of q in hex,
# offset o's tag is its quarter o & 3 (one compression per four receipts: a receive of 1000
# seals 250 blocks). Version 3 (BLAKE2s-64 of the offset in hex, before the members work of
# issue 35) is still verified, so receipts issued before an upgrade stay valid; versions 1
# (an unkeyed tag over the lease only) and 2 (an HMAC-SHA256 per receipt) are well-formed
# but never valid.
_RECEIPT_VERSION = "4"
_SEALED_VERSIONS = ("3", "4")  # the versions whose tags are verified
_TAG = 8  # bytes of tag (16 hex digits in _RECEIPT)
_QUAD = 4  # offsets per BLAKE2s-256 digest (version 4): 32 bytes = four tags of _TAG
_RECEIPT = r"([1234][01][0-9a-f]{1,16})\.([0-9a-f]{12}|[0-9a-f]{16})\.(0|[1-9a-f][0-9a-f]{0,15})\n"
_RECEIPTS = re.compile(_RECEIPT)  # one receipt, then "\n": (head, tag, offset in hex)
_ALL_RECEIPTS = re.compile(f"(?:{_RECEIPT})+")
_OFFSETS = re.compile(r"(?:(?:0|[1-9a-f][0-9a-f]{0,15})\n)+")


# (receipt_offsets: the offsets of receipts that share one prefix, in C; receipts of version 1
# had their offset last behind a prefix per lease. Kept for scheduler/_native.pyx's tests.)
def receipt_offsets_py(receipts: Sequence[str], prefix: str) -> list[int] | None:
    """The offsets of receipts that all start with ``prefix`` (a lease's), each followed by
    an offset in hex as receipts write it; None when one is otherwise."""
    if sum(map(str.startswith, receipts, repeat(prefix))) != len(receipts):
        return None
    hexes = [r[len(prefix):] for r in receipts]
    joined = "\n".join(hexes) + "\n"
    if joined.count("\n") != len(hexes) or not _OFFSETS.fullmatch(joined):
        return None
    return list(map(int, hexes, repeat(16)))


def _receipt_offsets_native(receipts: Sequence[str], prefix: str) -> list[int] | None:
    """The same in C (scheduler/_native.pyx) for a list of str."""
    assert native is not None
    if type(receipts) is not list:
        receipts = list(receipts)
    offsets: list[int] | None = native.receipt_offsets(receipts, prefix)
    return offsets


receipt_offsets = receipt_offsets_py if native is None else _receipt_offsets_native


def same_receipts_py(given: Sequence[object], issued: Sequence[str]) -> bool:
    """Whether ``given`` is exactly ``issued`` (receipts), in order, compared in a time that
    does not depend on where they differ (their tags are secret)."""
    texts = [g for g in given if isinstance(g, str)]
    if len(texts) != len(given) or len(given) != len(issued):
        return False
    try:
        return list(map(len, texts)) == list(map(len, issued)) and hmac.compare_digest(
            "\n".join(texts).encode(), "\n".join(issued).encode())
    except UnicodeEncodeError:  # (a lone surrogate: no receipt)
        return False


def _same_receipts_native(given: Sequence[object], issued: Sequence[str]) -> bool:
    """The same in C (scheduler/_native.pyx), eight bytes at a time and without a join."""
    assert native is not None
    if type(given) is not list:
        given = list(given)
    if type(issued) is not list:
        issued = list(issued)
    same: bool | None = native.same_receipts(given, issued)
    return same_receipts_py(given, issued) if same is None else same


same_receipts = same_receipts_py if native is None else _same_receipts_native


class Seal:
    """The tags of a group's receipts. Per lease (one receive), a key: HMAC-SHA256 (RFC 2104)
    under the server's receipt key of "topic NUL group NUL" + the receipts' head (version,
    stream, lease id); per receipt, 8 bytes of a BLAKE2s (RFC 7693) keyed with it: version 4,
    the quarter ``o & 3`` of the 32-byte digest of ``o >> 2`` in hex (four receipts per
    compression); version 3 (still verified), the 8-byte digest of the offset in hex. In C
    (scheduler/_native.pyx; its twin copies hashlib's keyed state per digest). One HMAC per
    receive, not one per receipt: a receive of 1000 seals in ~0.07 ms (C; version 3 took
    ~0.2)."""


    __slots__ = ("_key", "_prefix")

    def __init__(self, key: bytes, topic: str, group: str) -> None:
        self._key = key
        self._prefix = f"{topic}\0{group}\0"

    def lease_key(self, head: str) -> bytes:
        """The key of lease ``head``'s tags (never shown: only tags under it are)."""
        return hmac.digest(self._key, f"{self._prefix}{head}".encode(), "sha256")

    def receipts(self, head: str, offsets: Sequence[int]) -> list[str]:
        """The receipts of lease ``head`` (version 4) at ``offsets``: head.tag.offset in
        hex (the tags in C when it is built: scheduler/_native.pyx ``seal_receipts4``)."""
        if native is not None:
            return list(native.seal_receipts4(self.lease_key(head), head, list(offsets)))
        return self.receipts_py(head, offsets)

    def receipts_py(self, head: str, offsets: Sequence[int]) -> list[str]:
        """``receipts`` in Python."""
        return [f"{head}.{tag}.{offset:x}"
                for offset, tag in zip(offsets, self._tags4_py(head, offsets), strict=True)]

    def _tags4_py(self, head: str, offsets: Iterable[int]) -> Iterator[str]:
        """Version 4 tags in Python: hashlib's keyed state copied per digest, one digest per
        four offsets of one quad in a row."""
        copy = hashlib.blake2s(key=self.lease_key(head), digest_size=_TAG * _QUAD).copy
        quad, digest = -1, ""
        for offset in offsets:
            if offset >> 2 != quad:
                quad = offset >> 2
                m = copy()
                m.update(f"{quad:x}".encode())
                digest = m.hexdigest()
            at = 2 * _TAG * (offset & 3)
            yield digest[at:at + 2 * _TAG]

    def tags(self, head: str, offsets: Sequence[str]) -> list[str]:
        """The tag of each receipt of lease ``head`` at ``offsets`` (hex, as a parsed receipt
        holds them), of the head's version: 4, else 3 (in C when it is built:
        ``seal_tags4``, ``seal_tags``)."""
        if native is not None:
            if head[:1] == _RECEIPT_VERSION:
                return list(native.seal_tags4(self.lease_key(head), list(offsets)))
            return list(native.seal_tags(self.lease_key(head), list(offsets)))
        return self.tags_py(head, offsets)

    def tags_py(self, head: str, offsets: Sequence[str]) -> list[str]:
        """``tags`` in Python."""
        if head[:1] == _RECEIPT_VERSION:
            return list(self._tags4_py(head, (int(hexed, 16) for hexed in offsets)))
        copy = hashlib.blake2s(key=self.lease_key(head), digest_size=_TAG).copy
        out: list[str] = []
        append = out.append
        for offset in "\n".join(offsets).encode().split(b"\n") if offsets else ():
            m = copy()
            m.update(offset)
            append(m.hexdigest())
        return out


def parse_receipts(receipts: Sequence[str]) -> list[tuple[str, str, str]]:
    """(head, tag, offset in hex) of each receipt; InvalidArgument when there are none,
    too many, or one is not shaped as a receipt."""
    if not receipts:
        raise InvalidArgument("receipts must not be empty")
    if len(receipts) > RECEIPTS_MAX:
        raise InvalidArgument(f"at most {RECEIPTS_MAX} receipts per request")
    bad = next((r for r in receipts if not isinstance(r, str)), None)
    joined = "" if bad is not None else "\n".join(receipts) + "\n"
    found = _RECEIPTS.findall(joined) if _ALL_RECEIPTS.fullmatch(joined) else []
    if len(found) != len(receipts):
        bad = next((r for r in receipts
                    if not isinstance(r, str) or not _RECEIPTS.fullmatch(r + "\n")),
                   receipts[0])
        raise InvalidArgument(f"{bad!r} is not a receipt")
    return found


def check_group(group: object) -> str:
    if not isinstance(group, str) or not GROUP_PATTERN.fullmatch(group):
        raise InvalidArgument(f"group {group!r} does not match {GROUP_PATTERN.pattern}")
    return group


def _digest(topic: str, group: str) -> str:
    return hashlib.blake2b(f"{topic}\0{group}".encode(), digest_size=16).hexdigest()


def retry_topic(topic: str, group: str) -> str:
    """The group's retry topic (a system topic: nobody can send to it)."""
    return TOPIC_RETRY_PREFIX + _digest(topic, group)


def dlq_topic(topic: str, group: str) -> str:
    """The group's dead-letter topic."""
    return TOPIC_DLQ_PREFIX + _digest(topic, group)


@dataclass(slots=True)
class AckPlan:
    """What an ack (or the ack half of a nack) changes: built first, applied in memory
    only once its RocksDB write succeeded."""

    accepted: tuple[Collection[int], Collection[int]] = field(
        default_factory=lambda: (set(), set()))
    # offsets taken, per stream (MAIN, RETRY): a set, or (the usual ack, a whole lease of
    # consecutive offsets) a range, read without a set of 1000 made and searched for its ends
    stale: list[str] = field(default_factory=list)
    committed: dict[int, int] = field(default_factory=dict)  # stream -> new committed offset
    # stream -> the runs of acks stored above the committed offset: [(first, end), ...]
    runs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    highest: dict[int, int] = field(default_factory=dict)  # stream -> its highest taken
    # the usual ack: the receipts of one whole lease that holds all of them, as issued
    # (``accepted`` is then its offsets; ``apply`` ends it whole)
    whole: Lease | None = None

    @property
    def taken(self) -> int:
        return len(self.accepted[MAIN]) + len(self.accepted[RETRY])


class Lease:
    """The messages one receive leased in one stream, until ``until``: a stream maps each
    offset it holds to its lease, ``offsets`` in increasing order (a receive reads them in
    order). ``held``: how many it still holds; ``counts``: delivery counts above 1 (messages
    handed out again after a lease expired)."""

    __slots__ = ("counts", "head", "held", "kind", "lease_id", "offsets", "receipts", "until")

    def __init__(self, lease_id: int, until: int, kind: int, offsets: list[int],
                 counts: dict[int, int]) -> None:
        self.lease_id = lease_id
        self.until = until
        self.kind = kind
        self.offsets = offsets
        self.counts = counts
        self.held = len(offsets)
        self.head = f"{_RECEIPT_VERSION}{kind}{lease_id:x}"  # its receipts' first part
        self.receipts: list[str] = []  # as issued, in the order of ``offsets``

    def count(self, offset: int) -> int:
        """The delivery count of ``offset`` under this lease."""
        return self.counts.get(offset, 1) if self.counts else 1


class Stream:
    """One log a group consumes. Offsets below ``committed`` are acknowledged, and so are
    those in ``acked``; ``runs``: how RocksDB holds ``acked``, one key per run of
    consecutive offsets (first -> end); ``handed``: every offset below it was handed out (or
    acked) since the group was loaded; ``returned``: a heap of offsets whose lease expired,
    to hand out again (with their delivery count in ``counts``)."""

    __slots__ = ("acked", "committed", "counts", "handed", "leases", "log_topic", "returned",
                 "runs")

    def __init__(self, log_topic: str, committed: int, runs: dict[int, int]) -> None:
        self.log_topic = log_topic
        self.committed = committed
        self.runs = runs
        self.acked = {o for first, end in runs.items() for o in range(first, end)}
        self.handed = committed
        self.leases: dict[int, Lease] = {}  # offset -> the lease holding it
        self.returned: list[int] = []
        self.counts: dict[int, int] = {}

    def take(self, n: int, end: int, window: int) -> tuple[list[int], dict[int, int]]:
        """Up to ``n`` offsets to lease, and the delivery counts above 1 among them: expired
        ones first, then new ones below ``end`` and below ``committed + window``."""
        out: list[int] = []
        again: dict[int, int] = {}
        returned, counts = self.returned, self.counts
        while returned and len(out) < n:
            offset = heapq.heappop(returned)
            count = counts.pop(offset, 0)
            if offset >= self.committed and offset not in self.acked \
                    and offset not in self.leases:
                out.append(offset)
                again[offset] = count + 1
        cap = min(end, self.committed + window)
        while self.handed < cap and len(out) < n:
            limit = min(cap, self.handed + n - len(out))
            fresh = range(self.handed, limit)
            self.handed = limit
            # (leases are all below ``handed``; acks may be above it after a restart)
            out.extend(filterfalse(self.acked.__contains__, fresh) if self.acked else fresh)
        return out, again

    def hand_back(self, offset: int, lease: Lease) -> None:
        """``lease`` no longer holds ``offset``, which is handed out again later."""
        del self.leases[offset]
        lease.held -= 1
        self.counts[offset] = lease.count(offset)
        heapq.heappush(self.returned, offset)

    def drop_leases(self) -> None:
        """Every lease ends now (an offset commit): the messages are handed out again."""
        for offset, lease in list(self.leases.items()):
            self.hand_back(offset, lease)


@dataclass(slots=True, kw_only=True)
class Group:
    """One consumer group of one topic: its two streams (MAIN: the topic's log, RETRY: its
    retry topic's), its dead-letter cursor and retry count, its leases by expiry."""

    topic: str
    group: str
    streams: tuple[Stream, Stream]
    dlq_topic: str
    dlq_cursor: int
    retrying: int
    registered: bool
    seal: Seal  # the receipt tags of this (topic, group)
    label: str  # the group's label value in /metrics ("topic/group", or OTHER past the cap)
    lock: threading.Lock = field(default_factory=threading.Lock)
    expiry: list[tuple[int, int, Lease]] = field(default_factory=list)
    issued: dict[str, Lease] = field(default_factory=dict)  # head -> a lease that holds
    # and has not expired, with its receipts kept (dropped when it holds nothing, expires,
    # or ``expiry`` is compacted); ``kept``: their receipts, at most KEPT_RECEIPTS
    kept: int = 0
    # (until, lease id, lease), one per receive (dropped lazily once it holds nothing)
    expiry_limit: int = 64  # compact ``expiry`` when it grows past this
    redelivered: int = 0  # leases that expired (their messages are handed out again)
    quick: float = 0.0  # quick retries the group may still make now (a token bucket) ...
    quick_at: int = 0  # ... as of this time (ms of the engine clock)

    @property
    def name(self) -> str:
        """The group's label in metrics and stats."""
        return f"{self.topic}/{self.group}"

    @property
    def leased(self) -> int:
        return sum(len(s.leases) for s in self.streams)

    def expire(self, now: int) -> int:
        """End the leases due by ``now`` (their messages are handed out again); returns how
        many messages that handed back."""
        expiry = self.expiry
        expired = 0
        while expiry and expiry[0][0] <= now:
            lease = heapq.heappop(expiry)[2]
            self.forget(lease)
            if not lease.held:
                continue
            stream = self.streams[lease.kind]
            for offset in lease.offsets:
                if stream.leases.get(offset) is lease:
                    stream.hand_back(offset, lease)
                    expired += 1
        self.redelivered += expired
        return expired

    def issue(self, lease: Lease) -> list[str]:
        """The receipts of ``lease``'s offsets (kept with it while it holds: an ack of
        exactly them, the usual one, is checked against them, not re-sealed)."""
        out = self.seal.receipts(lease.head, lease.offsets)
        if self.kept + len(out) <= KEPT_RECEIPTS:
            lease.receipts = out
            self.issued[lease.head] = lease
            self.kept += len(out)
        return out

    def forget(self, lease: Lease) -> None:
        """Stop keeping ``lease``'s receipts (an ack of them is sealed again)."""
        if self.issued.pop(lease.head, None) is not None:
            self.kept -= len(lease.receipts)

    def decode(self, receipts: Sequence[str]
                ) -> tuple[list[int], list[int], list[int]]:
        """The stream, offset and lease id of each receipt, as three columns; InvalidArgument
        for one that is not shaped as a receipt, NotFound for one this server did not issue
        to this group of this topic (forged, altered, of another group or topic). Nothing
        changes on either."""
        lease = self.issued.get(receipts[0].partition(".")[0]) if receipts and isinstance(
            receipts[0], str) else None
        # the usual ack: the receipts of one receive, as issued (its offsets as the lease
        # keeps them: ``plan`` knows them by that); the lengths first, as a part's differ
        if lease is not None and len(receipts) == len(lease.receipts) and same_receipts(
                receipts, lease.receipts):
            n = len(receipts)
            return [lease.kind] * n, lease.offsets, [lease.lease_id] * n
        found = parse_receipts(receipts)
        n = len(found)
        heads, tags, hexes = map(list, zip(*found, strict=True))
        head = heads[0]
        if heads.count(head) == n:  # receipts of one lease (a part of it, or reordered)
            expected = self.seal.tags(head, hexes)
            given = tags if head[0] in _SEALED_VERSIONS else []
            kinds, lease_ids = [int(head[1])] * n, [int(head[2:], 16)] * n
        else:
            by_head: dict[str, list[int]] = {}  # head -> indexes of its receipts
            for i, head in enumerate(heads):
                by_head.setdefault(head, []).append(i)
            expected = [""] * n
            for head, at in by_head.items():
                for i, tag in zip(at, self.seal.tags(head, [hexes[i] for i in at]), strict=True):
                    expected[i] = tag
            given = [tag if head[0] in _SEALED_VERSIONS else "" for head, tag in zip(
                heads, tags, strict=True)]
            kinds = [int(head[1]) for head in heads]
            lease_ids = [int(head[2:], 16) for head in heads]
        if not hmac.compare_digest("".join(expected), "".join(given)):
            raise NotFound(f"a receipt is not one of group {self.group!r} of topic "
                           f"{self.topic!r}: unknown, altered, or of another group or topic")
        return kinds, list(map(int, hexes, repeat(16))), lease_ids

    def plan(self, receipts: Sequence[str],
             decoded: tuple[list[int], list[int], list[int]],
             ends: tuple[int, int], window: int) -> AckPlan:
        """Accepted: the receipt's lease still holds, or nobody holds the message and it is
        not acknowledged (a lease that expired, or one from before a restart). Stale: the
        message was leased again, or is acknowledged already (also by an earlier receipt of
        the same request), or (a receipt from before an offset commit moved the group back)
        lies at or past its log's end (``ends``, per stream) or past the committed offset +
        ``window``: no ack key is ever stored beyond them."""
        plan = AckPlan()
        streams = self.streams
        seen: tuple[set[int], set[int]] = (set(), set())
        plan.accepted = seen
        kinds, offsets, lease_ids = decoded
        n = len(offsets)
        if kinds.count(kinds[0]) == n and lease_ids.count(lease_ids[0]) == n:
            # the usual ack: receipts of one lease that still holds all of them (C passes)
            stream = streams[kinds[0]]
            lease = stream.leases.get(offsets[0])
            if lease is not None and lease.lease_id == lease_ids[0] and (
                    offsets is lease.offsets and lease.held == n):
                # a whole lease's receipts as issued (``decode``), every one still held by
                # it (``held`` counts the offsets the stream maps to it); its offsets
                # increase (a receive reads them in order)
                if offsets[-1] - offsets[0] + 1 == n:  # consecutive: a range
                    run = range(offsets[0], offsets[-1] + 1)
                    plan.accepted = (run, set()) if kinds[0] == MAIN else (set(), run)
                else:
                    seen[kinds[0]].update(offsets)
                plan.whole = lease
                self._advance(plan)
                return plan
            if lease is not None and lease.lease_id == lease_ids[0] and list(
                    map(stream.leases.get, offsets)).count(lease) == n:
                taken = set(offsets)
                if len(taken) == n:
                    seen[kinds[0]].update(taken)
                    self._advance(plan)
                    return plan
        for receipt, kind, offset, lease_id in zip(receipts, kinds, offsets, lease_ids,
                                                   strict=True):
            stream = streams[kind]
            held = stream.leases.get(offset)
            if held is None:  # not leased: taken unless acknowledged already
                if offset < stream.committed or offset in stream.acked \
                        or offset in seen[kind] or offset >= ends[kind] \
                        or offset >= stream.committed + window:
                    plan.stale.append(receipt)
                    continue
            elif held.lease_id != lease_id or offset in seen[kind]:
                plan.stale.append(receipt)
                continue
            seen[kind].add(offset)
        self._advance(plan)
        return plan

    def _advance(self, plan: AckPlan) -> None:
        """Where each stream's committed offset moves once the plan's offsets are acked (and
        the highest offset it takes in each)."""
        for kind, stream in enumerate(self.streams):
            taken, acked = plan.accepted[kind], stream.acked
            committed = stream.committed
            if isinstance(taken, range):
                lo, hi = taken.start, taken.stop - 1
                plan.highest[kind] = hi
                if lo == committed:
                    committed = taken.stop  # a run from the committed offset (usual ack)
            elif taken:
                lo = min(taken)
                hi = plan.highest[kind] = max(taken)
                if lo == committed and hi - committed + 1 == len(taken):
                    committed += len(taken)  # a run from the committed offset (usual ack)
            while committed in taken or committed in acked:
                committed += 1
            if committed != stream.committed:
                plan.committed[kind] = committed

    def apply(self, plan: AckPlan, retrying: int) -> None:
        """Apply ``plan`` (and the retry count) in memory, once it is durable."""
        for kind, stream in enumerate(self.streams):
            taken = plan.accepted[kind]
            if not taken:
                continue
            whole = plan.whole
            if whole is not None and whole.kind == kind:  # one lease, whole: it ends
                leases = stream.leases
                for offset in whole.offsets:
                    del leases[offset]
                whole.held = 0
                self.forget(whole)
            else:
                for lease, n in Counter(map(stream.leases.pop, taken, repeat(None))).items():
                    if lease is not None:
                        lease.held -= n
                        if not lease.held:
                            self.forget(lease)
            if stream.counts:
                for offset in taken:
                    stream.counts.pop(offset, None)
            committed = plan.committed.get(kind, stream.committed)
            if plan.highest[kind] >= committed:
                stream.acked.update(o for o in taken if o >= committed)
            if committed != stream.committed:
                if stream.acked:
                    stream.acked.difference_update(range(stream.committed, committed))
                if stream.runs:  # (a run is acked whole: below the new offset, or above it)
                    stream.runs = {first: end for first, end in stream.runs.items()
                                   if first >= committed}
                stream.committed = committed
                stream.handed = max(stream.handed, committed)
            stream.runs.update(plan.runs.get(kind, ()))
        self.retrying = retrying
        self.registered = True


def as_original(topic: str, record: LogRecord) -> tuple[LogRecord, int]:
    """A retry or dead letter as its topic knows it, and its reconsumeTimes."""
    props = record.properties
    try:
        reconsumed = int(props[PROP_RECONSUME_TIME])
        shown = msgspec.structs.replace(
            record, topic=topic, msg_id=props[PROP_ORIGIN_MESSAGE_ID],
            queue_offset=int(props[PROP_ORIGIN_OFFSET]),
            born_at=int(props[PROP_ORIGIN_BORN_AT]),
            properties=_user_properties(props))
    except (KeyError, ValueError):  # not written by this module: shown as it is
        return record, 0
    return shown, reconsumed


def _user_properties(props: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in props.items() if k not in INTERNAL_PROPERTIES}


def ack_runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted ``offsets`` as runs of consecutive ones: [(first, end), ...], end exclusive."""
    if offsets[-1] - offsets[0] == len(offsets) - 1:  # the usual ack: one lease, in order
        return [(offsets[0], offsets[-1] + 1)]
    runs: list[tuple[int, int]] = []
    first = prev = offsets[0]
    for offset in offsets[1:]:
        if offset != prev + 1:
            runs.append((first, prev + 1))
            first = offset
        prev = offset
    runs.append((first, prev + 1))
    return runs


def ack_prefix(log_topic: str, group: str) -> bytes:
    return META_GROUP_ACK_PREFIX + log_topic.encode() + SEP + group.encode() + SEP


def state_key(topic: str, group: str) -> bytes:
    return META_GROUP_STATE_PREFIX + topic.encode() + SEP + group.encode()


__all__ = ["MAIN", "RECEIPTS_MAX", "RETRY", "AckPlan", "Group", "Lease", "Stream", "ack_prefix",
           "ack_runs", "as_original", "check_group", "dlq_topic", "retry_topic",
           "state_key"]
