"""``python -m devtools.model_server``: parse the command line and serve until stopped.

Command line::

    python -m devtools.model_server --host 127.0.0.1 --port 0 --dim 64 \\
        [--api-key KEY] [--port-file PATH] [--parent-pid PID] [--verbose]

With ``--parent-pid`` the server exits, as on SIGTERM, once that process is no longer its
parent: the process that started it died, however it died.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from devtools.model_server.server import EmbeddingServer
from devtools.model_server.vectors import DEFAULT_DIM, MAX_DIM

API_KEY_ENV = "REPLAYABLE_LOCAL_API_KEY"
# How often a server tied to its parent checks that the parent is still there (ADR 0079).
PARENT_CHECK_S = 0.5


def _write_port_file(path: Path, port: int) -> None:
    # Readers poll for this file; a rename makes it appear complete or not at all.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    dim: int = DEFAULT_DIM,
    api_key: str | None = None,
    port_file: str | os.PathLike[str] | None = None,
    verbose: bool = False,
    parent_pid: int | None = None,
) -> None:
    """Run the server until SIGTERM or SIGINT, then shut it down cleanly.

    Prints ``listening on URL`` once it accepts connections and, if ``port_file`` is given,
    writes the port there atomically (and removes the file on exit). Signal handlers are
    only installed when called from the main thread. With ``parent_pid`` it also stops
    once that process is no longer its parent (checked every :data:`PARENT_CHECK_S`).
    """
    server = EmbeddingServer(host, port, dim=dim, api_key=api_key, verbose=verbose)
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    port_path = Path(port_file) if port_file is not None else None
    # serve_forever runs in a thread because shutdown() blocks until it returns, so it
    # cannot be called from the thread (here: the signal handler's) that runs it.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="serve", daemon=True
    )
    try:
        thread.start()
        if port_path is not None:
            _write_port_file(port_path, server.server_port)
        print(f"listening on {server.url}", flush=True)
        # A parent that dies is replaced by init or a subreaper, so a changed parent pid
        # means it is gone, even if its pid is reused since. (PR_SET_PDEATHSIG would fire
        # when the *thread* that started this server ends, and is Linux only.)
        while not stop.wait(PARENT_CHECK_S if parent_pid is not None else None):
            if os.getppid() != parent_pid:
                print(f"parent {parent_pid} is gone; stopping", flush=True)
                break
        server.shutdown()
    finally:
        server.server_close()
        for restored, handler in previous.items():
            signal.signal(restored, handler)
        if port_path is not None:
            port_path.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run :func:`serve`; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m devtools.model_server",
        description="Local OpenAI-compatible embeddings and chat server for offline demos and "
        "tests (feature-hash vectors, not semantic embeddings; extractive summaries).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback host to bind")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument("--dim", type=int, default=DEFAULT_DIM, help="default vector size")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV})",
    )
    parser.add_argument("--port-file", help="write the bound port to this file once listening")
    parser.add_argument(
        "--parent-pid", type=int, help="exit once this process is no longer the parent"
    )
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    if not 1 <= args.dim <= MAX_DIM:
        parser.error(f"--dim must be between 1 and {MAX_DIM}")
    try:
        serve(
            args.host,
            args.port,
            args.dim,
            args.api_key,
            args.port_file,
            args.verbose,
            args.parent_pid,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return 0
