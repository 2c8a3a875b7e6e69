"""Real SGLang servers for the system tests: SGLang 0.5.11 on the CPU (`--device cpu
--load-format dummy`) serving the tiny Qwen2 folder in tests/fixtures/sglang-tiny-qwen2, from
the venv that scripts/install-sglang.sh builds (run by `make install`).

Fixtures (each server starts once per test session, on 127.0.0.1 and a free port):

* `sglang_python` (session): the venv's interpreter; fails (never skips) with the reason when
  the venv is missing or incomplete.
* `sglang_server` (session): the main server, `--max-running-requests 8` with a 16384-token
  pool (`SGLANG_SERVER`); ready (`/health` 200, warm-up done) when the fixture returns.
* `sglang_pool_server` (session): a second server whose tiny KV pool (`POOL_SERVER`: 512
  tokens) admits one long prompt at a time, so requests wait while the running count stays far
  below `--max-running-requests`; a burst of short prompts with long outputs makes it retract.
* `sglang_launcher` (function): a factory `sglang_launcher(spec, wait=True)` for servers a test
  owns (e.g. to watch the warm-up); each is stopped at the test's end.

`silent_model_dir(path)` writes a model folder (MODEL_DIR's config, a tokenizer whose every
token is special) for a server that streams every token as empty text
(`ServerSpec(model=...)`; tests/system/test_sglang_empty_text.py).

Requests to these servers need `"ignore_eos": true` with `max_tokens`: the weights are random.

`python -m tests.plugins.sglang --venv-dir` prints where the venv lives (install-sglang.sh uses
it); `--describe` prints what was found; `--capture DIR` writes a server's answers (the fixture
tests/fixtures/sglang-0.5.11-cpu).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SGLANG_VERSION = "0.5.11"
PYTHON_VERSION = "3.12"
MODEL_DIR = ROOT / "tests" / "fixtures" / "sglang-tiny-qwen2"
SERVED_MODEL_NAME = "tiny-qwen2"
# Bytes of KV cache per token of MODEL_DIR: K and V x 4 layers x 2 KV heads x 64 x 2 B (bf16).
KV_BYTES_PER_TOKEN = 2 * 4 * 2 * 64 * 2
STUB_DIR = "lib/llmb-cuda-stub"  # libcuda.so.1 stand-in built by install-sglang.sh
STAMP = "llmb-installed.sha256"
# A cold start on 2 busy cores takes ~90 s (three processes import torch); warm-up included.
START_TIMEOUT_S = 420.0


@dataclass(frozen=True)
class ServerSpec:
    """What a test server is started with (the flags that vary between servers)."""

    max_total_tokens: int
    max_running_requests: int
    context_length: int
    extra: tuple[str, ...] = ()
    model: Path = MODEL_DIR


SGLANG_SERVER = ServerSpec(max_total_tokens=16384, max_running_requests=8, context_length=2048)
# Admission reserves prompt + max_tokens x new_token_ratio x conservativeness: at 0.05 short
# prompts with long answers are all admitted and then outgrow the pool (SGLang retracts), while a
# 350-token prompt still takes most of it (the next one waits).
POOL_SERVER = ServerSpec(
    max_total_tokens=512,
    max_running_requests=16,
    context_length=512,
    extra=("--schedule-conservativeness", "0.05"),
)


class SglangMissing(RuntimeError):
    """The SGLang venv is not there (or not complete): the message says why and what to run."""


def venv_dir() -> Path:
    """Where the SGLang venv lives: outside the clone, in the user's cache folder."""
    override = os.environ.get("LLMB_SGLANG_VENV")
    if override:
        return Path(override)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "llm-bottleneck" / f"sglang-{SGLANG_VERSION}-py{PYTHON_VERSION}"


def find_sglang_python() -> Path:
    """The venv's python, or SglangMissing with the reason."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    if not (venv / STAMP).is_file() or not python.is_file():
        raise SglangMissing(
            f"no complete SGLang {SGLANG_VERSION} venv at {venv}: run `make install` "
            "(scripts/install-sglang.sh; it needs Python 3.12, e.g. from pyenv, and a C compiler)"
        )
    return python


def server_env(python: Path) -> dict[str, str]:
    """The environment of a CPU SGLang server: CPU engine, driver stub, no proxies."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    stub = str(python.parent.parent / STUB_DIR)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (stub, env.get("LD_LIBRARY_PATH")) if p)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONPATH", None)  # the project's packages are not SGLang's
    return env


