"""The address policy of a sandboxed child (``Permissions.net``): which addresses it may reach.

The worker's supervisor asks :meth:`NetPolicy.allows` before it performs a child's connect or
addressed send; the child's audit hook asks :meth:`NetPolicy.allows_literal` to refuse, with a
message, what the supervisor would refuse anyway. Grants hold by address, not only by port: a
host grant covers the addresses its name resolves to (looked up by the worker, never by the
child), and nothing else on that port.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["NetPolicy"]

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network

RESOLV_CONF = "/etc/resolv.conf"
DNS_PORT = 53
# How long an address a host name resolved to stays granted after it was last seen.
RESOLVE_TTL = 60.0
# A connect to an address not (or no longer) among a host's addresses looks the name up again,
# at most this often per host: DNS that rotates its answers (S3, CDNs) gives the child and the
# worker different addresses for the same name.
RESOLVE_RETRY = 1.0

_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_FORMS = "host:port, ip:port, [ipv6]:port, cidr:port or *:port"


@dataclass(frozen=True)
class _Grant:
    """One ``net`` entry: a port and what it covers (every address, a network, or a name)."""

    text: str
    port: int
    network: _Network | None = None
    host: str | None = None

    @property
    def any_address(self) -> bool:
        return self.network is None and self.host is None


def _fail(entry: object, why: str) -> ValueError:
    return ValueError(f"net grant {entry!r}: {why}")


def _parse_port(entry: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise _fail(entry, f"port {text!r} must be a number from 1 to 65535")
    return int(text)


def _parse_network(entry: str, text: str) -> _Network:
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError:
        pass
    try:
        wide = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise _fail(entry, f"{text!r} is not an IP address or network") from None
    raise _fail(entry, f"{text} has host bits set; write the network, {wide}")


def _parse_grant(entry: object) -> _Grant:
    if not isinstance(entry, str):
        raise _fail(entry, f"must be a string ({_FORMS})")
    text = entry.strip()
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1:close + 2] != ":":
            raise _fail(entry, "write an IPv6 address as [address]:port, for example "
                               "[2001:db8::1]:443")
        network = _parse_network(entry, text[1:close])
        if network.version != 6:
            raise _fail(entry, "brackets are for IPv6 addresses; write an IPv4 address as "
                               "ip:port")
        port = _parse_port(entry, text[close + 2:])
        return _Grant(f"[{_shown_network(network)}]:{port}", port, network=network)
    host, colon, port_text = text.rpartition(":")
    if not colon or not host:
        raise _fail(entry, f"needs an address and a port ({_FORMS})")
    if ":" in host:
        raise _fail(entry, "write an IPv6 address in brackets, for example [2001:db8::1]:443")
    port = _parse_port(entry, port_text)
    if host == "*":
        return _Grant(f"*:{port}", port)
    if "/" in host or re.fullmatch(r"[0-9.]+", host):
        network = _parse_network(entry, host)
        return _Grant(f"{_shown_network(network)}:{port}", port, network=network)
    if len(host) > 253 or not _HOST_NAME.fullmatch(host):
        raise _fail(entry, f"{host!r} is not a host name, an IP address or a network")
    name = host.rstrip(".").lower()
    return _Grant(f"{name}:{port}", port, host=name)


def _shown_network(network: _Network) -> str:
    """An address for a one-address network, else the CIDR form."""
    if network.num_addresses == 1:
        return str(network.network_address)
    return str(network)


def _address(ip: str) -> _Address | None:
    """``ip`` as an address (an IPv4-mapped IPv6 address as its IPv4 address), or None."""
    try:
        address = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def show(ip: str, port: int) -> str:
    """``ip:port``, or ``[ip]:port`` for IPv6: how denials and messages name an address."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def nameservers(path: str = RESOLV_CONF) -> list[str]:
    """The resolver addresses this host uses (``nameserver`` lines); glibc's default, the local
    host, when the file names none."""
    found: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            for line in file:
                fields = line.split()
                if len(fields) >= 2 and fields[0] == "nameserver":
                    address = _address(fields[1])
                    if address is not None and str(address) not in found:
                        found.append(str(address))
    except OSError:
        pass
    return found or ["127.0.0.1", "::1"]


