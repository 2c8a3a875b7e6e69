"""The layout's contracts, read from the source: sizes, and which package may import which.

A module over ~500 lines or a function over 80 is where a newcomer gets lost; `loadgen` is
below `diagnose` (diagnose drives the load generator, never the other way round, except
the one command line that registers every subcommand), and the exporter's internals are
read through one seam, `loadgen.exporter_series`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import ROOT

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
# The packages held to the sizes.
SIZED = ("core", "diagnose", "loadgen")
# Exporter internals that only the one seam (loadgen/exporter_series.py) imports.
EXPORTER_INTERNALS = (
    "exporter.app",
    "exporter.runner",
    "exporter.promtext",
    "exporter.collectors",
    "pynvml",
)
SEAM = "loadgen/exporter_series.py"


def _modules(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("package", SIZED)
def test_no_file_over_500_lines_and_no_function_over_80(package: str) -> None:
    too_long = []
    for path in _modules(package):
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES:
            too_long.append(f"{_rel(path)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{_rel(path)}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, "\n".join(too_long)


def test_the_size_check_sees_a_long_function(tmp_path: Path) -> None:
    """The AST measure counts a function's whole body (decorators aside)."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"def f():\n{body}\n")
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert (fn.end_lineno or 0) - fn.lineno + 1 == MAX_FUNCTION_LINES + 1


# The floors: a module imports only packages on its own floor or below (docs/architecture.md).
FLOORS: dict[str, int] = {
    "core": 0,
    "config": 0,
    "model": 0,
    "exporter": 1,
    "loadgen": 2,
    "diagnose": 3,
    "mixin": 4,
    "tools": 4,
    "simulator": 5,  # writes same-shape GGUF files with tools.synth_model
    "cli": 6,
}
# Ground-floor packages import nothing of ours but their own floor-mates named here.
GROUND_IMPORTS = {"core": set(), "model": set(), "config": set()}


def _climbs(path: Path, own: str = "") -> list[str]:
    """The imports of `path` that reach a package on a higher floor than its own."""
    own = own or _rel(path).split("/")[0]
    return sorted(m for m in _imports(path) if FLOORS.get(m.split(".")[0], -1) > FLOORS[own])


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_no_import_climbs_a_floor(package: str) -> None:
    bad = [f"{_rel(p)}: {_climbs(p)}" for p in _modules(package) if _climbs(p)]
    assert not bad, "\n".join(bad)


def test_the_floor_check_sees_a_climb(tmp_path: Path) -> None:
    """A loadgen module importing diagnose is a climb; one importing core is not."""
    fake = tmp_path / "probe.py"
    fake.write_text("import core\nfrom diagnose.cli import DIAGNOSE\n", encoding="utf-8")
    assert _climbs(fake, own="loadgen") == ["diagnose.cli", "diagnose.cli.DIAGNOSE"]
    assert _climbs(fake, own="diagnose") == []


@pytest.mark.parametrize("package", sorted(GROUND_IMPORTS))
def test_the_ground_floor_imports_nothing_of_ours(package: str) -> None:
    ours = set(FLOORS) - {package} - GROUND_IMPORTS[package]
    bad = [_rel(p) for p in _modules(package) if any(m.split(".")[0] in ours for m in _imports(p))]
    assert not bad


def test_config_and_model_are_not_read_through_the_exporter() -> None:
    """The config and the model geometry live on the ground floor, not under exporter/."""
    assert not (ROOT / "exporter" / "config.py").exists()
    assert not (ROOT / "exporter" / "model").exists()


def test_exporter_internals_are_read_through_one_seam() -> None:
    """diagnose and loadgen reach the exporter's runner, parser, collectors and NVML only
    through loadgen/exporter_series.py (they may use its config types and model geometry)."""
    bad = []
    for path in _modules("loadgen", "diagnose"):
        if _rel(path) == SEAM:
            continue
        hits = sorted(
            m
            for m in _imports(path)
            if any(m == i or m.startswith(i + ".") for i in EXPORTER_INTERNALS)
        )
        if hits:
            bad.append(f"{_rel(path)}: {hits}")
    assert not bad, "\n".join(bad)
    assert "exporter.app.build_runner" in _imports(ROOT / SEAM)


def test_nothing_climbs_back_into_the_command_line() -> None:
    """The subcommand modules (loadgen/cli.py, diagnose/cli.py) are imported by the
    composition root only: the procedure, its steps and the monitor never reach back up."""
    importers = {
        _rel(p): sorted(m for m in _imports(p) if m in ("diagnose.cli", "loadgen.cli"))
        for p in _modules(*FLOORS)
    }
    assert {path for path, hits in importers.items() if hits} == {"cli/loadgen.py"}
    assert importers["cli/loadgen.py"] == ["diagnose.cli", "loadgen.cli"]


# No facades: a package's __init__ names where things live; it re-exports at most a few.
MAX_REEXPORTS = 10


def _reexports(path: Path) -> set[str]:
    """The names a package's `__init__.py` imports only to hand on (unused in its own code),
    and every name its `__all__` lists."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported: set[str] = set()
    listed: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            imported.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            listed.update(ast.literal_eval(node.value))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return (imported - used) | listed


def test_no_package_init_is_a_facade() -> None:
    inits = [p for p in _modules(*FLOORS) if p.name == "__init__.py"]
    assert len(inits) > 10, inits
    big = {_rel(p): len(n) for p in inits if len(n := _reexports(p)) > MAX_REEXPORTS}
    assert not big, big


def test_the_facade_check_counts_reexports(tmp_path: Path) -> None:
    init = tmp_path / "__init__.py"
    init.write_text(
        '"""doc"""\nfrom __future__ import annotations\n\nfrom a.b import c, d as e, k\n'
        'import f.g\n__all__ = ["c", "h"]\nx = k(1)\n',
        encoding="utf-8",
    )
    assert _reexports(init) == {"c", "e", "f", "h"}


def _names_used(paths: list[Path]) -> set[str]:
    """Every identifier the modules at `paths` import, read or reach as an attribute."""
    used: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.alias):
                used.add((node.asname or node.name).split(".")[-1])
    return used


def test_core_exports_only_what_is_used_outside_core() -> None:
    """`core/__init__` exports no name that nothing outside core (product or tests) uses."""
    exported = _reexports(ROOT / "core" / "__init__.py")
    outside = [p for p in _modules(*FLOORS, "tests", "bench") if _rel(p).split("/")[0] != "core"]
    unused = sorted(exported - _names_used(outside))
    assert not unused, unused
    # The scan sees names used outside core: the evaluator is.
    assert "evaluate" in _names_used(outside)
