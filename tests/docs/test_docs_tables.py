# SPDX-License-Identifier: Apache-2.0
"""The user docs against their data (no GPU).

- Every table a page marks (``<!-- table: KIND PATH -->`` ... ``<!-- /table -->``) is exactly
  what tools/asv_report.py renders from its data file: a number in a published table comes from
  a file under docs/data, through one script.
- Every file under docs/data is cited by a page or listed in docs/data/README.md, and every
  link of a page to data, images, other pages (with their anchors) or the checkout resolves.
- No page names a commit in its prose (history lives in git: a table's first line, rendered
  from its data, may), nor uses a word only the project's team would understand.
"""

import importlib.util
import json
import pathlib
import re
import subprocess
import sys

import pytest

from helpers.paths import DOCS, ROOT, TOOLS
from helpers.paths import DOCS_DATA as DATA

PAGES = sorted(DOCS.glob("*.md"))


def renderer():
    name = "asv_report.py"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TOOLS / name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def prose(text: str) -> str:
    """A page without its code blocks, its rendered tables and its link targets."""
    text = renderer().BLOCK.sub("", text)
    text = FENCE.sub("", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def test_the_pages_mark_tables():
    marked = {
        page.name: [k for k, *_ in renderer().marked_tables(page.read_text())] for page in PAGES
    }
    assert {"index.md", "performance.md", "torch.md", "compatibility.md"} <= {
        p for p, kinds in marked.items() if kinds
    }, marked
    assert "replay" in marked["performance.md"] and "doctor" in marked["index.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_marked_table_is_what_its_data_renders(page):
    r = renderer()
    text = page.read_text()
    for kind, rel, options, body in r.marked_tables(text):
        assert kind in r.KINDS, f"{page.name}: no renderer {kind!r}"
        assert (DOCS / rel).exists(), f"{page.name}: {rel} is missing"
        fresh = r.render(kind, rel, options)
        assert body == fresh, (
            f"{page.name}: the table {kind} {rel} differs from what its data renders; "
            "run python tools/asv_report.py"
        )
        assert fresh.startswith(f"*Data: [{rel}]("), fresh.splitlines()[0]
    assert r.render_page(text) == text


def test_the_check_mode_finds_nothing_stale():
    assert renderer().check() == []


def test_a_table_header_names_what_its_file_records(tmp_path):
    r = renderer()
    cells = [
        {"chain": "cuda", "scenario": "free_in_flight", "trials": 3, "corrupted": 0,
         "crashed": None, "hazards": [], "free_us": 2.0, "outcome": "correct",
         "label": "correct"},
    ]  # fmt: skip
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"device": "Some GPU", "trials": 3, "cells": cells}))
    meta, body = r.render_doctor(bare, "bare.json", {})
    line = r.header(meta)
    assert "GPU Some GPU" in line
    assert "commit, driver and package versions not recorded" in line
    assert "| `cuda` | correct | 2.0 |" in body
    env = {"commit": "0123abc", "gpu": "G", "driver": "580.1", "versions": {"rmm-cu13": "26.10"}}
    full = tmp_path / "full.json"
    full.write_text(json.dumps({"device": "G", "trials": 3, "cells": cells, "environment": env}))
    line = r.header(r.render_doctor(full, "full.json", {})[0])
    assert "commit 0123abc; GPU G; driver 580.1; package versions rmm-cu13 26.10" in line
    assert "not recorded" not in line


def test_asv_bodies_files_carry_their_environment_line(tmp_path):
    """tools/asv_bodies.py run writes the environment first; the tables skip it."""
    r = renderer()
    src = DATA / "bench" / "streams_2026-12-05.jsonl"
    env = {"commit": "abc1234", "gpu": "G", "driver": "d", "versions": {"python": "3"}}
    path = tmp_path / "streams.jsonl"
    path.write_text(json.dumps({"environment": env}) + "\n" + src.read_text())
    meta, body = r.render_streams(path, "streams.jsonl", {})
    assert meta["commit"] == "abc1234" and meta["gpu"] == "G"
    assert body == r.render_streams(src, "x", {})[1]


def test_stamp_records_what_head_ran_on(tmp_path):
    """make bench: the asv result files of HEAD's commit get an environment; others do not."""
    r = renderer()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "machine.json").write_text('{"machine": "m", "version": 1}')
    (tmp_path / "m" / "a.json").write_text(json.dumps({"commit_hash": head, "date": 1}))
    (tmp_path / "m" / "b.json").write_text(json.dumps({"commit_hash": "0" * 40, "date": 1}))
    assert [pathlib.Path(p).name for p in r.stamp(str(tmp_path))] == ["a.json"]
    env = json.loads((tmp_path / "m" / "a.json").read_text())["environment"]
    assert env["commit"].startswith(head) and "python" in env["versions"]
    assert {"gpu", "driver"} <= set(env)
    assert "environment" not in json.loads((tmp_path / "m" / "b.json").read_text())


