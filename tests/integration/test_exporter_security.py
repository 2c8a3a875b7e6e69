"""`--web.config.file`: TLS + basic auth in exporter-toolkit format, scraped by a real Prometheus.

Certificates are made at test time with the `openssl` CLI (a throw-away CA and a server
certificate for 127.0.0.1); nothing secret is committed. The Prometheus job settings are
the commented example of `prometheus/prometheus.yml`, uncommented, so the example is
tested too.
"""

from __future__ import annotations

import base64
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
import yaml

from exporter.web_config import BasicAuth, load_web_config
from tests.conftest import get_free_port
from tests.paths import ROOT
from tests.plugins.cli import run_module
from tests.plugins.prom import start_prometheus, stop_process

H200 = ROOT / "tests" / "fixtures" / "llamacpp-h200-gemma3-27b-shape-q4_0"
PASSWORD = "correct horse battery staple"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(folder: Path) -> tuple[Path, Path, Path]:
    """A test CA and a server certificate for 127.0.0.1 signed by it: (ca, cert, key)."""
    assert shutil.which("openssl"), "the openssl CLI is part of the base system"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
        "-subj", "/CN=llmb test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1",
        cwd=folder,
    )  # fmt: skip
    (folder / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n", encoding="utf-8"
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "ext.cnf",
        cwd=folder,
    )  # fmt: skip
    return folder / "ca.crt", folder / "server.crt", folder / "server.key"


