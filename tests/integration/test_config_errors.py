"""Every bad config exits 2 with a one-line-per-problem message and no traceback.

Each case is one reproduction from issue 12 (7 of 25 bad configs escaped as tracebacks or
were accepted). Unit tests call `load_config`; the CLI tests run `python -m exporter`.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from config.settings import ConfigError, load_config
from tests.paths import ROOT
from tests.plugins.cli import run_module

ENGINE = '  - {name: a, kind: llamacpp, url: "%s"}\n'


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMB")}
    return run_module("exporter", *args, env={**base, "PYTHONPATH": str(ROOT), **(env or {})})


BAD_FILES: dict[str, tuple[bytes, str]] = {
    "binary": (bytes(range(256)) * 8, "not UTF-8 text"),
    "binary that is valid UTF-8": (b"\x00\x01\x02\x03listen: x\x00", "a binary file"),
    "invalid UTF-8": (b'host: "caf\xe9"\n', "not UTF-8 text"),
    "invalid UTF-16": (b"\xff\xfeh\x00o\x00\x00\xd8s\x00t\x00", "not UTF-16-LE text"),
    "YAML nested 5000 deep": (b"loadgen: " + b"[" * 5000 + b"]" * 5000, "nested deeper"),
    "YAML nested 150 deep": (b"loadgen: {a: " + b"[" * 150 + b"]" * 150 + b"}", "nested deeper"),
    "empty file": (b"", "the file is empty"),
    "only comments": (b"# nothing here\n", "the file is empty"),
    "port out of range": (
        b"engines:\n" + (ENGINE % "http://h:99999").encode(),
        "engines.0(a).url: not a valid URL",
    ),
    "port not a number": (
        b"engines:\n" + (ENGINE % "http://h:abc").encode(),
        "engines.0(a).url: not a valid URL",
    ),
    "space in the host": (
        b"engines:\n" + (ENGINE % "http://exa mple.com").encode(),
        "engines.0(a).url: must not contain spaces",
    ),
    "no host": (b"engines:\n" + (ENGINE % "http://:8080").encode(), "with a host"),
    "infinite timeout": (b"scrape_timeout_seconds: 1e400\n", "must be a finite number"),
    "NaN interval": (b"gpu: {peak_window_seconds: .nan}\n", "must be a finite number"),
    "negative min_interval": (b"min_interval: -1\n", "min_interval: Input should be greater"),
    "bad YAML": (b"engines: [\n", "not valid YAML"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_is_a_config_error(tmp_path: Path, case: str) -> None:
    content, expected = BAD_FILES[case]
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert expected in "\n".join(info.value.errors)


@pytest.mark.parametrize("case", ["binary", "invalid UTF-16", "YAML nested 5000 deep"])
def test_cli_exits_2_without_traceback(tmp_path: Path, case: str) -> None:
    content, expected = BAD_FILES[case]
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    for args in (["--check-only"], []):
        proc = _cli("--config", str(path), *args)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert expected in proc.stderr


def test_utf16_with_bom_is_read(tmp_path: Path) -> None:
    path = tmp_path / "utf16.yaml"
    path.write_bytes('listen: "127.0.0.1:9999"\nhost: café\n'.encode("utf-16"))
    config = load_config(path, environ={})
    assert (config.listen_port, config.host) == (9999, "café")


def test_every_url_error_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "scrape_timeout_seconds: 1e400\nengines:\n"
        '  - {name: a, kind: llamacpp, url: "http://h:99999"}\n'
        '  - {name: b, kind: llamacpp, url: "http://h:abc"}\n'
        '  - {name: c, kind: sglang, url: "http://exa mple.com"}\n'
    )
    proc = _cli("--config", str(path), "--check-only")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "(4 errors)" in proc.stderr
    for where in ("engines.0(a).url", "engines.1(b).url", "engines.2(c).url"):
        assert where in proc.stderr
    assert "scrape_timeout_seconds: must be a finite number" in proc.stderr


def test_bad_environment_override_is_a_config_error(tmp_path: Path) -> None:
    proc = _cli("--check-only", env={"LLMB__LISTEN": "[", "LLMB__ENGINES": "7"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "environment LLMB__LISTEN: not valid YAML" in proc.stderr


def test_env_only_config_without_a_file_is_still_fine() -> None:
    proc = _cli("--check-only", env={"LLMB__GPU__ENABLED": "false"})
    assert proc.returncode == 0, proc.stderr
    assert "0 engines, gpu off" in proc.stdout


def test_listen_address_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _cli("--listen", f"127.0.0.1:{port}", env={"LLMB__GPU__ENABLED": "false"})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in proc.stderr


def test_listen_address_not_on_this_host() -> None:
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never assigned to a real interface.
    proc = _cli("--listen", "192.0.2.1:9490", env={"LLMB__GPU__ENABLED": "false"})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "cannot listen on 192.0.2.1:9490: Cannot assign requested address" in proc.stderr


def test_listen_host_with_a_space(tmp_path: Path) -> None:
    proc = _cli("--check-only", "--listen", "exa mple:9490")
    assert proc.returncode == 2
    assert "listen: the host must not contain spaces" in proc.stderr
