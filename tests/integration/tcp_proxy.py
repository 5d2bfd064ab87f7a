"""A TCP proxy in front of a real service (PostgreSQL, Redis, S3) that a fault test can cut and restore.

``cut()`` closes every open connection and refuses new ones (the client sees a reset, as when a
service host goes away); ``stall()`` keeps every connection open and accepts new ones but forwards
nothing either way (a hung service: the client's connect succeeds, its request is never answered);
``restore()`` accepts and forwards again, what was held back included. Point the code under test at
``proxy.port`` instead of the service's own port.
"""

import socket
import threading
from contextlib import contextmanager

import pytest


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``(host, port)``; ``cut()`` / ``stall()`` / ``restore()`` simulate an
    outage."""

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._up = threading.Event()
        self._up.set()
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()

    @property
    def is_up(self) -> bool:
        return self._up.is_set()

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until ``restore()``."""
        self._up.clear()
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _close(sock, reset=True)

    def stall(self) -> None:
        """Accept connections but forward no byte, on open and new connections alike, until ``restore()``."""
        self._forwarding.clear()

    def restore(self) -> None:
        """Accept and forward connections again (after a stall, the bytes held back go on)."""
        self._up.set()
        self._forwarding.set()

    @contextmanager
    def outage(self):
        """``with proxy.outage(): ...`` cuts the service for the duration of the block."""
        self.cut()
        try:
            yield self
        finally:
            self.restore()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._listener.close()
        self._thread.join(2)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._up.is_set():
                _close(client, reset=True)
                continue
            if not self._forwarding.is_set():
                threading.Thread(target=self._connect_once_restored, args=(client,), daemon=True).start()
                continue
            self._connect(client)

    def _connect_once_restored(self, client: socket.socket) -> None:
        """Hold ``client``, accepted while stalled, until ``restore()``, then connect it."""
        with self._lock:
            self._open.add(client)
        while not self._forwarding.wait(0.2):
            if self._closed.is_set():
                return
        with self._lock:
            if client not in self._open:  # cut meanwhile
                return
        self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        """Connect ``client`` to the target and pipe both ways."""
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _close(client, reset=True)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.update((client, upstream))
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                while not self._forwarding.wait(0.2):  # stalled: hold the bytes back, forward them once restored
                    if self._closed.is_set():
                        return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
            _close(source)
            _close(sink)


def _close(sock: socket.socket, *, reset: bool = False) -> None:
    try:
        if reset:  # RST instead of FIN: the peer sees "connection reset", as when a host vanishes
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            # close() alone does not end a connection whose socket another thread is blocked reading from
            # (that read keeps it open): the peer would notice only at its next keep-alive, minutes later
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


@pytest.fixture
def tcp_proxy():
    """Factory: ``tcp_proxy(host, port)`` starts a :class:`TcpProxy`; all are closed after the test."""
    proxies = []

    def start(host: str, port: int) -> TcpProxy:
        proxy = TcpProxy(host, port)
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.close()
