"""From :class:`panqueue.Permissions` to what the child applies: the wire dict of the config
frame (paths to grant, TCP ports, the seccomp filter's spec, the address policy), built in
the worker, and the environment the child starts with.

The runtime set (:func:`runtime_paths`) is what the interpreter, the standard library,
installed packages, name resolution and TLS need, read-only; nothing else of the host: not
``/etc`` as a whole, not the worker's working directory, not the handler's project (its module
is imported before the rules apply).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import site
import sys
from collections.abc import Mapping
from typing import Any

from panqueue._permissions import Permissions

__all__ = ["child_env", "runtime_paths", "to_wire"]

# Files and directories of the host every child may read (each only if it exists).
_HOST_READ = (
    "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib",
    # /etc/ssl/certs, not /etc/ssl: /etc/ssl/private holds the host's private keys.
    "/usr/share/zoneinfo", "/usr/share/ca-certificates", "/etc/ssl/certs", "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates", "/etc/ca-certificates.conf",
    "/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf",
    "/etc/localtime", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
    "/dev/urandom", "/dev/random", "/dev/zero",
)
# Read and write.
_HOST_WRITE = ("/dev/null",)
# The dynamic loaders a program the child may run needs (executed by the kernel).
_LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1",
            "/lib/ld-linux-x86-64.so.2")


def _module_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) if path else None


@functools.cache
def runtime_paths() -> tuple[str, ...]:
    """What every sandboxed child may read without a grant (see the module docstring)."""
    import ssl

    paths: list[str] = []
    stdlib = os.path.dirname(os.__file__)
    paths += [stdlib, os.path.join(stdlib, "lib-dynload")]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        for entry in sys.path:
            if entry and os.path.isabs(entry) and entry.startswith(prefix + os.sep) and (
                    os.sep + "lib" in entry[len(prefix):]):
                paths.append(entry)
    paths += site.getsitepackages()
    user_site = site.getusersitepackages()
    if os.path.isdir(user_site):
        paths.append(user_site)
    paths += [entry for entry in sys.path
              if os.path.isabs(entry) and os.path.basename(entry.rstrip(os.sep))
              in ("site-packages", "dist-packages")]
    import msgpack

    # panqueue's own package: the directory above this one (not ``import panqueue``, which
    # would make this module import the package that imports it).
    paths.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if msgpack.__file__:
        paths.append(os.path.dirname(os.path.abspath(msgpack.__file__)))
    verify = ssl.get_default_verify_paths()
    paths += [p for p in (verify.cafile, verify.capath, verify.openssl_cafile,
                          verify.openssl_capath) if p]
    import mimetypes

    # /etc/mime.types and the like: read by mimetypes.init()
    paths += [os.fspath(known) for known in mimetypes.knownfiles]
    paths += list(_HOST_READ)
    seen: dict[str, None] = {}
    for path in paths:
        for each in (os.path.normpath(path), os.path.realpath(path)):
            if os.path.exists(each):
                seen.setdefault(each, None)
    return tuple(seen)


def _executables(run: tuple[str, ...]) -> list[str]:
    """The programs of ``run`` (and their real paths), the loaders and any ``#!``
    interpreter they name."""
    found: list[str] = []
    for program in run:
        found += [program, os.path.realpath(program)]
        try:
            with open(program, "rb") as file:
                first = file.readline(256)
        except OSError:
            continue
        if first.startswith(b"#!"):
            words = first[2:].decode(errors="replace").split()
            if words:
                found += [words[0], os.path.realpath(words[0])]
                if os.path.basename(words[0]) == "env" and len(words) > 1:
                    import shutil

                    target = shutil.which(words[1])
                    if target:
                        found += [target, os.path.realpath(target)]
    if run:
        for loader in _LOADERS:
            if os.path.exists(loader):
                found += [loader, os.path.realpath(loader)]
    return list(dict.fromkeys(found))


def child_env(permissions: Permissions,
              environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The child's environment: the worker's variables whose names match ``env``, and TMPDIR
    set to the first ``write`` grant (left unset without one)."""
    env = {name: value for name, value in environ.items()
           if any(fnmatch.fnmatchcase(name, pattern) for pattern in permissions.env)}
    env.pop("TMPDIR", None)
    if permissions.write:
        env["TMPDIR"] = permissions.write[0]
    return env


def to_wire(permissions: Permissions) -> dict[str, Any]:
    """The config frame's ``permissions``: everything the child needs to confine itself."""
    from panqueue._sandbox.net import NetPolicy

    run = tuple(permissions.run)
    net = NetPolicy.from_grants(list(permissions.net))
    return {
        "runtime": list(runtime_paths()),
        "read": list(permissions.read),
        "write": list(permissions.write),
        "devices": list(_HOST_WRITE),
        "execute": _executables(run),
        # The granted ports and, with any grant, the resolver's (DNS over TCP).
        "connect_ports": sorted(net.ports()) if permissions.net else [],
        "listen_ports": sorted(set(permissions.listen)),
        "filter": {"run": bool(run), "processes": permissions.processes,
                   "inet": bool(permissions.net or permissions.listen),
                   "listen": bool(permissions.listen)},
        "net": net.to_wire(),
        "net_grants": list(permissions.net),
        "run": list(run),
        "processes": permissions.processes,
    }
