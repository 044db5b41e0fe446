"""The local model server as a subprocess of a test or a demo: start, control, stop.

:class:`LocalModelServer` runs ``python -m devtools.model_server`` in its own process group
and talks to its control endpoints; it imports ``httpx`` only when started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from devtools.model_server.cli import API_KEY_ENV
from devtools.model_server.vectors import DEFAULT_DIM
from devtools.model_server.webhooks import webhook_path

if TYPE_CHECKING:
    import httpx


class LocalModelServer:
    """Run the local model server as a subprocess, e.g. ``with LocalModelServer() as s``.

    The subprocess gets its own process group so :meth:`stop` can take down everything it
    started. The API key is passed through the environment so it never shows in ``ps``.

    :param tie_to_parent: the server exits when this process dies, even by SIGKILL, so a
        crashed test or demo leaves no server behind. ``make start`` turns it off: there the
        server outlives the command that started it until ``make stop``.
    """

    def __init__(
        self,
        dim: int = DEFAULT_DIM,
        api_key: str | None = None,
        port: int = 0,
        port_file: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        *,
        startup_timeout: float = 15.0,
        verbose: bool = False,
        tie_to_parent: bool = True,
    ) -> None:
        self.dim = dim
        self.tie_to_parent = tie_to_parent
        self.api_key = api_key
        self._requested_port = port
        self._port_file = Path(port_file) if port_file is not None else None
        self._log_path = Path(log_path) if log_path is not None else None
        self._startup_timeout = startup_timeout
        self._verbose = verbose
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._tmpdir: Path | None = None
        self._client: httpx.Client | None = None

    @property
    def port(self) -> int:
        """Return the port the running server listens on."""
        if self._port is None:
            raise RuntimeError("LocalModelServer is not running; call start() first")
        return self._port

    @property
    def root_url(self) -> str:
        """Return the server's root URL, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """Return the OpenAI-style base URL, which ends in ``/v1``."""
        return f"{self.root_url}/v1"

    @property
    def pid(self) -> int:
        """Return the server's process id, which is also its process group id."""
        if self._proc is None:
            raise RuntimeError("LocalModelServer is not running; call start() first")
        return self._proc.pid

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalModelServer:
        """Start the subprocess and wait until it answers ``/healthz``; no-op if running."""
        if self._proc is not None:
            return self
        import httpx

        if self._port_file is None or self._log_path is None:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="replayable-local-model-"))
        port_file = self._port_file or cast(Path, self._tmpdir) / "port"
        # A port file left by an earlier run would point the readiness check at a dead port.
        port_file.unlink(missing_ok=True)
        log_path = self._log_path or cast(Path, self._tmpdir) / "server.log"
        # The repository root, where ``devtools`` lives (a source checkout; never installed).
        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
        # An inherited key would silently switch on auth that the caller did not ask for.
        env.pop(API_KEY_ENV, None)
        if self.api_key:
            env[API_KEY_ENV] = self.api_key
        cmd = [
            sys.executable,
            "-m",
            "devtools.model_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self._requested_port),
            "--dim",
            str(self.dim),
            "--port-file",
            str(port_file),
        ]
        if self._verbose:
            cmd.append("--verbose")
        if self.tie_to_parent:
            cmd += ["--parent-pid", str(os.getpid())]
        with log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Loopback traffic must not be routed through a proxy taken from the environment.
        self._client = httpx.Client(trust_env=False, timeout=10.0)
        try:
            self._port = self._wait_ready(port_file, log_path)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, port_file: Path, log_path: Path) -> int:
        import httpx

        assert self._proc is not None and self._client is not None
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            returncode = self._proc.poll()
            if returncode is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"local model server exited with code {returncode} during startup:\n{tail}"
                )
            with contextlib.suppress(OSError, ValueError):
                port = int(port_file.read_text().strip())
                with contextlib.suppress(httpx.HTTPError):
                    response = self._client.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
                    if response.status_code == 200:
                        return port
            time.sleep(0.05)
        raise TimeoutError(
            f"local model server did not become healthy within {self._startup_timeout} s"
        )

    def stop(self) -> None:
        """Stop the server: SIGTERM its process group, then SIGKILL after 5 s; idempotent."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        finally:
            self._port = None
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
                self._tmpdir = None

    def _control(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        if self._client is None:
            raise RuntimeError("LocalModelServer is not running; call start() first")
        response = self._client.request(method, f"{self.root_url}{path}", json=body)
        if response.status_code == 400:
            raise ValueError(response.json()["error"]["message"])
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        """Return the server's ``GET /stats`` counters."""
        return cast("dict[str, Any]", self._control("GET", "/stats"))

    def arrivals(self) -> list[float]:
        """When each of the newest requests arrived, in the server's monotonic seconds."""
        return cast("list[float]", self._control("GET", "/stats/arrivals")["arrivals"])

    def reset_stats(self) -> None:
        """Zero the counters, forget idempotency keys, drop webhook events and every stored
        file and batch.

        ``in_flight`` is a live gauge and stays.
        """
        self._control("POST", "/stats/reset")

    def faults(self) -> dict[str, Any]:
        """Return the server's current fault config."""
        return cast("dict[str, Any]", self._control("GET", "/faults"))

    def set_faults(
        self, config: Mapping[str, Any] | None = None, /, **fields: Any
    ) -> dict[str, Any]:
        """Replace the fault config, given as a mapping, keywords or both; return it.

        Raises ``ValueError`` with the server's message when the config is invalid.
        """
        merged = {**(config or {}), **fields}
        return cast("dict[str, Any]", self._control("PUT", "/faults", merged))

    def clear_faults(self) -> None:
        """Remove every fault and release requests held by latency, hangs or trickling."""
        self._control("DELETE", "/faults")

    def webhook_url(self, name: str) -> str:
        """Return the URL of webhook receiver ``name``; raise ``ValueError`` if it is invalid."""
        return f"{self.root_url}{webhook_path(name)}"

    def webhook_events(self, name: str) -> list[dict[str, Any]]:
        """Return the events webhook ``name`` stored, oldest first: key, body, received_at."""
        response = self._control("GET", webhook_path(name))
        return cast("list[dict[str, Any]]", response["events"])
