"""Running the app on uvicorn: in the foreground for `ds4 serve` (Ctrl+C stops it cleanly and
saves the live session), or on a background thread for tests and the load benchmark."""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
import threading
import time
from typing import Any

import uvicorn

from .app import ServerOptions, create_app

log = logging.getLogger("ds4agent.server")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(128)
    s.setblocking(False)
    return s


def _uvicorn(app: Any) -> uvicorn.Server:
    # HTTP/1.1 keep-alive is on (clients reuse connections); access logs are replaced by the
    # server's own one line per request.
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30,
                            timeout_graceful_shutdown=5,
                            lifespan="off", ws="none")
    return uvicorn.Server(config)


def serve(engine: Any, options: ServerOptions, host: str = "127.0.0.1", port: int = 8000) -> int:
    """Serve until Ctrl+C / SIGTERM; then stop taking requests, cancel the running one and save
    the live session (reason "shutdown") when a session store is configured."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s ds4 serve: %(message)s", "%m%d %H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        sock = _socket(host, port)
    except OSError as e:
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None
    app = create_app(engine, options)
    server = _uvicorn(app)
    log.info("listening on http://%s:%d/v1 (OpenAI and Anthropic APIs)", host, port)
    try:
        server.run(sockets=[sock])  # uvicorn handles SIGINT/SIGTERM: stops accepting, lets streams end
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the signal it handled: the stop was asked for, it is not an error
    finally:
        app.state.server.worker.close(save=True)
        log.info("stopped")
    return 0


class ServerThread:
    """The app on a loopback port, served from a background thread (tests, bench)."""

    def __init__(self, engine: Any, options: ServerOptions | None = None, host: str = "127.0.0.1") -> None:
        self.app = create_app(engine, options or ServerOptions())
        self.sock = _socket(host, 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = _uvicorn(self.app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def worker(self) -> Any:
        return self.app.state.server.worker

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self, save: bool = True) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.worker.close(save=save)
        self.sock.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()
