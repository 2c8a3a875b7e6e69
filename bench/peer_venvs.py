"""The peers' own virtualenvs for bench/loadgen_peers.py: AIPerf and inference-perf, pinned.

Each peer lives in its own venv under the user's cache folder, never in the project's venv:
`${XDG_CACHE_HOME:-~/.cache}/llm-bottleneck/peers/<name>-<version>-py<X.Y>` (the root can be
moved with LLMB_PEERS_DIR). The whole dependency closure is pinned in
`scripts/peers/<name>-requirements.txt` (pip freeze of a working install, installed with
`--no-deps`), so a re-install gets the same code. Idempotent: a stamp in the venv holds the
sha256 of the pins and the interpreter's version; when it matches, nothing is done.

    python bench/peer_venvs.py install --python PYTHON3.12 [--find-links WHEELS --no-index]
    python bench/peer_venvs.py download WHEELS      # a wheelhouse, for a machine without network
    python bench/peer_venvs.py --venv-dir aiperf    # where a peer's venv is

inference-perf 0.7.0 needs Python >= 3.12, so both peers use the 3.12 interpreter that
scripts/install-peers.sh finds (the one SGLang's venv uses).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "scripts" / "peers"
PYTHON_VERSION = "3.12"
STAMP = "llmb-installed.sha256"


@dataclass(frozen=True)
class Peer:
    """One peer load generator: its PyPI name, pinned version and console script."""

    name: str
    version: str
    script: str

    @property
    def requirements(self) -> Path:
        """The pinned closure (pip freeze format)."""
        return PINS / f"{self.name}-requirements.txt"

    @property
    def venv(self) -> Path:
        """Where its venv lives."""
        return peers_root() / f"{self.name}-{self.version}-py{PYTHON_VERSION}"

    @property
    def executable(self) -> Path:
        """Its console script inside the venv."""
        return self.venv / "bin" / self.script

    @property
    def python(self) -> Path:
        """The venv's interpreter."""
        return self.venv / "bin" / "python"


PEERS = {
    "aiperf": Peer("aiperf", "0.13.0", "aiperf"),
    "inference-perf": Peer("inference-perf", "0.7.0", "inference-perf"),
}


def peers_root() -> Path:
    """The folder holding every peer venv (LLMB_PEERS_DIR overrides it)."""
    override = os.environ.get("LLMB_PEERS_DIR")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "llm-bottleneck" / "peers"


def wanted_stamp(peer: Peer) -> str:
    """The stamp an up-to-date venv carries: the pins' sha256 and the Python version."""
    digest = hashlib.sha256(peer.requirements.read_bytes())
    digest.update(PYTHON_VERSION.encode())
    return digest.hexdigest()


def missing_reason(peer: Peer) -> str | None:
    """Why the peer's venv cannot be used (None when it is installed and up to date)."""
    stamp = peer.venv / STAMP
    if not peer.executable.exists():
        return f"{peer.name}: no venv at {peer.venv} (run scripts/install-peers.sh)"
    if not stamp.exists() or stamp.read_text().strip() != wanted_stamp(peer):
        return f"{peer.name}: {peer.venv} is out of date (run scripts/install-peers.sh)"
    return None


def install(peer: Peer, python: str, pip_args: list[str]) -> None:
    """Create (or re-create) the peer's venv from its pins; nothing when up to date."""
    if missing_reason(peer) is None:
        print(f"==> {peer.name} {peer.version} venv up to date: {peer.venv}", flush=True)
        return
    print(f"==> building the {peer.name} {peer.version} venv at {peer.venv}", flush=True)
    shutil.rmtree(peer.venv, ignore_errors=True)
    peer.venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-m", "venv", str(peer.venv)], check=True)
    pip = [str(peer.python), "-m", "pip", "install", "-q", "--no-deps", *pip_args]
    subprocess.run([*pip, "-r", str(peer.requirements)], check=True)
    # Fail here, not in the bench, when the closure is incomplete.
    subprocess.run([str(peer.executable), "--help"], check=True, stdout=subprocess.DEVNULL)
    (peer.venv / STAMP).write_text(wanted_stamp(peer) + "\n")


def download(dest: Path) -> None:
    """Fetch every pinned wheel (CPython 3.12, manylinux x86_64) into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for peer in PEERS.values():
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", PYTHON_VERSION, "--implementation", "cp",
               "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
               "--platform", "manylinux_2_17_x86_64", "--platform", "any",
               "-d", str(dest), "-r", str(peer.requirements)]  # fmt: skip
        subprocess.run(cmd, check=True)


def main() -> None:
    """install | download | --venv-dir NAME."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv-dir", choices=sorted(PEERS), help="print a peer's venv folder")
    sub = parser.add_subparsers(dest="command")
    inst = sub.add_parser("install", help="create the peers' venvs (idempotent)")
    inst.add_argument("--python", required=True, help=f"a Python {PYTHON_VERSION} interpreter")
    inst.add_argument("--find-links", type=Path, help="install from this wheelhouse")
    inst.add_argument("--no-index", action="store_true", help="do not reach any index")
    down = sub.add_parser("download", help="fetch the pinned wheels into a folder")
    down.add_argument("dest", type=Path)
    args = parser.parse_args()
    if args.venv_dir:
        print(PEERS[args.venv_dir].venv)
    elif args.command == "install":
        pip_args = ["--no-index"] if args.no_index else []
        if args.find_links:
            pip_args += ["--find-links", str(args.find_links)]
        for peer in PEERS.values():
            install(peer, args.python, pip_args)
    elif args.command == "download":
        download(args.dest)
    else:
        parser.error("give a command or --venv-dir")


if __name__ == "__main__":
    main()
