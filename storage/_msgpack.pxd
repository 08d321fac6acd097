# cython: language_level=3
"""msgpack as msgspec writes it, read and written in C: the helpers the compiled modules share
(storage/_native.pyx, scheduler/_native.pyx, api/_native.pyx ``cimport`` them from here; each
is ``cdef inline``, so no module imports another at run time).

Reading accepts only the canonical form (the shortest header, as msgspec writes it); what it
does not recognise exactly it reports (-1, K_BAD), and the caller leaves that item to its
pure-Python twin, which decodes it with every check.
"""

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy


# --- reading -------------------------------------------------------------------------------
cdef inline bint _same(const uint8_t* a, const uint8_t* b, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(n):
        if a[k] != b[k]:
            return False
    return True


cdef enum Kind:
    K_BAD = 0
    K_NIL
    K_INT
    K_STR
    K_BIN
    K_ARRAY
    K_MAP
    K_OTHER


cdef struct Item:
    Kind kind
    Py_ssize_t start  # first byte of the element (its header)
    Py_ssize_t data  # first byte of its content (str/bin bytes)
    Py_ssize_t size  # str/bin: byte length; array/map: element count
    int64_t value  # int


cdef inline int _be(const uint8_t* p, int n, uint64_t* out) noexcept nogil:
    cdef uint64_t v = 0
    cdef int k
    for k in range(n):
        v = (v << 8) | p[k]
    out[0] = v
    return 0


cdef inline int _head(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* it) noexcept nogil:
    """Parse the header at ``i``: ``it`` gets its kind and sizes; returns the index past
    the header (past the whole element for nil and ints), or -1. Only the canonical form
    (the shortest, as msgspec writes it) is accepted; anything else is K_BAD."""
    cdef uint8_t b
    cdef uint64_t u
    cdef int w
    if i >= n:
        return -1
    b = p[i]
    it.start = i
    it.kind = K_BAD
    if b <= 0x7F:
        it.kind = K_INT
        it.value = b
        return i + 1
    if b >= 0xE0:
        it.kind = K_INT
        it.value = <int64_t>b - 256
        return i + 1
    if 0xA0 <= b <= 0xBF:
        it.kind = K_STR
        it.size = b & 0x1F
        it.data = i + 1
        return i + 1
    if 0x90 <= b <= 0x9F:
        it.kind = K_ARRAY
        it.size = b & 0x0F
        return i + 1
    if 0x80 <= b <= 0x8F:
        it.kind = K_MAP
        it.size = b & 0x0F
        return i + 1
    if b == 0xC0:
        it.kind = K_NIL
        return i + 1
    if 0xCC <= b <= 0xCF:  # uint 8/16/32/64
        w = 1 << (b - 0xCC)
        if i + 1 + w > n:
            return -1
        _be(p + i + 1, w, &u)
        if (w == 1 and u < 0x80) or (w == 2 and u < 0x100) or (w == 4 and u < 0x10000) or (
                w == 8 and (u < 0x100000000ULL or u > 0x7FFFFFFFFFFFFFFFULL)):
            return -1  # not the shortest form, or past int64 (the Python path takes it)
        it.kind = K_INT
        it.value = <int64_t>u
        return i + 1 + w
    if 0xD0 <= b <= 0xD3:  # int 8/16/32/64 (negative values only, in canonical form)
        w = 1 << (b - 0xD0)
        if i + 1 + w > n:
            return -1
        _be(p + i + 1, w, &u)
        if w == 1:
            it.value = <int64_t>(<signed char>u)
            if it.value >= -32:
                return -1
        elif w == 2:
            it.value = <int64_t>(<short>u)
            if it.value >= -128:
                return -1
        elif w == 4:
            it.value = <int64_t>(<int>u)
            if it.value >= -32768:
                return -1
        else:
            it.value = <int64_t>u
            if it.value >= -2147483648LL:
                return -1
        it.kind = K_INT
        return i + 1 + w
    if b == 0xD9 or b == 0xC4:  # str8 / bin8
        if i + 2 > n:
            return -1
        it.size = p[i + 1]
        if b == 0xD9 and it.size < 32:
            return -1
        it.kind = K_STR if b == 0xD9 else K_BIN
        it.data = i + 2
        return i + 2
    if b == 0xDA or b == 0xC5 or b == 0xDC or b == 0xDE:  # 16-bit sizes
        if i + 3 > n:
            return -1
        it.size = (<Py_ssize_t>p[i + 1] << 8) | p[i + 2]
        if it.size < (256 if b <= 0xDA else 16):
            return -1
        it.kind = K_STR if b == 0xDA else K_BIN if b == 0xC5 else K_ARRAY if b == 0xDC else K_MAP
        it.data = i + 3
        return i + 3
    if b == 0xDB or b == 0xC6 or b == 0xDD or b == 0xDF:  # 32-bit sizes
        if i + 5 > n:
            return -1
        _be(p + i + 1, 4, &u)
        it.size = <Py_ssize_t>u
        if it.size < 0x10000:
            return -1
        it.kind = K_STR if b == 0xDB else K_BIN if b == 0xC6 else K_ARRAY if b == 0xDD else K_MAP
        it.data = i + 5
        return i + 5
    it.kind = K_OTHER
    return -1


cdef inline bint _utf8(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """Valid UTF-8 as Python's strict decoder sees it (no surrogates, no overlongs). Runs of
    ASCII are checked eight bytes at a time (a 16 KiB text body: a byte at a time was a
    tenth of a burst's delivery CPU, docs/performance.md, Large bodies)."""
    cdef Py_ssize_t i = 0
    cdef uint8_t c, c1
    cdef uint64_t word
    while i < n:
        while i + 8 <= n:
            memcpy(&word, s + i, 8)
            if word & 0x8080808080808080ULL:
                break
            i += 8
        if i >= n:
            break
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2 or c > 0xF4:
            return False
        if c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
            continue
        if i + 1 >= n:
            return False
        c1 = s[i + 1]
        if c < 0xF0:
            if i + 2 >= n or (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80:
                return False
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return False
            i += 3
            continue
        if i + 3 >= n or (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80 or (
                s[i + 3] & 0xC0) != 0x80:
            return False
        if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
            return False
        i += 4
    return True


cdef inline Py_ssize_t _str(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* it) noexcept nogil:
    """A valid str at ``i``: the index past it, else -1."""
    i = _head(p, n, i, it)
    if i < 0 or it.kind != K_STR or i + it.size > n or not _utf8(p + i, it.size):
        return -1
    return i + it.size


cdef inline Py_ssize_t _opt_str(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* it) noexcept nogil:
    """nil or a valid str."""
    if i < n and p[i] == 0xC0:
        it.kind = K_NIL
        it.start = i
        return i + 1
    return _str(p, n, i, it)


cdef inline Py_ssize_t _int(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* it) noexcept nogil:
    i = _head(p, n, i, it)
    if i < 0 or it.kind != K_INT:
        return -1
    return i


cdef inline Py_ssize_t _str_array(const uint8_t* p, Py_ssize_t n, Py_ssize_t i,
                           Item* it) noexcept nogil:
    """An array of valid str (``keys``)."""
    cdef Py_ssize_t k, count
    cdef Item s
    i = _head(p, n, i, it)
    if i < 0 or it.kind != K_ARRAY:
        return -1
    count = it.size
    for k in range(count):
        i = _str(p, n, i, &s)
        if i < 0:
            return -1
    return i


cdef inline Py_ssize_t _str_map(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* it,
                         int max_entries) noexcept nogil:
    """A map of valid str to valid str with distinct keys and at most ``max_entries``."""
    cdef Py_ssize_t k, j, count
    cdef Item key, val
    cdef Py_ssize_t starts[16]
    cdef Py_ssize_t sizes[16]
    i = _head(p, n, i, it)
    if i < 0 or it.kind != K_MAP or it.size > max_entries or it.size > 16:
        return -1
    count = it.size
    for k in range(count):
        i = _str(p, n, i, &key)
        if i < 0:
            return -1
        for j in range(k):  # a decoded dict would keep one of two equal keys
            if sizes[j] == key.size and _same(p + starts[j], p + key.data, key.size):
                return -1
        starts[k] = key.data
        sizes[k] = key.size
        i = _str(p, n, i, &val)
        if i < 0:
            return -1
    return i


cdef inline Py_ssize_t _body_tags_keys(const uint8_t* p, Py_ssize_t n, Py_ssize_t i, Item* body,
                                Item* tags, Item* keys) noexcept nogil:
    """The body (bin), tags (nil or str) and keys (array of str) that both record formats
    hold in a row: the index past them, else -1."""
    i = _head(p, n, i, body)
    if i < 0 or body.kind != K_BIN or i + body.size > n:
        return -1
    i = _opt_str(p, n, i + body.size, tags)
    if i < 0:
        return -1
    return _str_array(p, n, i, keys)


# --- writing -------------------------------------------------------------------------------
cdef inline void _put_u32be(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v >> 24
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cdef inline Py_ssize_t _w_int(uint8_t* o, int64_t v) noexcept nogil:
    cdef int w, k
    cdef uint64_t u
    if 0 <= v < 128:
        o[0] = <uint8_t>v
        return 1
    if -32 <= v < 0:
        o[0] = <uint8_t>(v & 0xFF)
        return 1
    if v > 0:
        if v < 0x100:
            o[0] = 0xCC
            w = 1
        elif v < 0x10000:
            o[0] = 0xCD
            w = 2
        elif v < 0x100000000LL:
            o[0] = 0xCE
            w = 4
        else:
            o[0] = 0xCF
            w = 8
    else:
        if v >= -128:
            o[0] = 0xD0
            w = 1
        elif v >= -32768:
            o[0] = 0xD1
            w = 2
        elif v >= -2147483648LL:
            o[0] = 0xD2
            w = 4
        else:
            o[0] = 0xD3
            w = 8
    u = <uint64_t>v
    for k in range(w):
        o[w - k] = (u >> (8 * k)) & 0xFF
    return 1 + w


cdef inline Py_ssize_t _w_head(uint8_t* o, Py_ssize_t size, uint8_t fix, Py_ssize_t fix_max,
                               uint8_t b8, uint8_t b16, uint8_t b32) noexcept nogil:
    if size <= fix_max:
        o[0] = fix | <uint8_t>size
        return 1
    if b8 and size < 0x100:
        o[0] = b8
        o[1] = <uint8_t>size
        return 2
    if size < 0x10000:
        o[0] = b16
        o[1] = (size >> 8) & 0xFF
        o[2] = size & 0xFF
        return 3
    o[0] = b32
    _put_u32be(o + 1, <uint32_t>size)
    return 5


cdef inline Py_ssize_t _w_str(uint8_t* o, const char* s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t h = _w_head(o, n, 0xA0, 31, 0xD9, 0xDA, 0xDB)
    memcpy(o + h, s, n)
    return h + n


cdef inline Py_ssize_t _w_bin(uint8_t* o, const uint8_t* s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t h
    if n < 0x100:
        o[0] = 0xC4
        o[1] = <uint8_t>n
        h = 2
    elif n < 0x10000:
        o[0] = 0xC5
        o[1] = (n >> 8) & 0xFF
        o[2] = n & 0xFF
        h = 3
    else:
        o[0] = 0xC6
        _put_u32be(o + 1, <uint32_t>n)
        h = 5
    memcpy(o + h, s, n)
    return h + n


cdef inline Py_ssize_t _w_raw(uint8_t* o, const uint8_t* p, Py_ssize_t a,
                              Py_ssize_t b) noexcept nogil:
    memcpy(o, p + a, b - a)
    return b - a
