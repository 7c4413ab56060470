# SPDX-License-Identifier: Apache-2.0
"""The distributions: the long description of the installed metadata, and, under
``make dist-check`` (which sets RMM_FENCES_DIST to the folder holding the sdist and the repaired
wheel, and runs the tests in a fresh venv where that wheel is installed), the files themselves.
No GPU needed."""

import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

import rmm_fences

from helpers.paths import ROOT

DISTRIBUTION = "rmm-fences-cu13"
#: What the extension modules may link outside the wheel: librmm.so and librapids_logger.so
#: from the librmm-cu13 and rapids-logger wheels (not grafted: the Makefile's DIST_EXCLUDE), the
#: rest from the system, as manylinux allows. The CUDA runtime is linked statically.
FROM_DEPENDENCIES = {"librmm.so", "librapids_logger.so"}
FROM_THE_SYSTEM = {
    "libstdc++.so.6",
    "libgcc_s.so.1",
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
}


def _description() -> str:
    meta = importlib.metadata.metadata(DISTRIBUTION)
    assert meta["Description-Content-Type"].startswith("text/markdown")
    return meta.get_payload() or meta["Description"]


def test_the_long_description_stands_alone():
    """PyPI's page (docs/pypi.md): no link into the repository, no make target."""
    text = _description()
    assert text.startswith(f"# {DISTRIBUTION}\n")
    links = re.findall(r"\]\(([^)]*)\)", text)
    assert all(link.startswith("https://") for link in links), links
    assert "`make " not in text and "docs/" not in text
    assert f"pip install {DISTRIBUTION}" in text


@pytest.fixture(scope="module")
def dist() -> pathlib.Path:
    folder = os.environ.get("RMM_FENCES_DIST")
    if not folder:
        pytest.skip("checks the sdist and the wheel of `make dist-check` (RMM_FENCES_DIST unset)")
    return pathlib.Path(folder)


def _one(dist: pathlib.Path, pattern: str) -> pathlib.Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def wheel(dist) -> pathlib.Path:
    return _one(dist, f"rmm_fences_cu13-{rmm_fences.__version__}-*.whl")


@pytest.fixture(scope="module")
def sdist(dist) -> pathlib.Path:
    return _one(dist, f"rmm_fences_cu13-{rmm_fences.__version__}.tar.gz")


def _platform_tags(wheel: pathlib.Path) -> list[str]:
    # {name}-{version}-{python tag}-{abi tag}-{platform tags}.whl
    return wheel.name.removesuffix(".whl").split("-")[4].split(".")


def test_the_wheel_is_tagged_manylinux(wheel):
    tags = _platform_tags(wheel)
    assert tags and all(re.fullmatch(r"manylinux_\d+_\d+_x86_64", t) for t in tags), tags
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"rmm_fences_cu13-{rmm_fences.__version__}.dist-info/WHEEL").decode()
    assert sorted(re.findall(r"^Tag: (.*)$", meta, re.M)) == sorted(f"cp311-abi3-{t}" for t in tags)
    # the oldest glibc that PyPI's page names is the tag's
    glibc = min(tuple(map(int, t.split("_")[1:3])) for t in tags)
    assert f"glibc {glibc[0]}.{glibc[1]} or newer" in _description()


def test_the_wheel_grafts_no_library(wheel):
    with zipfile.ZipFile(wheel) as zf:
        assert not [n for n in zf.namelist() if ".libs/" in n]


def test_the_wheel_and_the_sdist_hold_the_license(wheel, sdist):
    license_text = (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in license_text and b"Version 2.0" in license_text
    info = f"rmm_fences_cu13-{rmm_fences.__version__}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(f"{info}/licenses/LICENSE") == license_text
        meta = zf.read(f"{info}/METADATA").decode()
    top = f"rmm_fences_cu13-{rmm_fences.__version__}"
    with tarfile.open(sdist) as tf:
        assert tf.extractfile(f"{top}/LICENSE").read() == license_text
        pkg_info = tf.extractfile(f"{top}/PKG-INFO").read().decode()
    for text in (meta, pkg_info):
        assert "License-Expression: Apache-2.0" in text
        assert "License-File: LICENSE" in text


def test_the_sdist_holds_what_builds_the_wheel(sdist):
    top = f"rmm_fences_cu13-{rmm_fences.__version__}/"
    with tarfile.open(sdist) as tf:
        names = {m.name.removeprefix(top) for m in tf.getmembers() if m.isfile()}
    for needed in ("pyproject.toml", "CMakeLists.txt", "README.md", "docs/pypi.md", "LICENSE"):
        assert needed in names
    assert "src/rmm_fences/_lib/memory_resource.pyx" in names
    # the repository's tests, benchmarks, tools, docs (their data), hidden and built files: out
    left_out = ("tests/", "asv_bench/", "tools/", "docs/data/", "docs/img/", ".", "build/")
    assert not [n for n in names if n.startswith(left_out)]
    assert [n for n in names if n.startswith("docs/")] == ["docs/pypi.md"]
    assert not [n for n in names if n.endswith((".so", ".pyc"))]


def test_the_installed_package_is_the_wheel(wheel):
    """The tests of this run import rmm_fences from the fresh venv, installed from this wheel."""
    installed = importlib.metadata.distribution(DISTRIBUTION)
    assert pathlib.Path(rmm_fences.__file__).is_relative_to(sys.prefix)
    assert not pathlib.Path(rmm_fences.__file__).is_relative_to(ROOT / "src")
    info = f"rmm_fences_cu13-{rmm_fences.__version__}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        record = zf.read(f"{info}/RECORD").decode().splitlines()
    shipped = {line for line in record if line and not line.startswith(f"{info}/RECORD,")}
    assert shipped <= set(installed.read_text("RECORD").splitlines())


def _needed(so: pathlib.Path) -> set[str]:
    out = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True)
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out.stdout))


def test_the_extensions_link_rmm_from_its_wheel(wheel):
    """What auditwheel left out of the wheel comes with its declared dependencies (librmm-cu13,
    which brings rapids-logger) or is a system library manylinux allows."""
    if shutil.which("readelf") is None:
        pytest.skip("needs readelf (binutils)")
    modules = sorted((pathlib.Path(rmm_fences.__file__).parent / "_lib").glob("*.so"))
    assert modules
    for so in modules:
        needed = _needed(so)
        assert "librmm.so" in needed, (so.name, needed)
        assert needed <= FROM_DEPENDENCIES | FROM_THE_SYSTEM, (so.name, needed)
    requires = importlib.metadata.requires(DISTRIBUTION)
    assert any(r.startswith("librmm-cu13") for r in requires)
