"""What the ``carillon`` distribution installs (docs/architecture.md, "Packages and import names").

Two top-level import packages, ``engine`` and ``simulations``, each listed in pyproject.toml with
every subpackage and each carrying ``py.typed``; one version, written as ``engine.__version__``.
The wheel tests build the real wheel (about a second, offline: no isolated build environment).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import engine

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("engine", "simulations")


def pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def source_files(top: str) -> list[Path]:
    """The files of one top-level package in the source tree, relative to the repository."""
    return sorted(
        path.relative_to(ROOT)
        for path in (ROOT / top).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )


def package_folders() -> set[str]:
    """Every folder that holds a module, dotted: what Python imports as a package."""
    return {
        ".".join(path.parent.parts) for top in TOP_LEVEL for path in source_files(top)
        if path.suffix == ".py"
    }  # fmt: skip


def test_the_version_is_written_once() -> None:
    project = pyproject()
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "engine.__version__"}
    # setuptools reads the attribute statically, without importing engine: one plain literal.
    tree = ast.parse((ROOT / "engine" / "__init__.py").read_text())
    literals = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [getattr(target, "id", None) for target in node.targets] == ["__version__"]
        and isinstance(node.value, ast.Constant)
    ]
    assert literals == [engine.__version__]
    assert re.fullmatch(r"\d+\.\d+\.\d+", engine.__version__)


def test_every_package_folder_is_listed_and_nothing_else() -> None:
    listed = pyproject()["tool"]["setuptools"]["packages"]
    assert sorted(listed) == sorted(package_folders())
    assert len(listed) == len(set(listed))
    for package in listed:  # regular packages: no namespace package is left to discovery
        assert (ROOT / package.replace(".", "/") / "__init__.py").is_file(), package


def test_each_top_level_package_ships_py_typed() -> None:
    package_data = pyproject()["tool"]["setuptools"]["package-data"]
    for top in TOP_LEVEL:
        assert (ROOT / top / "py.typed").is_file()
        assert "py.typed" in package_data[top]


def test_mypy_checks_both_packages() -> None:
    config = pyproject()["tool"]["mypy"]
    assert config["strict"] is True
    assert config["packages"] == list(TOP_LEVEL)


@dataclass(frozen=True)
class Wheel:
    names: frozenset[str]
    metadata: str
    entry_points: str
    build_output: str


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77, the build backend: make install")
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"  # a copy, so the build leaves nothing in the working tree
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for top in TOP_LEVEL:
        shutil.copytree(ROOT / top, source / top, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation",
         "--disable-pip-version-check", "-v", "-w", str(work / "dist"), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    [path] = (work / "dist").glob("carillon-*.whl")
    with zipfile.ZipFile(path) as archive:
        names = frozenset(archive.namelist())
        dist_info = f"carillon-{engine.__version__}.dist-info"
        return Wheel(
            names=names,
            metadata=archive.read(f"{dist_info}/METADATA").decode(),
            entry_points=archive.read(f"{dist_info}/entry_points.txt").decode(),
            build_output=built.stdout + built.stderr,
        )


def test_the_wheel_installs_two_import_packages_and_its_metadata(wheel: Wheel) -> None:
    assert {name.split("/")[0] for name in wheel.names} == {
        "engine",
        "simulations",
        f"carillon-{engine.__version__}.dist-info",
    }
    assert f"\nVersion: {engine.__version__}\n" in wheel.metadata
    assert re.search(r"^carillon = engine\.cli:main$", wheel.entry_points, re.MULTILINE)


def test_the_wheel_holds_every_module_py_typed_and_the_engine_data(wheel: Wheel) -> None:
    shipped = {name for name in wheel.names if name.split("/")[0] in TOP_LEVEL}
    engine_files = {path.as_posix() for path in source_files("engine")}
    simulation_modules = {
        path.as_posix() for path in source_files("simulations") if path.suffix == ".py"
    }
    # All of engine/ (modules, py.typed, migrations, console templates and assets); of
    # simulations/ the modules and py.typed, not its README or the sweep's seed file.
    assert shipped == engine_files | simulation_modules | {"simulations/py.typed"}
    assert "engine/py.typed" in shipped


def test_the_build_warns_of_nothing(wheel: Wheel) -> None:
    # e.g. setuptools' "Package 'engine.api.console.static' is absent from the `packages`
    # configuration", the sign of a folder shipped by accident or about to stop shipping.
    assert not re.findall(r"\w+Warning: .*", wheel.build_output)
