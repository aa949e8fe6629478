"""The sandbox's grants for a subprocess handler's child: :class:`Permissions`, checked here
when they are made; the kernel enforces them in the child (``_sandbox/``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from panqueue._check import check_int, check_one_of
from panqueue.errors import ConfigError

__all__ = ["ON_UNSUPPORTED", "Permissions", "parse_net_grant"]

ON_UNSUPPORTED = ("fail", "warn")
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def parse_net_grant(entry: object) -> tuple[str, int]:
    """``host:port``, ``ip:port``, ``[v6]:port``, ``cidr:port`` or ``*:port`` as (host, port);
    ConfigError naming the entry when it is none of these. The host part is kept as written
    (an address, a network, ``*`` or a lower-cased host name)."""
    if not isinstance(entry, str):
        raise ConfigError(f"Permissions.net entries must be 'host:port' strings, got {entry!r}")
    what = f"Permissions.net entry {entry!r}"
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ConfigError(f"{what}: an IPv6 grant is written '[address]:port'")
        port_text = rest[1:]
        try:
            network = ipaddress.ip_network(host, strict=False)
        except ValueError:
            raise ConfigError(f"{what}: {host!r} is not an IPv6 address or network") from None
        if network.version != 6:
            raise ConfigError(f"{what}: brackets are for IPv6 addresses only")
    else:
        host, colon, port_text = entry.rpartition(":")
        if not colon or not host:
            raise ConfigError(f"{what}: expected 'host:port' (the port is required)")
        if ":" in host:
            raise ConfigError(f"{what}: write an IPv6 address in brackets, '[{host}]:port'")
        if host != "*":
            try:
                ipaddress.ip_network(host, strict=False)
            except ValueError:
                labels = host.rstrip(".").split(".")
                if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
                    raise ConfigError(f"{what}: {host!r} is not a host name, an address or a "
                                      "network") from None
                host = host.lower()
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"{what}: the port must be a number from 1 to 65535, "
                          f"got {port_text!r}")
    return host, int(port_text)


def _paths(value: object, what: str, *, bare_names: bool = False) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(f"Permissions.{what} must be a list of paths, got {value!r}")
    paths = []
    for item in value:
        if isinstance(item, os.PathLike):
            item = os.fspath(item)
        if not isinstance(item, str) or not item or "\0" in item:
            raise ConfigError(f"Permissions.{what} entries must be paths, got {item!r}")
        if not os.path.isabs(item) and not (bare_names and "/" not in item):
            raise ConfigError(f"Permissions.{what} entries must be absolute paths"
                              f"{' or program names' if bare_names else ''}, got {item!r}")
        paths.append(os.path.normpath(item) if os.path.isabs(item) else item)
    return tuple(paths)


@dataclass(frozen=True, slots=True)
class Permissions:
    """What a subprocess handler's child may do; everything else the kernel denies there.

    ``read`` / ``write``: absolute path prefixes the child may read / read and change (what
    the interpreter, the standard library, installed packages and the handler's module need
    is readable without a grant). ``net``: outbound TCP, as ``host:port``, ``ip:port``,
    ``[v6]:port``, ``cidr:port`` or ``*:port`` (UDP goes to the resolver only). ``listen``:
    TCP ports the child may bind. ``env``: names or globs of the environment variables it
    inherits. ``run``: programs it may execute (absolute, or a name found on ``PATH`` at
    registration). ``processes``: how many processes it may start. ``on_unsupported``:
    ``"fail"`` (the worker refuses the queue where the kernel cannot enforce this) or
    ``"warn"`` (run unsandboxed, with one WARNING per child).
    """

    read: Sequence[str] = ()
    write: Sequence[str] = ()
    net: Sequence[str] = ()
    listen: Sequence[int] = ()
    env: Sequence[str] = ()
    run: Sequence[str] = ()
    processes: int = 0
    on_unsupported: str = "fail"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "read", _paths(self.read, "read"))
        set_(self, "write", _paths(self.write, "write"))
        set_(self, "run", _paths(self.run, "run", bare_names=True))
        if isinstance(self.net, (str, bytes)) or not isinstance(self.net, Iterable):
            raise ConfigError(f"Permissions.net must be a list of 'host:port' strings, "
                              f"got {self.net!r}")
        net = tuple(self.net)
        for entry in net:
            parse_net_grant(entry)
        set_(self, "net", net)
        if isinstance(self.listen, (str, bytes)) or not isinstance(self.listen, Iterable):
            raise ConfigError(f"Permissions.listen must be a list of TCP ports, "
                              f"got {self.listen!r}")
        listen = tuple(self.listen)
        for port in listen:
            check_int(port, "Permissions.listen entries", low=1, high=65535,
                      expected="ports (ints from 1 to 65535)")
        set_(self, "listen", listen)
        if isinstance(self.env, (str, bytes)) or not isinstance(self.env, Iterable):
            raise ConfigError(f"Permissions.env must be a list of variable names or globs, "
                              f"got {self.env!r}")
        env = tuple(self.env)
        for name in env:
            if not isinstance(name, str) or not name or "=" in name or "\0" in name:
                raise ConfigError(f"Permissions.env entries must be variable names or globs, "
                                  f"got {name!r}")
        set_(self, "env", env)
        check_int(self.processes, "Permissions.processes", low=0)
        if self.run and not self.processes:
            raise ConfigError("Permissions.run needs processes >= 1: a program runs in a process "
                              "of its own")
        check_one_of(self.on_unsupported, "Permissions.on_unsupported", ON_UNSUPPORTED)

    def net_ports(self) -> set[int]:
        """The TCP ports of the ``net`` grants (for the kernel's port rules)."""
        return {parse_net_grant(entry)[1] for entry in self.net}

    def resolved(self, queue: str) -> Permissions:
        """These permissions with each ``run`` program an absolute path that exists (a bare
        name looked up on ``PATH`` now); ConfigError naming the program otherwise."""
        programs = []
        for program in self.run:
            found = shutil.which(program) if "/" not in program else program
            if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
                why = "is not on PATH" if "/" not in program else "is not an executable file"
                raise ConfigError(f"permissions for queue {queue!r}: run program {program!r} "
                                  f"{why}")
            programs.append(os.path.abspath(found))
        return dataclasses.replace(self, run=tuple(programs))