def _trust(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def _hash(password: str) -> str:
    # Cost 4 keeps the test fast; production hashes use 10-12 (docs/security.md).
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMB__GPU__ENABLED": "false"}
    return run_module("exporter", *args, env=env)


# --- unit: the web config file ------------------------------------------------------------


def test_relative_paths_are_relative_to_the_web_config(tmp_path: Path) -> None:
    make_certs(tmp_path)
    path = tmp_path / "web.yml"
    path.write_text(
        "tls_server_config: {cert_file: server.crt, key_file: server.key}\n"
        f"basic_auth_users: {{prometheus: '{_hash(PASSWORD)}'}}\n"
    )
    config = load_web_config(path)
    assert config.tls_server_config is not None
    assert config.tls_server_config.cert_file == tmp_path / "server.crt"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("basic_auth_users: {prometheus: plaintext}\n", "user 'prometheus': not a bcrypt hash"),
        ("tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n", "cannot load"),
        ("tls_server_config: {cert_file: server.crt}\n", "tls_server_config.key_file: Field"),
        ("tls_server_config: {cert_file: a, key_file: b, cipher_suites: [x]}\n", "unknown key"),
        (
            "tls_server_config: {cert_file: server.crt, key_file: server.key,"
            " client_auth_type: RequireAndVerifyClientCert}\n",
            "needs client_ca_file",
        ),
        ("http_server_config: {http2: false}\n", "http_server_config: unknown key"),
        ("[1, 2]\n", "must be a mapping"),
        ("\xc3(", "not UTF-8"),
    ],
)
def test_bad_web_config_exits_2_with_a_message(tmp_path: Path, content: str, expected: str) -> None:
    make_certs(tmp_path)
    path = tmp_path / "web.yml"
    path.write_bytes(content.encode("latin-1"))
    for args in (["--check-only"], []):
        proc = _run_cli("--web.config.file", str(path), *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        assert "--web.config.file" in proc.stderr and expected in proc.stderr, proc.stderr


async def test_basic_auth_checks_bcrypt_once_per_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import exporter.web_config as web_config

    calls = []
    real = web_config._checkpw
    monkeypatch.setattr(web_config, "_checkpw", lambda p, h: calls.append(p) or real(p, h))
    auth = BasicAuth({"prometheus": _hash(PASSWORD)})

    def header(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    for _ in range(3):
        assert await auth.allows(header("prometheus", PASSWORD))
    assert len(calls) == 1  # remembered after the first success
    assert not await auth.allows(header("prometheus", "wrong"))
    assert not await auth.allows(header("someone", PASSWORD))  # still runs bcrypt (timing)
    assert len(calls) == 3
    assert not await auth.allows(None)
    assert not await auth.allows("Bearer abc")
    assert not await auth.allows("Basic !!!")


# --- integration: real exporter, real Prometheus -------------------------------------------


def commented_job_example() -> dict[str, Any]:
    """The commented `--web.config.file` example of prometheus/prometheus.yml, uncommented."""
    lines = (ROOT / "prometheus" / "prometheus.yml").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if "--web.config.file" in line) + 1
    block = []
    for line in lines[start:]:
        if not line.strip().startswith("#"):
            break
        block.append(line.replace("# ", "", 1))
    settings: dict[str, Any] = yaml.safe_load("\n".join(block))
    return settings


@pytest.fixture
def secured_exporter(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The exporter on https with basic auth: (base URL, CA file)."""
    ca, cert, key = make_certs(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
                "basic_auth_users": {"prometheus": _hash(PASSWORD)},
            }
        )
    )
    port = get_free_port()
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": f"127.0.0.1:{port}",
                "gpu": {"fake_file": [str(H200 / "nvml_2_loaded.json")]},
            }
        )
    )
    log = (tmp_path / "exporter.log").open("wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMB")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--config", str(config), "--web.config.file", str(web)],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "exporter.log").read_text()
            try:
                httpx.get(url + "/healthz", verify=_trust(ca), timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "exporter did not start"
                time.sleep(0.1)
        yield url, ca
    finally:
        stop_process(proc)


def test_exporter_refuses_without_credentials(secured_exporter: tuple[str, Path]) -> None:
    url, ca = secured_exporter
    for path in ("/metrics", "/healthz", "/"):
        resp = httpx.get(url + path, verify=_trust(ca), timeout=10)
        assert resp.status_code == 401
        assert resp.headers["WWW-Authenticate"].startswith("Basic")
    wrong = httpx.get(url + "/metrics", verify=_trust(ca), auth=("prometheus", "nope"), timeout=10)
    assert wrong.status_code == 401
    ok = httpx.get(url + "/metrics", verify=_trust(ca), auth=("prometheus", PASSWORD), timeout=10)
    assert ok.status_code == 200
    assert "llmb_gpu_memory_used_bytes" in ok.text
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets no answer
        httpx.get(url.replace("https", "http") + "/metrics", timeout=5).raise_for_status()


@pytest.mark.prometheus
def test_real_prometheus_scrapes_over_tls_with_basic_auth(
    tmp_path: Path, secured_exporter: tuple[str, Path]
) -> None:
    url, ca = secured_exporter
    target = url.removeprefix("https://")
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    job = commented_job_example()
    assert job["scheme"] == "https" and job["basic_auth"]["username"] == "prometheus"
    job["basic_auth"]["password_file"] = str(password_file)
    job["tls_config"]["ca_file"] = str(ca)
    # The second job scrapes the same exporter over TLS without credentials: refused.
    anonymous = {"scheme": "https", "tls_config": {"ca_file": str(ca)}}
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    prom = start_prometheus(
        workdir,
        get_free_port(),
        {"llmb-exporter": [target], "llmb-loadgen": [target]},
        job_settings={"llmb-exporter": job, "llmb-loadgen": anonymous},
    )
    try:

        def scraped() -> bool:
            up = {r["metric"]["job"]: r["value"][1] for r in prom.query("up")}
            return up == {"llmb-exporter": "1", "llmb-loadgen": "0"}

        prom.wait_until(scraped, 60, "one authenticated and one refused scrape", every=0.5)
        used = prom.query('llmb_gpu_memory_used_bytes{job="llmb-exporter"}')
        assert [float(r["value"][1]) for r in used] == [17338007552.0]
        targets = prom.get("/api/v1/targets")["activeTargets"]
        refused = next(t for t in targets if t["labels"]["job"] == "llmb-loadgen")
        assert "401" in refused["lastError"], refused
    finally:
        stop_process(prom.process)