def server_argv(python: Path, port: int, spec: ServerSpec) -> list[str]:
    """The command line of one CPU server."""
    return [
        str(python),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(spec.model),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--device",
        "cpu",
        "--load-format",
        "dummy",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-metrics",
        "--max-total-tokens",
        str(spec.max_total_tokens),
        "--max-running-requests",
        str(spec.max_running_requests),
        "--context-length",
        str(spec.context_length),
        # Without these SGLang reaches for xgrammar and CUDA-only pieces the CPU venv lacks.
        "--grammar-backend",
        "none",
        "--sampling-backend",
        "pytorch",
        "--disable-cuda-graph",
        # An idle scheduler otherwise spins a whole core, which 2-core CI cannot spare.
        "--sleep-on-idle",
        "--random-seed",
        "0",
        *spec.extra,
    ]


@dataclass
class SglangServer:
    """A running SGLang server started by the tests (its own process group)."""

    url: str
    port: int
    log: Path
    proc: subprocess.Popen[bytes]
    spec: ServerSpec
    argv: list[str] = field(default_factory=list)
    started_at: float = 0.0
    ready_after_s: float | None = None

    def log_text(self) -> str:
        """The server's combined stdout/stderr so far."""
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until `/health` answers 200 (SGLang answers it only after its warm-up)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"SGLang exited with {self.proc.returncode}: {self.log_text()[-3000:]}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    self.ready_after_s = time.monotonic() - self.started_at
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                tail = self.log_text()[-3000:]
                raise TimeoutError(f"SGLang not ready within {timeout:.0f}s: {tail}")
            time.sleep(0.5)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server and its scheduler/detokenizer processes."""
        if self.proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=timeout)
                return
            except subprocess.TimeoutExpired:
                continue


def _free_port() -> int:
    """A free port SGLang accepts: it derives its gRPC port as port + 10000, which must stay a
    valid port, so ephemeral ports above 55535 are refused."""
    import random
    import socket

    for _ in range(200):
        port = random.randrange(20000, 55000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port in 20000-55000")


def start_sglang_server(
    python: Path, workdir: Path, spec: ServerSpec = SGLANG_SERVER, wait: bool = True
) -> SglangServer:
    """Start a CPU SGLang server on 127.0.0.1 and (by default) wait until it is ready."""
    port = _free_port()
    log = workdir / f"sglang-{port}.log"
    argv = server_argv(python, port, spec)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=server_env(python),
            cwd=workdir,
            start_new_session=True,  # one group: stop() reaches the scheduler too
        )
    server = SglangServer(
        f"http://127.0.0.1:{port}", port, log, proc, spec, argv, started_at=time.monotonic()
    )
    if wait:
        server.wait_ready()
    return server


# -- a model whose every generated id decodes to "" ---------------------------------------------
SILENT_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")  # MODEL_DIR's ids first


def silent_model_dir(path: Path) -> Path:
    """MODEL_DIR's config with a tokenizer whose every token is special, written into `path`.

    A prompt encodes one token per word (each of the load generator's prompt words has an id,
    any other word is `<unk>`), so prompts still differ and calibrate. Every id the random
    weights generate decodes to "": SGLang skips special tokens (`skip_special_tokens`, on by
    default), and ids beyond the tokenizer's vocabulary decode to nothing. SGLang then streams
    a chunk per token with empty text, as the H200 runs' models with random ids did.
    """
    from loadgen.prompts import FILLER_WORDS, ID_WORDS

    words = [*SILENT_SPECIALS, "Request", *dict.fromkeys(ID_WORDS + FILLER_WORDS)]
    added = [
        {"id": i, "content": w, "single_word": i >= len(SILENT_SPECIALS), "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for i, w in enumerate(words)
    ]  # fmt: skip
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)},
                  "unk_token": "<unk>"},
    }  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text((MODEL_DIR / "config.json").read_text())
    config = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "unk_token": "<unk>"}))
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    return path


# -- requests to the test servers ----------------------------------------------------------------
def prompt_ids(n: int, seed: int) -> list[int]:
    """`n` token ids, different per seed (no radix-cache hits between requests), no specials."""
    return [3 + (seed * 7919 + k * 104729) % 31990 for k in range(n)]


def complete(url: str, ids: list[int], max_tokens: int, stream: bool = False) -> dict[str, Any]:
    """One /v1/completions request by token ids; returns its `usage` (and the text)."""
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }
    with httpx.Client(timeout=300) as client:
        if not stream:
            resp = client.post(url + "/v1/completions", json=body)
            resp.raise_for_status()
            doc: dict[str, Any] = resp.json()
            return {**doc["usage"], "finish_reason": doc["choices"][0]["finish_reason"]}
        usage: dict[str, Any] = {}
        with client.stream("POST", url + "/v1/completions", json=body) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    usage = chunk.get("usage") or usage
        return usage


def burst(url: str, prompts: list[list[int]], max_tokens: int) -> list[dict[str, Any]]:
    """All `prompts` at once (one thread each); their usages in order."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda ids: complete(url, ids, max_tokens), prompts))


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    try:
        return find_sglang_python()
    except SglangMissing as exc:
        pytest.fail(str(exc), pytrace=False)


