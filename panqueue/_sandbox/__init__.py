"""Kernel-enforced permissions for subprocess handlers (:class:`panqueue.Permissions`).

- :mod:`.probe`: what this host can enforce (``support()``, ``Support.missing()``);
- :mod:`.policy`: Permissions -> the child's wire policy and environment (in the worker);
- :mod:`.confine`: the child applies the policy to itself before it serves any job;
- :mod:`.landlock`: Landlock's system calls (file and TCP port rules, scoping);
- :mod:`.seccomp`, :mod:`.supervisor`, :mod:`.net`: the system-call filter, the worker's
  thread that decides the child's connects and process starts, and the address policy.

Nothing here is imported by panqueue unless a handler has permissions.
"""
