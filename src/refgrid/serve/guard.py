"""Connections that do not send a request's head in time are closed.

aiohttp waits for a request line and headers as long as a client keeps the connection
open: a client that sends half a request and stops (by accident, or a "slowloris" that
opens thousands) holds a file descriptor each until the service can accept no one. A
service that runs for months needs a bound, as web servers have (Apache's
``RequestReadTimeout``, nginx's ``client_header_timeout``). :class:`HeadDeadline` wraps
each connection's aiohttp protocol: from the first byte of a request until its head ends
(a blank line), and from the moment a connection opens, the head must arrive within
``timeout`` seconds or the connection is closed. The service answers only ``GET``,
``HEAD``, ``OPTIONS`` and ``POST /NAME/refresh``: a request's ``Content-Length`` says which
bytes after its head are its body, and every other byte belongs to a head. Idle keep-alive
connections are aiohttp's to close.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Callable

from aiohttp import web

END_OF_HEAD = b"\r\n\r\n"
HEAD_LIMIT = 65536
CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d{1,12})", re.IGNORECASE)
CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked", re.IGNORECASE)


def _content_length(head: bytes) -> int:
    """The body bytes that follow ``head``: its ``Content-Length``; for a chunked body, no
    bound can be told from here, so the rest of the connection is left to aiohttp."""
    if CHUNKED.search(head):
        return 2**62
    found = CONTENT_LENGTH.search(head)
    return int(found[1]) if found else 0


class HeadDeadline(asyncio.Protocol):
    """``inner`` (aiohttp's protocol of one connection), closed when a request head takes
    longer than ``timeout`` seconds to arrive."""

    def __init__(self, inner: asyncio.Protocol, timeout: float) -> None:
        self.inner = inner
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.head = bytearray()
        """The bytes of the request head arriving (up to :data:`HEAD_LIMIT`)."""
        self.body = 0
        """Bytes of the current request's body still to come (they are no head)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP server's: a Transport
        self._arm()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._watch(data)
        self.inner.data_received(data)

    def _watch(self, data: bytes) -> None:
        """Follow request heads and bodies through ``data``: the deadline runs while a head
        is arriving (from its first byte, or from the connection's start)."""
        view = memoryview(data)
        while len(view):
            if self.body:  # a body (Content-Length) is no head
                taken = min(self.body, len(view))
                self.body -= taken
                view = view[taken:]
                continue
            if self.timer is None:
                self._arm()
            seen = len(self.head)
            self.head += view[:HEAD_LIMIT]
            end = self.head.find(END_OF_HEAD, max(0, seen - 3))
            if end < 0:
                del self.head[:-3]  # (aiohttp refuses heads that are too long)
                return
            used = end + len(END_OF_HEAD) - seen
            self.body = _content_length(bytes(self.head[:end]))
            self.head.clear()
            self._disarm()
            view = view[used:]

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _arm(self) -> None:
        self._disarm()
        self.timer = asyncio.get_running_loop().call_later(self.timeout, self._expired)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if self.transport is not None:
            self.transport.abort()  # no response: the client never finished asking


class GuardedSite(web.SockSite):
    """aiohttp's site on a listening socket, each connection's protocol wrapped in
    :class:`HeadDeadline`."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket,
                 head_timeout: float) -> None:
        super().__init__(runner, sock)
        self.head_timeout = head_timeout

    async def start(self) -> None:
        await web.BaseSite.start(self)  # (registers the site with its runner)
        server = self._runner.server
        assert server is not None  # (the runner is set up before its sites start)
        factory: Callable[[], asyncio.Protocol] = \
            lambda: HeadDeadline(server(), self.head_timeout)  # noqa: E731
        self._server = await asyncio.get_running_loop().create_server(
            factory, sock=self._sock, backlog=self._backlog)
