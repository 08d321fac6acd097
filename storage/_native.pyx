# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Compiled twins of storage's per-record loops: CRC32C, CommitLog framing and record reads,
a LogRecord's head, a WriteBatch's entries in key order.

Built from source by pip (setup.py) when a C compiler is there; storage/native.py picks
these or the pure-Python functions (storage/log_format.py, storage/commitlog.py,
storage/records.py, storage/batch.py), and tests/storage/test_native.py checks that both
give the same bytes. What it does not recognise exactly it leaves to the Python path
(``None``), which then decodes with every check and raises where it must. The other layers'
loops are in scheduler/_native.pyx and api/_native.pyx; the msgpack helpers all three share
are in storage/_msgpack.pxd.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsUnsignedLongLong
from libc.stdint cimport uint8_t, uint32_t
from libc.string cimport memcmp, memcpy

from storage._msgpack cimport Item, _body_tags_keys, _int, _str, _str_map

# --- CRC32C (Castagnoli), slicing by 8: the crc32c package's value, same seed convention --
cdef uint32_t _T[8][256]


cdef void _init_table() noexcept:
    cdef uint32_t c, i, k
    for i in range(256):
        c = i
        for k in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        _T[0][i] = c
    for i in range(256):
        c = _T[0][i]
        for k in range(1, 8):
            c = _T[0][c & 0xFF] ^ (c >> 8)
            _T[k][i] = c


_init_table()


