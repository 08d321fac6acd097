"""Check-callback URL policy: which URLs a producer group may register and be called at.

A host is allowed when it is on ``EngineConfig.transaction_callback_allowed_hosts`` (exact,
case-insensitive, or a subdomain of a ``*.domain`` entry); a port when it is 80 or 443, or
named by an entry that matches the host (``10.0.0.7:8080``, ``localhost:*``). The registry
checks a URL when it is registered and the dispatcher again on every round (the list may have
shrunk since).
"""

from __future__ import annotations

import urllib.parse

from storage.errors import InvalidArgument

DEFAULT_PORTS = frozenset({80, 443})


def _split_entry(entry: str) -> tuple[str, str | None]:
    """An allow-list entry as (host pattern, port or "*" or None): ``orders.internal``,
    ``*.example.com``, ``10.0.0.7:8080``, ``localhost:*``, ``[::1]:8443``."""
    entry = entry.lower().rstrip(".")
    head, sep, tail = entry.rpartition(":")
    if sep and (tail == "*" or (tail.isascii() and tail.isdigit())) and (
            ":" not in head or head.endswith("]")):
        return head.strip("[]"), tail if tail == "*" else str(int(tail))
    return entry.strip("[]"), None


def _host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def host_allowed(host: str, allowed_hosts: tuple[str, ...]) -> bool:
    """``host`` equals an entry's host (case-insensitively), or is a subdomain of a
    ``*.domain`` one."""
    host = host.lower().rstrip(".")
    return any(_host_matches(host, _split_entry(e)[0]) for e in allowed_hosts)


def port_allowed(host: str, port: int, allowed_hosts: tuple[str, ...]) -> bool:
    """80, 443, a port that an entry matching ``host`` names (``10.0.0.7:8080`` opens 8080
    on 10.0.0.7 only, not on the list's other hosts), or any port of a host whose entry says
    ``:*``."""
    if port in DEFAULT_PORTS:
        return True
    host = host.lower().rstrip(".")
    for pattern, entry_port in map(_split_entry, allowed_hosts):
        if entry_port in (str(port), "*") and _host_matches(host, pattern):
            return True
    return False


def url_refusal(url: str, allowed_hosts: tuple[str, ...]) -> str | None:
    """Why ``url`` may not be called back (its host or port), or None."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if not host_allowed(host, allowed_hosts):
        allowed = ", ".join(allowed_hosts) or "none: callbacks are disabled"
        return f"host {host!r} is not on the check-callback allow-list ({allowed})"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not port_allowed(host, port, allowed_hosts):
        return (f"port {port} is not allowed for check callbacks (80, 443 and the ports "
                f"named in transaction_callback_allowed_hosts are)")
    return None


def validate_callback_url(url: str, allowed_hosts: tuple[str, ...]) -> str:
    """The URL if it is an absolute http(s) URL without credentials whose host is allowed;
    else InvalidArgument with the reason."""
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise InvalidArgument("url must be a non-empty string of at most 2048 characters")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise InvalidArgument(f"url is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidArgument("url must use http or https")
    if not parts.hostname:
        raise InvalidArgument("url must name a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidArgument("url must not carry credentials")
    if parts.fragment:
        raise InvalidArgument("url must not have a fragment")
    del port
    refusal = url_refusal(url, allowed_hosts)
    if refusal is not None:
        raise InvalidArgument(refusal)
    return url