class NetPolicy:
    """Outbound network grants: TCP to what a grant covers, and name resolution.

    Name resolution (UDP, and TCP for long answers, to the host's nameservers on port 53) is
    allowed when a grant names a host: the child needs it to look the name up. Thread-safe.
    """

    def __init__(self, grants: Sequence[_Grant], resolvers: Sequence[str]) -> None:
        self._grants = tuple(grants)
        self._resolvers = tuple(resolvers)
        self._resolver_addresses = frozenset(
            a for a in (_address(r) for r in resolvers) if a is not None)
        self._resolves = any(g.host is not None for g in self._grants)
        self._lock = threading.Lock()
        # host -> (address -> time it stops counting), and when the name was last looked up
        self._seen: dict[str, dict[_Address, float]] = {}
        self._looked_up: dict[str, float] = {}

    @classmethod
    def from_grants(cls, net: Sequence[str]) -> NetPolicy:
        """Parse ``Permissions.net``; ValueError with one line naming a bad entry."""
        if isinstance(net, str):
            raise _fail(net, "net is a list of grants, not one string")
        return cls([_parse_grant(entry) for entry in net], nameservers())

    def to_wire(self) -> dict[str, Any]:
        """A plain dict (JSON and msgpack safe) that :meth:`from_wire` turns back into this
        policy, resolvers included: the child checks against the worker's view."""
        return {"grants": [g.text for g in self._grants], "resolvers": list(self._resolvers)}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> NetPolicy:
        return cls([_parse_grant(text) for text in wire.get("grants", ())],
                   [str(r) for r in wire.get("resolvers", ())])

    @property
    def grants(self) -> tuple[str, ...]:
        """The grants in their canonical form."""
        return tuple(g.text for g in self._grants)

    def describe(self) -> str:
        """The grants for a message: ``"127.0.0.1:8443, example.com:443"`` or ``"none"``."""
        return ", ".join(self.grants) or "none"

    def ports(self) -> set[int]:
        """The TCP ports a connect may reach (Landlock's port rules): every grant's port, and
        the DNS port when a grant names a host."""
        ports = {g.port for g in self._grants}
        if self._resolves:
            ports.add(DNS_PORT)
        return ports

    def _resolver(self, address: _Address, port: int) -> bool:
        return self._resolves and port == DNS_PORT and address in self._resolver_addresses

    def allows(self, ip: str, port: int, *, udp: bool) -> bool:
        """Whether a connect or send to ``ip``:``port`` is granted. UDP only reaches the
        resolvers; TCP what a grant covers, a host grant's name resolved here (the result kept
        :data:`RESOLVE_TTL` seconds). This may block on DNS."""
        address = _address(ip)
        if address is None or not 0 < port < 65536:
            return False
        if self._resolver(address, port):
            return True
        if udp:
            return False
        for grant in self._grants:
            if grant.port != port:
                continue
            if grant.any_address:
                return True
            if grant.network is not None and address in grant.network:
                return True
            if grant.host is not None and address in self._host_addresses(grant.host, port,
                                                                          address):
                return True
        return False

    def allows_literal(self, ip: str, port: int) -> bool | None:
        """Whether a TCP connect to ``ip``:``port`` is granted, without resolving: None when
        only a host grant on that port could cover it (the worker decides)."""
        address = _address(ip)
        if address is None:
            return None  # a name, not a literal: the child does not resolve
        if self._resolver(address, port):
            return True
        undecided = False
        for grant in self._grants:
            if grant.port != port:
                continue
            if grant.any_address or (grant.network is not None and address in grant.network):
                return True
            if grant.host is not None:
                undecided = True
        return None if undecided else False

    def _host_addresses(self, host: str, port: int, wanted: _Address) -> set[_Address]:
        now = time.monotonic()
        with self._lock:
            seen = self._seen.setdefault(host, {})
            for address, until in list(seen.items()):
                if until <= now:
                    del seen[address]
            if wanted in seen or now - self._looked_up.get(host, -RESOLVE_TTL) < RESOLVE_RETRY:
                return set(seen)
            self._looked_up[host] = now
        found = _resolve(host, port)
        with self._lock:
            seen = self._seen.setdefault(host, {})
            for address in found:
                seen[address] = now + RESOLVE_TTL
            return set(seen)


def _resolve(host: str, port: int) -> set[_Address]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return set()
    found: set[_Address] = set()
    for info in infos:
        address = _address(str(info[4][0]))
        if address is not None:
            found.add(address)
    return found