def data_files():
    return sorted(p for p in DATA.rglob("*") if p.is_file() and p != DATA / "README.md")


def test_every_data_file_is_cited_or_listed():
    pages = "\n".join(p.read_text() for p in PAGES)
    listed = (DATA / "README.md").read_text()
    orphans = []
    for f in data_files():
        rel = f.relative_to(DATA)
        folders = [str(a) + "/" for a in rel.parents if str(a) != "."]
        cited = any(f"data/{x}" in pages for x in [str(rel), *folders])
        cited = cited or any(f"`{x}`" in listed for x in [str(rel), *folders])
        if not cited:
            orphans.append(str(rel))
    assert orphans == [], f"cited by no page and not in docs/data/README.md: {orphans}"


def test_the_data_readme_lists_only_what_exists():
    listed = re.findall(r"^- `([^`]+)`", (DATA / "README.md").read_text(), re.M)
    assert listed, "docs/data/README.md lists each file or folder as '- `path`: what it is'"
    assert [x for x in listed if not (DATA / x).exists()] == []


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: pathlib.Path) -> set:
    text = FENCE.sub("", page.read_text())
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_every_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert broken == [], f"{page.name}: {broken}"


#: A commit reference: 7 to 40 hex digits with a letter and a digit, standing alone.
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")


def test_the_commit_pattern():
    assert COMMIT.findall("the wheel of 30444a3 (ce9dfb02db23c2c7dbb48d4ab7dcd62bc92272ee)") == [
        "30444a3",
        "ce9dfb02db23c2c7dbb48d4ab7dcd62bc92272ee",
    ]
    assert not COMMIT.findall("at 0x7fe321800000, 1048576 bytes, data/x_a7c1ec2.json, deadbeef")


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_no_commit_in_prose(page):
    assert COMMIT.findall(prose(page.read_text())) == []


#: Words that mean something only inside the team that wrote the code.
PRIVATE = re.compile(
    r"\bsessions?\b|\bdevice time\b|\bGPU host calls?\b|\bthe targets\b|\bthe issue\b|"
    r"\bwheel of\b|\bto be measured\b",
    re.I,
)


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_no_private_words(page):
    assert PRIVATE.findall(prose(page.read_text())) == []


def test_downstream_table_of_one_suite_keeps_that_suites_rows(tmp_path):
    """A summary of several suites: suite=NAME renders that suite's rows alone, without the
    suite column; without the option every row comes (one suite per file, as before)."""
    r = renderer()
    path = tmp_path / "summary.md"
    path.write_text(
        "# run\n\nx; rmm_fences commit `0123abcd`; python 3\n\n"
        "| suite | chain | passed | regressions |\n|---|---|---:|---:|\n"
        "| a | baseline | 5 | 0 |\n| a | pool | 4 | 1 |\n| b | baseline | 7 | 0 |\n"
    )
    _, body = r.render_downstream(path, "s.md", {"suite": "b"})
    assert body.splitlines() == [
        "| chain | passed | regressions |",
        "|---|---:|---:|",
        "| baseline | 7 | 0 |",
    ]
    _, every = r.render_downstream(path, "s.md", {})
    assert len(every.splitlines()) == 5


def test_downstream_table_names_the_gpu_and_driver_of_its_run(tmp_path):
    """The summary's line names the GPU and driver: the header gives them as such, not among
    the package versions (a summary without them keeps 'GPU and driver not recorded')."""
    r = renderer()
    path = tmp_path / "summary.md"
    table = "| suite | chain | passed |\n|---|---|---:|\n| a | baseline | 5 |\n"
    path.write_text(
        "# run\n\nx; rmm_fences commit `0123abcd`; python 3, cudf 26.10.2; "
        "GPU NVIDIA H200, driver 580.159.04\n\n" + table
    )
    meta, _ = r.render_downstream(path, "s.md", {})
    assert (meta["gpu"], meta["driver"], meta["versions"]) == (
        "NVIDIA H200",
        "580.159.04",
        "python 3, cudf 26.10.2",
    )
    path.write_text("# run\n\nx; rmm_fences commit `0123abcd`; python 3\n\n" + table)
    meta, _ = r.render_downstream(path, "s.md", {})
    assert (meta["gpu"], meta["versions"]) == (None, "python 3")
