"""The model server on a socket: :class:`ServerState` served by :class:`Handler`.

:class:`EmbeddingServer` binds loopback hosts only and serves with
:class:`~devtools.model_server.handler.Handler`, which asks its
:class:`~devtools.model_server.state.ServerState` for the fault config a request runs
under, the dice that decide each fault, the counters and the files and batches.
"""

from __future__ import annotations

import socket
import socketserver
from http.server import ThreadingHTTPServer
from typing import Unpack

from devtools.model_server.handler import Handler
from devtools.model_server.state import ServerState, StateOptions

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def require_loopback(host: str) -> str:
    """Return ``host`` if it is a loopback name, else raise ``ValueError`` naming it."""
    if host not in LOOPBACK_HOSTS:
        allowed = ", ".join(sorted(LOOPBACK_HOSTS))
        raise ValueError(f"refusing to bind non-loopback host {host!r}; use one of {allowed}")
    return host


class EmbeddingServer(ServerState, ThreadingHTTPServer):
    """A threading HTTP server for the embeddings and chat API; binds loopback hosts only.

    ``options`` are those of :class:`~devtools.model_server.state.ServerState`.
    """

    # Hung requests sleep in their own threads; neither shutdown nor exit may wait for them.
    daemon_threads = True
    block_on_close = False

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, **options: Unpack[StateOptions]
    ) -> None:
        require_loopback(host)
        ServerState.__init__(self, **options)
        if ":" in host:
            self.address_family = socket.AF_INET6
        ThreadingHTTPServer.__init__(self, (host, port), Handler)

    def server_bind(self) -> None:
        """Bind without the reverse DNS lookup ``HTTPServer`` does, which can stall startup."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.socket.getsockname()[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    @property
    def url(self) -> str:
        """Return the root URL the server answers on, e.g. ``http://127.0.0.1:8000``."""
        host = f"[{self.server_name}]" if ":" in self.server_name else self.server_name
        return f"http://{host}:{self.server_port}"