def _session_server(
    python: Path, factory: pytest.TempPathFactory, spec: ServerSpec, name: str
) -> Iterator[SglangServer]:
    server = start_sglang_server(python, factory.mktemp(name), spec)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sglang_server(
    sglang_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SglangServer]:
    yield from _session_server(sglang_python, tmp_path_factory, SGLANG_SERVER, "sglang")


@pytest.fixture(scope="session")
def sglang_pool_server(
    sglang_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SglangServer]:
    yield from _session_server(sglang_python, tmp_path_factory, POOL_SERVER, "sglang-pool")


@pytest.fixture
def sglang_launcher(sglang_python: Path, tmp_path: Path) -> Iterator[Callable[..., SglangServer]]:
    started: list[SglangServer] = []

    def launch(spec: ServerSpec = SGLANG_SERVER, wait: bool = True) -> SglangServer:
        server = start_sglang_server(sglang_python, tmp_path, spec, wait=wait)
        started.append(server)
        return server

    yield launch
    for server in started:
        server.stop()


def capture(out: Path) -> None:
    """Start SGLANG_SERVER, load it, and write its answers into `out` (the fixture
    tests/fixtures/sglang-0.5.11-cpu): metrics-idle.txt (after SGLang's own warm-up request),
    metrics-after-load.txt (8 plain + 4 streamed requests of 32 tokens, then the first prompt
    again: a radix-cache hit), server_info.json, get_model_info.json, v1_models.json and
    server.log. Paths of this machine are written as $REPO (the checkout), $SGLANG_VENV and
    $WORKDIR (the server's working folder)."""
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_sglang_server(find_sglang_python(), Path(tmp))
        try:
            answers = {"metrics-idle.txt": httpx.get(server.url + "/metrics").text}
            burst(server.url, [prompt_ids(24, seed=i) for i in range(8)], 32)
            for i in range(4):
                complete(server.url, prompt_ids(24, seed=50 + i), 32, stream=True)
            complete(server.url, prompt_ids(24, seed=0), 32)  # a radix-cache hit
            answers["metrics-after-load.txt"] = httpx.get(server.url + "/metrics").text
            for path in ("server_info", "get_model_info", "v1/models"):
                doc = httpx.get(f"{server.url}/{path}", timeout=30).json()
                answers[path.replace("/", "_") + ".json"] = json.dumps(doc, indent=1) + "\n"
        finally:
            server.stop()
        answers["server.log"] = server.log_text()
        for name, text in answers.items():
            for path, alias in ((venv_dir(), "$SGLANG_VENV"), (ROOT, "$REPO"), (tmp, "$WORKDIR")):
                text = text.replace(str(path), alias)
            (out / name).write_text(text)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--capture":
        capture(Path(sys.argv[2]))
        sys.exit(0)
    if "--venv-dir" in sys.argv:
        print(venv_dir())
        sys.exit(0)
    if "--describe" in sys.argv:
        try:
            print(f"SGLang {SGLANG_VERSION}: {find_sglang_python()}")
        except SglangMissing as exc:
            print(exc)
            sys.exit(1)
        sys.exit(0)
    print(__doc__)
    sys.exit(os.EX_USAGE)