# SSE4.2's crc32 instruction computes the same CRC (the same reflected polynomial) 8 bytes
# at a time: ~6x the tables' speed on a record of 200 bytes, which every append frames and
# every read checks. Used when the CPU has it (asked once, at import), else the tables.
#
# One instruction waits for the one before (3 cycles each), so a long buffer is read in
# three lanes of HG_LANE bytes at once, each its own register (the first from the running
# CRC, the others from 0), joined after each stretch: the register is linear, and the CRC
# of A then B is Z(crc(A)) ^ crc(B), Z the register's change over HG_LANE zero bytes, a
# linear map kept as four tables of a byte each (made at import from Z of the 32 bits).
# A 16 KiB body's CRC is taken twice a delivery (framed, read back by the stream).
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #define HG_LANE 512
    static uint32_t hg_zeros[4][256];  /* Z: the register after HG_LANE zero bytes */

    static void hg_crc32c_lanes_init(void) {
        uint32_t basis[32], x, v;
        int i, k, b;
        Py_ssize_t bit;
        for (i = 0; i < 32; i++) {
            x = (uint32_t)1 << i;
            for (bit = 0; bit < 8 * HG_LANE; bit++)
                x = (x >> 1) ^ ((x & 1) ? 0x82F63B78u : 0u);
            basis[i] = x;
        }
        for (k = 0; k < 4; k++)
            for (b = 0; b < 256; b++) {
                v = 0;
                for (i = 0; i < 8; i++)
                    if (b & (1 << i))
                        v ^= basis[8 * k + i];
                hg_zeros[k][b] = v;
            }
    }

    static inline uint32_t hg_after_zeros(uint32_t x) {
        return hg_zeros[0][x & 0xFF] ^ hg_zeros[1][(x >> 8) & 0xFF]
            ^ hg_zeros[2][(x >> 16) & 0xFF] ^ hg_zeros[3][x >> 24];
    }

    #if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
    __attribute__((target("sse4.2")))
    static uint32_t hg_crc32c_hw(uint32_t c, const uint8_t* p, Py_ssize_t n) {
        uint64_t c64 = c, v, a, b, d, va, vb, vd;
        Py_ssize_t k;
        while (n >= 3 * HG_LANE) {
            a = c64;
            b = 0;
            d = 0;
            for (k = 0; k < HG_LANE; k += 8) {
                memcpy(&va, p + k, 8);
                memcpy(&vb, p + HG_LANE + k, 8);
                memcpy(&vd, p + 2 * HG_LANE + k, 8);
                a = __builtin_ia32_crc32di(a, va);
                b = __builtin_ia32_crc32di(b, vb);
                d = __builtin_ia32_crc32di(d, vd);
            }
            c64 = hg_after_zeros(hg_after_zeros((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)d;
            p += 3 * HG_LANE;
            n -= 3 * HG_LANE;
        }
        while (n >= 8) {
            memcpy(&v, p, 8);
            c64 = __builtin_ia32_crc32di(c64, v);
            p += 8;
            n -= 8;
        }
        c = (uint32_t)c64;
        while (n > 0) {
            c = __builtin_ia32_crc32qi(c, *p);
            p++;
            n--;
        }
        return c;
    }
    static int hg_crc32c_hw_supported(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("sse4.2");
    }
    #else
    static uint32_t hg_crc32c_hw(uint32_t c, const uint8_t* p, Py_ssize_t n) { return c; }
    static int hg_crc32c_hw_supported(void) { return 0; }
    #endif
    """
    uint32_t hg_crc32c_hw(uint32_t c, const uint8_t* p, Py_ssize_t n) nogil
    int hg_crc32c_hw_supported() nogil
    void hg_crc32c_lanes_init() nogil

hg_crc32c_lanes_init()

cdef bint _hw = hg_crc32c_hw_supported()


def crc32c_hardware(enable=None):
    """Whether CRC32C is computed by the CPU's crc32 instruction (SSE4.2). ``enable``
    False makes it use the tables from now on (tests check both give the same values);
    True uses the instruction again, where the CPU has it. Returns the state after."""
    global _hw
    if enable is not None:
        _hw = bool(enable) and hg_crc32c_hw_supported()
    return bool(_hw)


cdef inline uint32_t _crc32c(uint32_t value, const uint8_t* p, Py_ssize_t n) noexcept nogil:
    cdef uint32_t c = ~value
    cdef uint32_t lo, hi
    if _hw:
        return ~hg_crc32c_hw(c, p, n)
    while n >= 8:
        lo = c ^ (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
                  | (<uint32_t>p[3] << 24))
        hi = (<uint32_t>p[4] | (<uint32_t>p[5] << 8) | (<uint32_t>p[6] << 16)
              | (<uint32_t>p[7] << 24))
        c = (_T[7][lo & 0xFF] ^ _T[6][(lo >> 8) & 0xFF] ^ _T[5][(lo >> 16) & 0xFF]
             ^ _T[4][lo >> 24] ^ _T[3][hi & 0xFF] ^ _T[2][(hi >> 8) & 0xFF]
             ^ _T[1][(hi >> 16) & 0xFF] ^ _T[0][hi >> 24])
        p += 8
        n -= 8
    while n > 0:
        c = _T[0][(c ^ p[0]) & 0xFF] ^ (c >> 8)
        p += 1
        n -= 1
    return ~c


def crc32c(data, uint32_t value=0):
    """== crc32c.crc32c(data, value)."""
    cdef const uint8_t[::1] view = data
    if view.shape[0] == 0:
        return value
    return _crc32c(value, &view[0], view.shape[0])


# --- CommitLog framing (storage/log_format.py) ---------------------------------------------
cdef inline void _put_u32le(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = v >> 24


cdef inline uint32_t _get_u32le(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
            | (<uint32_t>p[3] << 24))


def frame(list payloads, list lengths, Py_ssize_t start, uint32_t magic, uint32_t seed):
    """== log_format.frame: the framed bytes of ``payloads`` and each record's position."""
    cdef Py_ssize_t n = PyList_GET_SIZE(payloads), i, total = 0, size
    cdef object p
    for i in range(n):
        p = <object>PyList_GET_ITEM(payloads, i)
        if type(p) is not bytes:
            raise TypeError(f"a payload is bytes, not {type(p).__name__}")
        total += 12 + PyBytes_GET_SIZE(p)
    buf = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* out = <uint8_t*>PyBytes_AS_STRING(buf)
    cdef list positions = [None] * n
    cdef Py_ssize_t at = 0
    for i in range(n):
        p = <object>PyList_GET_ITEM(payloads, i)
        size = PyBytes_GET_SIZE(p)
        _put_u32le(out + at, magic)
        _put_u32le(out + at + 4, <uint32_t>size)
        _put_u32le(out + at + 8, _crc32c(<uint32_t>size ^ seed,
                                         <const uint8_t*>PyBytes_AS_STRING(p), size))
        memcpy(out + at + 12, PyBytes_AS_STRING(p), size)
        positions[i] = start + at
        at += 12 + size
    return buf, positions


def frame_headers(list payloads, Py_ssize_t start, uint32_t magic, uint32_t seed):
    """== log_format.frame_headers_py: the 12-byte headers of ``payloads``' records, back to
    back in one buffer, and each record's position when the records are written at
    ``start``, each header followed by its payload (no copy of a payload)."""
    cdef Py_ssize_t n = PyList_GET_SIZE(payloads), i, size, at = start
    cdef object p
    for i in range(n):
        p = <object>PyList_GET_ITEM(payloads, i)
        if type(p) is not bytes:
            raise TypeError(f"a payload is bytes, not {type(p).__name__}")
    buf = PyBytes_FromStringAndSize(NULL, 12 * n)
    cdef uint8_t* out = <uint8_t*>PyBytes_AS_STRING(buf)
    cdef list positions = [None] * n
    for i in range(n):
        p = <object>PyList_GET_ITEM(payloads, i)
        size = PyBytes_GET_SIZE(p)
        _put_u32le(out + 12 * i, magic)
        _put_u32le(out + 12 * i + 4, <uint32_t>size)
        _put_u32le(out + 12 * i + 8, _crc32c(<uint32_t>size ^ seed,
                                             <const uint8_t*>PyBytes_AS_STRING(p), size))
        positions[i] = at
        at += 12 + size
    return buf, positions


# --- a consume-queue run (storage/consume_queue.py) ------------------------------------------
def cq_run(list positions, list sizes):
    """== consume_queue.cq_run_py: per entry its 8-byte big-endian position and 4-byte
    big-endian size, back to back; None unless both are lists of ints in range of the same
    length (the Python path then raises)."""
    cdef Py_ssize_t n = PyList_GET_SIZE(positions), i
    cdef int k
    cdef unsigned long long pos, size
    cdef uint8_t* q
    cdef object p, s
    if PyList_GET_SIZE(sizes) != n:
        return None
    buf = PyBytes_FromStringAndSize(NULL, 12 * n)
    cdef uint8_t* out = <uint8_t*>PyBytes_AS_STRING(buf)
    for i in range(n):
        p = <object>PyList_GET_ITEM(positions, i)
        s = <object>PyList_GET_ITEM(sizes, i)
        if type(p) is not int or type(s) is not int:
            return None
        try:
            pos = PyLong_AsUnsignedLongLong(p)
            size = PyLong_AsUnsignedLongLong(s)
        except OverflowError:  # negative, or past 64 bits
            return None
        if size >> 32:
            return None
        q = out + 12 * i
        for k in range(8):
            q[k] = (pos >> (56 - 8 * k)) & 0xFF
        q[8] = (size >> 24) & 0xFF
        q[9] = (size >> 16) & 0xFF
        q[10] = (size >> 8) & 0xFF
        q[11] = size & 0xFF
    return buf


def read_records(mm, Py_ssize_t base, Py_ssize_t hi, list positions, Py_ssize_t index,
                 list out, Py_ssize_t room, uint32_t magic, uint32_t seed):
    """The loop of CommitLog.read_many over the positions in one segment [base, hi) from
    ``index`` on: appends each checked payload to ``out`` while it fits ``room``. Returns
    (next index, room left, status): status 0 = went on as far as it could (the next
    position is in another segment, or there is none), 1 = ``room`` is used up, 2 = no record
    at positions[next index], 3 = bad length or CRC32C there."""
    cdef const uint8_t[::1] view = mm
    cdef const uint8_t* data = &view[0]
    cdef Py_ssize_t size = view.shape[0]
    cdef Py_ssize_t n = PyList_GET_SIZE(positions), pos, off, length
    while index < n:
        pos = <Py_ssize_t>(<object>PyList_GET_ITEM(positions, index))
        if not base <= pos < hi:
            return index, room, 0
        off = pos - base
        if hi - pos < 12 or _get_u32le(data + off) != magic:
            return index, room, 2
        length = _get_u32le(data + off + 4)
        if length > room and PyList_GET_SIZE(out):
            return index, room, 1
        if off + 12 + length > size or _crc32c(<uint32_t>length ^ seed, data + off + 12,
                                             length) != _get_u32le(data + off + 8):
            return index, room, 3
        room -= length
        out.append(PyBytes_FromStringAndSize(<const char*>data + off + 12, length))
        index += 1
    return index, room, 0


# --- a LogRecord's head (storage/records.py) -----------------------------------------------
def record_offsets(list payloads):
    """== storage.records.log_record_offsets: the queue offset of each LogRecord payload,
    read from its head (version, topic, msgId, queue offset), or None for the whole list
    when one is not a record as written (the Python path then decodes them and raises)."""
    cdef Py_ssize_t count = PyList_GET_SIZE(payloads), k, n, i
    cdef list out = [None] * count
    cdef const uint8_t* p
    cdef Item it, qo, body, tags, keys
    for k in range(count):
        payload = <object>PyList_GET_ITEM(payloads, k)
        if type(payload) is not bytes:
            return None
        p = <const uint8_t*>PyBytes_AS_STRING(payload)
        n = PyBytes_GET_SIZE(payload)
        if n < 1 or p[0] != 0x9C:
            return None
        # the whole record is parsed (msgspec reads past the head too, and raises on a
        # damaged tail): [version, topic, msg_id, queue_offset, body, tags, keys,
        # properties, born_at, deliver_at, stored_at, flags]
        i = _int(p, n, 1, &it)
        if i >= 0:
            i = _str(p, n, i, &it)
        if i >= 0:
            i = _str(p, n, i, &it)
        if i >= 0:
            i = _int(p, n, i, &qo)
        if i >= 0:
            i = _body_tags_keys(p, n, i, &body, &tags, &keys)
        if i >= 0:
            i = _str_map(p, n, i, &it, 16)
        for _ in range(4):
            if i >= 0:
                i = _int(p, n, i, &it)
        if i != n:
            return None
        out[k] = qo.value
    return out


# --- a WriteBatch's entries in key order -----------------------------------------------------
from cpython.bytes cimport PyBytes_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport uint64_t


cdef struct _KeyRef:
    uint64_t k8  # the 8 bytes after the keys' common prefix, big-endian (0-padded)
    const char* p
    Py_ssize_t n
    Py_ssize_t i


cdef inline int _key_order(const _KeyRef* x, const _KeyRef* y, Py_ssize_t common) noexcept nogil:
    """bytes order (a prefix first), then list order: what sorted() gives, stably. Every key
    starts with the same ``common`` bytes, so their next 8 decide most comparisons (a short
    key's are 0-padded: equal ones then compare in full)."""
    if x.k8 != y.k8:
        return -1 if x.k8 < y.k8 else 1
    cdef Py_ssize_t m = x.n if x.n < y.n else y.n
    cdef int c = memcmp(x.p + common, y.p + common, <size_t>(m - common))
    if c != 0:
        return c
    if x.n != y.n:
        return -1 if x.n < y.n else 1
    return -1 if x.i < y.i else (1 if x.i > y.i else 0)


cdef enum:
    _RUN = 16  # insertion-sorted runs, then merged


cdef void _sort_refs(_KeyRef* a, _KeyRef* tmp, Py_ssize_t n, Py_ssize_t common) noexcept nogil:
    """Merge sort of ``a`` by ``_key_order`` (``tmp``: room for n), inlined comparisons: a
    send batch's 1000 keys due at random, sorted and put with no-op puts, 48 µs against 89
    with libc's qsort calling a comparator through a pointer; runs already in order cost one
    comparison each."""
    cdef Py_ssize_t s, e, i, j, k, mid, width
    cdef _KeyRef t
    cdef _KeyRef* src = a
    cdef _KeyRef* dst = tmp
    cdef _KeyRef* swap
    s = 0
    while s < n:
        e = s + _RUN if s + _RUN < n else n
        for i in range(s + 1, e):
            if _key_order(&a[i - 1], &a[i], common) <= 0:
                continue
            t = a[i]
            j = i - 1
            while j >= s and _key_order(&a[j], &t, common) > 0:
                a[j + 1] = a[j]
                j -= 1
            a[j + 1] = t
        s = e
    width = _RUN
    while width < n:
        s = 0
        while s < n:
            mid = s + width if s + width < n else n
            e = s + 2 * width if s + 2 * width < n else n
            if mid >= e or _key_order(&src[mid - 1], &src[mid], common) <= 0:
                memcpy(dst + s, src + s, <size_t>(e - s) * sizeof(_KeyRef))
                s = e
                continue
            i, j, k = s, mid, s
            while i < mid and j < e:
                if _key_order(&src[j], &src[i], common) < 0:
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
                k += 1
            if i < mid:
                memcpy(dst + k, src + i, <size_t>(mid - i) * sizeof(_KeyRef))
            elif j < e:
                memcpy(dst + k, src + j, <size_t>(e - j) * sizeof(_KeyRef))
            s = e
        swap = src
        src = dst
        dst = swap
        width *= 2
    if src != a:
        memcpy(a, src, <size_t>n * sizeof(_KeyRef))


def put_sorted(put, list keys, list values, handle, bint distinct=False):
    """``put(key, value, handle)`` for each (keys[i], values[i]) in the keys' bytes order,
    equal keys in list order; returns the first key put (None: none). ``distinct``: False,
    and nothing put, when a key is there twice. The sort compares the bytes in C, and no
    (key, value) tuple is built (storage/batch.py: put_sorted_py)."""
    cdef Py_ssize_t n = PyList_GET_SIZE(keys), i, j, common, m
    cdef const uint8_t* q
    cdef uint64_t k8
    if PyList_GET_SIZE(values) != n:
        raise ValueError(f"{n} keys but {PyList_GET_SIZE(values)} values")
    if n == 0:
        return None
    cdef _KeyRef* refs = <_KeyRef*>PyMem_Malloc(2 * n * sizeof(_KeyRef))
    if refs == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            key = <object>PyList_GET_ITEM(keys, i)
            if not PyBytes_CheckExact(key):
                raise TypeError(f"a key must be bytes, not {type(key).__name__}")
            refs[i].p = PyBytes_AS_STRING(key)
            refs[i].n = PyBytes_GET_SIZE(key)
            refs[i].i = i
        common = refs[0].n  # the bytes every key starts with (a timer CF's: the time's top)
        for i in range(1, n):
            m = common if common < refs[i].n else refs[i].n
            if m == common and memcmp(refs[0].p, refs[i].p, <size_t>m) == 0:
                continue
            j = 0
            while j < m and refs[0].p[j] == refs[i].p[j]:
                j += 1
            common = j
        for i in range(n):
            q = <const uint8_t*>refs[i].p + common
            m = refs[i].n - common
            k8 = 0
            for j in range(8):
                k8 = (k8 << 8) | (q[j] if j < m else 0)
            refs[i].k8 = k8
        _sort_refs(refs, refs + n, n, common)  # (no Python runs meanwhile)
        if distinct:
            for i in range(1, n):
                if (refs[i].n == refs[i - 1].n
                        and memcmp(refs[i].p, refs[i - 1].p, <size_t>refs[i].n) == 0):
                    return False
        for i in range(n):
            j = refs[i].i
            if PyList_GET_SIZE(keys) != n or PyList_GET_SIZE(values) != n:
                raise RuntimeError("the keys or values changed size while being put")
            put(<object>PyList_GET_ITEM(keys, j), <object>PyList_GET_ITEM(values, j), handle)
        return <object>PyList_GET_ITEM(keys, refs[0].i)
    finally:
        PyMem_Free(refs)
