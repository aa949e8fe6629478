"""Registries for tests/test_check_permissions.py: ``panqueue check-permissions
permissions_cli_app:queues``.

``perm-files`` reads and writes, ``perm-net`` connects to one address and may run one program
and start two processes, ``perm-warn`` asks to run unsandboxed with a warning where the host
cannot enforce its grants, ``plain`` has no permissions at all.
"""

from __future__ import annotations

import shutil

from panqueue import Job, Permissions, Registry

queues = Registry()
# Only handlers without permissions: check-permissions has nothing to check.
plain_only = Registry()

TRUE = shutil.which("true") or "/bin/true"


@queues.handler("perm-files", executor="subprocess",
                permissions=Permissions(read=["/usr/share"], write=["/tmp"],
                                        env=["LANG", "APP_*"]))
def files(job: Job) -> None:
    return None


@queues.handler("perm-net", executor="subprocess",
                permissions=Permissions(net=["127.0.0.1:6399", "*:443"], listen=[8099],
                                        run=[TRUE], processes=2))
def net(job: Job) -> None:
    return None


@queues.handler("perm-warn", executor="subprocess",
                permissions=Permissions(read=["/usr/share"], on_unsupported="warn"))
def warn(job: Job) -> None:
    return None


@queues.handler("plain", executor="subprocess")
def plain(job: Job) -> None:
    return None


@plain_only.handler("plain", executor="subprocess")
def plain_too(job: Job) -> None:
    return None
