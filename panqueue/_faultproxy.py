"""A TCP proxy on 127.0.0.1 that injects network faults between clients and a Redis server.

It runs in daemon threads of its own, so the same proxy serves sync tests, async tests on
asyncio or trio, and plain scripts. Each client connection gets an upstream connection and two
pump threads (one per direction); every fault is a state the pumps consult before forwarding
a chunk, so switching faults never needs the pumps' cooperation beyond that check.

Longer than our usual 300 lines: one class, whose fault states, waits and pumps share one lock
and one condition; split apart, every piece would reach into the others' state.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

from panqueue.errors import ConfigError
from panqueue.errors import TimeoutError as PanqueueTimeoutError

__all__ = ["SCRIPT_CALLS", "FaultProxy"]

_CHUNK = 65536

#: What a request that calls one of panqueue's scripts contains: ``FCALL`` (a function of the
#: script's library), or ``EVAL`` (``EVALSHA``, and ``EVAL`` in a pipeline or on a server
#: without functions). ``match=SCRIPT_CALLS`` picks out script calls.
SCRIPT_CALLS = (b"FCALL", b"EVAL")


def _matches(match: bytes | tuple[bytes, ...] | None) -> tuple[bytes, ...] | None:
    """``match`` as a tuple of what a request may contain (None: any request)."""
    if match is None:
        return None
    wanted = (match,) if isinstance(match, bytes) else tuple(match)
    if not wanted or not all(isinstance(m, bytes) and m for m in wanted):
        raise ConfigError("match must be non-empty bytes (or a tuple of them), or None for any "
                          "request")
    return wanted


def _found(wanted: tuple[bytes, ...] | None, chunk: bytes) -> bool:
    return wanted is None or any(m in chunk for m in wanted)
_FORWARD, _CUT, _BLACKHOLE = "forward", "cut", "blackhole"


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's socket, the server's, and its fault bookkeeping."""

    client: socket.socket
    server: socket.socket | None = None
    closed: bool = False
    drop_reply: bool = False  # a request matched an armed drop: discard the next reply
    tail: bytes = b""  # the end of the last request chunk, for matches across chunk borders
    pumps_left: int = 2
    threads: list[threading.Thread] = field(default_factory=list)

    def shut(self) -> None:
        """Wake both pumps: a blocked recv() returns b"" and a blocked sendall() fails. The
        sockets are closed by the last pump to leave, never under a thread still using them
        (a closed descriptor number can be reused at once by another connection)."""
        self.closed = True
        for sock in (self.client, self.server):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class FaultProxy:
    """A loopback TCP proxy in front of ``target_host:target_port`` with switchable faults.

    ::

        with FaultProxy(server.port) as proxy:
            client = redis.Redis.from_url(proxy.url)
            proxy.cut()            # every connection closed, new ones refused
            proxy.restore()        # forwarding again

    Faults (each lasts until :meth:`restore`, except the delay and armed drops):

    - :meth:`cut`: close every connection (both sides) at once; connections opened meanwhile
      are accepted and closed immediately.
    - :meth:`blackhole`: connections stay open but nothing is forwarded either way, as on a
      network that silently drops packets. Bytes are held back (as TCP would keep
      retransmitting them), not discarded: after :meth:`restore`, whatever a still-open
      connection sent is delivered. New connections are accepted and forward nothing too.
    - :meth:`delay`: wait this long before forwarding each chunk, in both directions.
    - :meth:`drop_next_reply`: the server runs a command but its client never sees the reply:
      the reply is discarded and the connection closed (the classic lost reply).

    The listening port is chosen by the system unless ``port`` is given. The proxy listens on
    127.0.0.1 only. All methods are thread-safe and never block on the network.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", *,
                 port: int = 0, connect_timeout: float = 5.0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.connect_timeout = connect_timeout
        self._requested_port = port
        self._port: int | None = None
        self._cond = threading.Condition()
        self._mode = _FORWARD
        self._delay = 0.0
        self._armed: list[tuple[bytes, ...] | None] = []  # one entry per reply still to drop
        self._links: set[_Link] = set()
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._stopping = False
        #: Connections accepted and forwarded since :meth:`start` (not those refused by a cut).
        self.connections_accepted = 0
        #: Connections accepted and closed at once because of a :meth:`cut`.
        self.connections_refused = 0
        #: Replies discarded by :meth:`drop_next_reply` (one per closed connection).
        self.replies_dropped = 0
        # What clients sent since the last blackhole began that it holds back (or held).
        self._held: list[bytes] = []
        self._restores = 0  # how many times restore() ran: it releases what was held before

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        """The port the proxy listens on (127.0.0.1); known once started."""
        if self._port is None:
            raise ConfigError("FaultProxy.port is known only after start()")
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``: database 0 through the proxy."""
        return self.url_for()

    def url_for(self, url: str | None = None, *, db: int | None = None) -> str:
        """A ``redis://`` URL through the proxy.

        Without ``url``: ``redis://127.0.0.1:<port>/<db>`` (database 0 by default). With one:
        the same URL (credentials, database, query options) with its host and port replaced by
        the proxy's; ``db`` then replaces the database. Only plain TCP URLs can be proxied
        (``redis://``), since the proxy does not speak TLS.
        """
        if url is None:
            return f"redis://127.0.0.1:{self.port}/{0 if db is None else db}"
        parts = urlsplit(url)
        if parts.scheme != "redis":
            raise ConfigError(f"FaultProxy can only proxy redis:// URLs, not {parts.scheme}://")
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        path = parts.path if db is None else f"/{db}"
        return urlunsplit((parts.scheme, netloc, path, parts.query, parts.fragment))

    def start(self) -> FaultProxy:
        """Listen and start forwarding; returns the proxy."""
        if self._listener is not None:
            raise ConfigError("FaultProxy is already started")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self._requested_port))
        listener.listen(128)
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                          name=f"faultproxy-accept-{self._port}")
        self._acceptor.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection, and wait (up to ``timeout``) for the
        proxy's threads to end. The proxy can be started again afterwards."""
        if self._listener is None:
            return
        with self._cond:
            self._stopping = True
            links = list(self._links)
            for link in links:
                link.shut()
            self._cond.notify_all()
        assert self._wake_w is not None
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        deadline = time.monotonic() + timeout
        if self._acceptor is not None:
            self._acceptor.join(max(0.0, deadline - time.monotonic()))
        for link in links:
            for thread in link.threads:
                thread.join(max(0.0, deadline - time.monotonic()))
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._listener = self._wake_r = self._wake_w = None
        self._acceptor = None
        with self._cond:
            self._mode = _FORWARD
            self._delay = 0.0
            self._armed.clear()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------------ faults

    def cut(self) -> None:
        """Close every current connection (client and server side) and refuse new ones
        (accepted, then closed at once) until :meth:`restore`."""
        with self._cond:
            self._mode = _CUT
            for link in self._links:
                link.shut()
            self._cond.notify_all()

    def blackhole(self) -> None:
        """Forward nothing, in either direction, on current and new connections, until
        :meth:`restore`. Connections stay open; bytes are held back, not discarded."""
        with self._cond:
            self._mode = _BLACKHOLE
            self._held.clear()
            self._cond.notify_all()

    def restore(self) -> None:
        """Forward normally again: held bytes flow, new connections work. The delay set by
        :meth:`delay` and armed drops are kept."""
        with self._cond:
            self._mode = _FORWARD
            self._restores += 1
            self._cond.notify_all()

    def delay(self, seconds: float) -> None:
        """Wait ``seconds`` before forwarding each chunk, both ways (0 removes the delay)."""
        if seconds < 0:
            raise ConfigError(f"delay must be >= 0 seconds, got {seconds}")
        with self._cond:
            self._delay = float(seconds)
            self._cond.notify_all()

    def drop_next_reply(self, n: int = 1, *,
                        match: bytes | tuple[bytes, ...] | None = None) -> None:
        """Lose the replies to the next ``n`` requests: each request is forwarded (the server
        runs it), then the next chunk the server sends on that connection is discarded and
        the connection closed, so the client sees a broken connection instead of the reply.

        With ``match``, only requests whose bytes contain ``match`` (or one of a tuple of them)
        count: a key name, or :data:`SCRIPT_CALLS` for any script call; other traffic flows
        untouched. Without it, the
        next requests on any connection count. A request is what a client sends in one
        chunk; a client pipelining several commands loses the replies that come back in the
        dropped chunk, and its connection. Drops stay armed until used, or until
        :meth:`stop`; :attr:`replies_dropped` counts the used ones.
        """
        if n < 1:
            raise ConfigError(f"n must be >= 1, got {n}")
        wanted = _matches(match)
        with self._cond:
            self._armed.extend([wanted] * n)

    def clear_drops(self) -> None:
        """Disarm the drops :meth:`drop_next_reply` armed and that are not used yet."""
        with self._cond:
            self._armed.clear()

    # ------------------------------------------------------------------ observing

    @property
    def active_connections(self) -> int:
        """Connections currently open through the proxy."""
        with self._cond:
            return len(self._links)

    @property
    def drops_pending(self) -> int:
        """Armed drops not used yet."""
        with self._cond:
            return len(self._armed)

    def wait_for_connections(self, n: int, timeout: float = 10.0, *,
                             active: bool = False) -> None:
        """Block until :attr:`connections_accepted` reaches ``n`` (or, with ``active=True``,
        until ``n`` connections are open at once). Raises :class:`panqueue.TimeoutError`."""
        if active:
            self._wait(lambda: len(self._links) >= n, timeout, f"{n} open connections")
        else:
            self._wait(lambda: self.connections_accepted >= n, timeout,
                       f"{n} accepted connections")

    def wait_for_dropped_replies(self, n: int, timeout: float = 10.0) -> None:
        """Block until :attr:`replies_dropped` reaches ``n``. Raises
        :class:`panqueue.TimeoutError`."""
        self._wait(lambda: self.replies_dropped >= n, timeout, f"{n} dropped replies")

    def wait_for_held_requests(self, n: int, timeout: float = 10.0, *,
                               match: bytes | tuple[bytes, ...] | None = None) -> None:
        """Block until the current :meth:`blackhole` has held back ``n`` requests (chunks a
        client sent), counting with ``match`` only those whose bytes contain it: the moment
        a client is surely waiting for replies that will not come. Raises
        :class:`panqueue.TimeoutError`."""
        wanted = _matches(match)
        self._wait(lambda: sum(_found(wanted, chunk) for chunk in self._held) >= n,
                   timeout, f"{n} held requests")

    def _wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise PanqueueTimeoutError(
                    f"FaultProxy: no {what} after {timeout} s (accepted "
                    f"{self.connections_accepted}, open {len(self._links)}, replies dropped "
                    f"{self.replies_dropped})")

    # ------------------------------------------------------------------ threads

    def _accept_loop(self) -> None:
        listener, wake = self._listener, self._wake_r
        assert listener is not None and wake is not None
        while True:
            try:
                readable, _, _ = select.select([listener, wake], [], [])
            except (OSError, ValueError):
                return
            if wake in readable or self._stopping:
                return
            try:
                client, _ = listener.accept()
            except OSError:
                continue
            with self._cond:
                if self._stopping:
                    client.close()
                    return
                if self._mode == _CUT:
                    self.connections_refused += 1
                    self._cond.notify_all()
                    _close_at_once(client)
                    continue
                link = _Link(client)
                self._links.add(link)
                self.connections_accepted += 1
                self._cond.notify_all()
            thread = threading.Thread(target=self._open_upstream, args=(link,), daemon=True,
                                      name=f"faultproxy-{self._port}-connect")
            thread.start()

    def _open_upstream(self, link: _Link) -> None:
        try:
            server = socket.create_connection((self.target_host, self.target_port),
                                              timeout=self.connect_timeout)
        except OSError:  # the server is down: the client sees its connection closed
            with self._cond:
                self._links.discard(link)
                self._cond.notify_all()
            _close_at_once(link.client)
            return
        server.settimeout(None)
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._cond:
            link.server = server
            if link.closed or self._stopping:  # cut or stopped while connecting
                link.shut()
        up = threading.Thread(target=self._pump, args=(link, True), daemon=True,
                              name=f"faultproxy-{self._port}-up")
        down = threading.Thread(target=self._pump, args=(link, False), daemon=True,
                                name=f"faultproxy-{self._port}-down")
        up.start()
        down.start()
        link.threads += [up, down]  # only started threads: stop() may join them at any time

    def _pump(self, link: _Link, to_server: bool) -> None:
        """Forward one direction of ``link`` until either side closes or a fault ends it."""
        assert link.server is not None
        src, dst = (link.client, link.server) if to_server else (link.server, link.client)
        try:
            while True:
                try:
                    chunk = src.recv(_CHUNK)
                except OSError:
                    break
                if not chunk or not self._may_forward(link, chunk, to_server):
                    break
                try:
                    dst.sendall(chunk)
                except OSError:
                    break
        finally:
            with self._cond:
                link.shut()
                link.pumps_left -= 1
                last = link.pumps_left == 0
                if last:
                    self._links.discard(link)
                    self._cond.notify_all()
            if last:
                link.client.close()
                link.server.close()

    def _may_forward(self, link: _Link, chunk: bytes, to_server: bool) -> bool:
        """Apply the faults to one chunk: wait out a blackhole and the delay, then arm or
        perform a drop. False: do not forward, and end the connection."""
        with self._cond:
            if to_server and self._mode == _BLACKHOLE:
                self._held.append(chunk)
                self._cond.notify_all()
            # Held until a restore: that one restore releases it, even if a blackhole follows
            # before this thread wakes (else a chunk held across restore-blackhole stays held).
            restores = self._restores
            self._cond.wait_for(lambda: link.closed or self._mode != _BLACKHOLE
                                or self._restores != restores)
            if link.closed or self._mode == _CUT:
                return False
            if self._delay > 0:
                until = time.monotonic() + self._delay
                # Woken early only to end the connection (a cut or stop); a later blackhole
                # does not hold back a chunk already in its delay.
                while not link.closed and (left := until - time.monotonic()) > 0:
                    self._cond.wait(left)
                if link.closed:
                    return False
            if to_server:
                if not self._armed:
                    link.tail = b""
                elif not link.drop_reply:
                    seen = link.tail + chunk
                    for i, match in enumerate(self._armed):
                        if _found(match, seen):
                            del self._armed[i]
                            link.drop_reply = True
                            break
                    longest = max((len(m) for ms in self._armed if ms for m in ms), default=1)
                    link.tail = seen[-(longest - 1):] if longest > 1 else b""
                return True
            if link.drop_reply:
                self.replies_dropped += 1
                link.shut()
                self._cond.notify_all()
                return False
            return True


def _close_at_once(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
