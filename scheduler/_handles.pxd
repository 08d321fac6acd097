# cython: language_level=3
"""The cancel handle of a timer key in C (== scheduler.codec.cancel_handle): shared by
scheduler/_native.pyx (``cancel_handles``) and api/_native.pyx (the send answer), ``cdef
inline`` so neither imports the other at run time."""

from libc.stdint cimport uint8_t, uint32_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

cdef inline Py_ssize_t _handle(char* dst, object key) except -1:
    """Write the cancel handle of ``key`` (URL-safe base64 of the version byte 1 + the timer
    key, without padding) to ``dst`` (room for 800); returns its length."""
    cdef Py_ssize_t n, total, i, w
    cdef uint8_t src[600]
    cdef uint32_t v
    cdef const char* b64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    if type(key) is not bytes or PyBytes_GET_SIZE(key) > 598:
        raise TypeError("a timer key is bytes of at most 598")
    n = PyBytes_GET_SIZE(key)
    src[0] = 1
    memcpy(src + 1, PyBytes_AS_STRING(key), n)
    total = n + 1
    w = 0
    i = 0
    while i + 3 <= total:
        v = (<uint32_t>src[i] << 16) | (<uint32_t>src[i + 1] << 8) | src[i + 2]
        dst[w] = b64[v >> 18]
        dst[w + 1] = b64[(v >> 12) & 63]
        dst[w + 2] = b64[(v >> 6) & 63]
        dst[w + 3] = b64[v & 63]
        w += 4
        i += 3
    if total - i == 1:
        v = <uint32_t>src[i] << 16
        dst[w] = b64[v >> 18]
        dst[w + 1] = b64[(v >> 12) & 63]
        w += 2
    elif total - i == 2:
        v = (<uint32_t>src[i] << 16) | (<uint32_t>src[i + 1] << 8)
        dst[w] = b64[v >> 18]
        dst[w + 1] = b64[(v >> 12) & 63]
        dst[w + 2] = b64[(v >> 6) & 63]
        w += 3
    return w
