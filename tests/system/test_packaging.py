"""Packaging: the exporter needs only the base dependencies; plotting and GGUF writing are extras.

Unit: the extras in pyproject.toml, the exporter's imports, its GGML tables against `gguf`.
Integration: a fresh virtualenv with `pip install .` (base dependencies only) runs the
exporter without matplotlib, numpy or gguf installed.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import venv
from pathlib import Path

import gguf
import pytest
import tomllib

from model import ggml_types
from tests.paths import ROOT
from tests.system.test_readme import fresh_copy

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# The project's own top-level packages (the wheel's).
PACKAGES = tuple(
    p.rstrip("*")
    for p in tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["packages"]["find"]["include"]
)
# Import name -> distribution name, for the third-party packages the code imports.
DISTRIBUTION = {
    "prometheus_client": "prometheus-client",
    "pynvml": "nvidia-ml-py",
    "httpx": "httpx",
    "aiohttp": "aiohttp",
    "yaml": "pyyaml",
    "pydantic": "pydantic",
    "tqdm": "tqdm",
    "orjson": "orjson",
    "bcrypt": "bcrypt",
    "uvloop": "uvloop",
    "matplotlib": "matplotlib",
    "gguf": "gguf",
    "numpy": "numpy",
}
# In the base set for the load generator, which ships in the same package; small and pure.
LOADGEN_ONLY = {"tqdm", "orjson"}
# Imported by no module of ours but by httpx's stack on every request (a failed import each
# time costs ~0.3 ms), so it is declared for speed.
IMPORTED_BY_DEPENDENCIES = {"sniffio"}


def names(requirements: list[str]) -> set[str]:
    """Distribution names of requirement strings."""
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def third_party_imports(package: str) -> set[str]:
    """Top-level modules imported anywhere in `package` that are not stdlib or ours."""
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    ours = set(PACKAGES)
    return {m for m in found if m not in sys.stdlib_module_names and m not in ours}


class TestDeclared:
    def test_exporter_imports_only_base_dependencies(self) -> None:
        # The exporter and the ground floor it stands on (its config, model geometry, core).
        imports = set().union(
            *(third_party_imports(p) for p in ("exporter", "config", "model", "core"))
        )
        assert imports <= set(DISTRIBUTION), imports - set(DISTRIBUTION)
        used = {DISTRIBUTION[m] for m in imports}
        base = names(PYPROJECT["dependencies"])
        assert used <= base
        # The base set is the exporter's imports plus the load generator's two helpers.
        assert base - used == {DISTRIBUTION[m] for m in LOADGEN_ONLY} | IMPORTED_BY_DEPENDENCIES

    def test_plotting_and_gguf_writer_are_extras(self) -> None:
        extras = PYPROJECT["optional-dependencies"]
        base = names(PYPROJECT["dependencies"])
        assert not base & {"matplotlib", "gguf", "numpy"}
        assert names(extras["report"]) == {"matplotlib"}
        assert names(extras["synth"]) == {"gguf", "numpy"}
        assert extras["full"] == ["llm-bottleneck[report,synth]"]
        assert "llm-bottleneck[full]" in extras["dev"]
        # Every third-party import of the project is declared somewhere.
        every = set().union(*(third_party_imports(p) for p in PACKAGES))
        declared = base | names(extras["report"]) | names(extras["synth"])
        assert {DISTRIBUTION[m] for m in every} <= declared

    def test_ggml_tables_match_gguf(self) -> None:
        sizes = {int(t): (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGML_QUANT_SIZES}
        assert ggml_types.GGML_TYPES == sizes
        files = {int(t): t.name.removeprefix("MOSTLY_") for t in gguf.LlamaFileType}
        assert ggml_types.FILE_TYPES == files
        assert ggml_types.tensor_bytes(64, 2) == 36  # two Q4_0 blocks
        with pytest.raises(ValueError, match="unknown ggml type 99"):
            ggml_types.tensor_bytes(1, 99)


@pytest.mark.timeout(900)
def test_exporter_runs_with_base_dependencies_only(tmp_path: Path) -> None:
    """`pip install .` in a fresh virtualenv: no plotting stack, no numpy; the exporter runs."""
    repo = fresh_copy(tmp_path / "clone")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(repo)],
        check=True,
        timeout=840,
    )
    installed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    for heavy in ("matplotlib", "numpy", "gguf"):
        assert f"\n{heavy}==" not in f"\n{installed}", heavy
    modules = sorted(
        "exporter." + str(p.relative_to(ROOT / "exporter").with_suffix("")).replace("/", ".")
        for p in (ROOT / "exporter").rglob("*.py")
        if p.name not in {"__init__.py", "__main__.py"}
    )
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "import exporter.__main__\n"
        "bad = {'matplotlib', 'numpy', 'gguf'} & set(sys.modules)\n"
        # Of the load generator only its config section's model (pydantic alone).
        "bad |= {m for m in sys.modules if m.split('.')[0] in ('loadgen', 'diagnose')}\n"
        "bad -= {'loadgen', 'config.loadgen'}\n"
        "assert not bad, bad\n"
        "print('ok', len(sys.modules))\n"
    )
    result = subprocess.run(
        [str(python), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr
    config = ROOT / "deploy" / "compose" / "llamacpp.yaml"
    check = subprocess.run(
        [str(env_dir / "bin" / "llmb-exporter"), "--check-only", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr
    assert "configuration OK: 1 engines" in check.stdout + check.stderr
