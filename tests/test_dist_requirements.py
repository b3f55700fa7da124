"""schedspec/install/lib/dist_requirements.py: vLLM's pins as constraints, and the METADATA trim
that keeps later pip installs quiet about what scripts/install_vllm.sh leaves out."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

import packaging
import pytest

from tests.script_modules import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "schedspec/install/lib/dist_requirements.py"


dr = load_script(SCRIPT, "dist_requirements")

BODY = "A description.\nRequires-Dist: a line of the body, not a requirement\n"
DEMO = (
    "Metadata-Version: 2.4\n"
    "Name: demo\n"
    "Version: 1.0\n"
    "Requires-Dist: present>=1.0\n"
    "Requires-Dist: absent\n"
    "Requires-Dist: torch==2.14.0\n"
    "Requires-Dist: optional-tool; python_version >= '3'\n"
    "Requires-Dist: elsewhere==3.0; platform_system == 'Nowhere'\n"
    "Requires-Dist: served==1.0; extra == 'serve'\n"
    "Requires-Dist: present[fast]<3\n"
    "\n" + BODY
)
INSTALLED = {"demo": "1.0", "present": "2.0", "torch": "2.13.0+cpu"}


def test_constraints_are_the_pins_that_apply_here_minus_the_overridden() -> None:
    # absent pins no version; elsewhere's marker and served's extra do not apply;
    # torch is the venv's own; present[fast] loses its extra (constraints cannot have one).
    assert dr.constraints(DEMO, ["Torch"]) == ["present>=1.0", "present<3"]
    assert dr.constraints(DEMO, []) == ["present>=1.0", "torch==2.14.0", "present<3"]


def test_left_out_is_what_is_not_installed_or_overridden_at_a_refused_version() -> None:
    lines = dr.left_out(DEMO, INSTALLED, ["torch"])
    assert lines == ["absent", "torch==2.14.0", "optional-tool; python_version >= '3'"]
    # An overridden name at a version the pin accepts stays; one not overridden stays
    # whatever its version: `pip check` then reports the conflict.
    assert "torch==2.14.0" not in dr.left_out(DEMO, {**INSTALLED, "torch": "2.14.0"}, ["torch"])
    assert "torch==2.14.0" not in dr.left_out(DEMO, INSTALLED, [])


def test_without_lines_drops_headers_only() -> None:
    trimmed = dr.without_lines(DEMO, ["absent", "torch==2.14.0"])
    assert "Requires-Dist: absent\n" not in trimmed
    assert "Requires-Dist: torch==2.14.0\n" not in trimmed
    assert "Requires-Dist: present>=1.0\n" in trimmed
    assert trimmed.endswith("\n\n" + BODY)
    assert len(trimmed.splitlines()) == len(DEMO.splitlines()) - 2


def _site(tmp_path: Path) -> Path:
    """A site-packages folder holding demo 1.0 (METADATA, RECORD), present 2.0 and
    torch 2.13.0+cpu."""
    site = tmp_path / "site"
    for name, version, metadata in (
        ("demo", "1.0", DEMO),
        ("present", "2.0", "Metadata-Version: 2.4\nName: present\nVersion: 2.0\n"),
        ("torch", "2.13.0+cpu", "Metadata-Version: 2.4\nName: torch\nVersion: 2.13.0+cpu\n"),
    ):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(metadata)
        (info / "RECORD").write_text(
            f"{name}/__init__.py,sha256=x,0\n"
            f"{info.name}/METADATA,sha256=old,{len(metadata)}\n"
            f"{info.name}/RECORD,,\n"
        )
    return site


def _record(info: Path) -> dict[str, tuple[str, str]]:
    rows = csv.reader(io.StringIO((info / "RECORD").read_text()))
    return {row[0]: (row[1], row[2]) for row in rows}


def _hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_trim_keeps_the_original_lists_the_removed_and_records_both(tmp_path: Path) -> None:
    site = _site(tmp_path)
    dist = dr.DistInfo.find("Demo", [str(site)])
    info = site / "demo-1.0.dist-info"
    assert dist.folder == info
    assert not dist.is_trimmed()
    removed = ["absent", "torch==2.14.0"]
    for _ in range(2):  # trimming again starts from the original: same files, same RECORD
        dist.trim(removed)
        assert dist.is_trimmed()
        assert (info / "METADATA.orig").read_text() == DEMO
        assert (info / "METADATA").read_text() == dr.without_lines(DEMO, removed)
        assert (info / "LEFT_OUT").read_text().splitlines()[-2:] == removed
        record = _record(info)
        assert list(record) == [
            "demo/__init__.py",
            "demo-1.0.dist-info/RECORD",
            "demo-1.0.dist-info/METADATA",
            "demo-1.0.dist-info/METADATA.orig",
            "demo-1.0.dist-info/LEFT_OUT",
        ]
        for name in ("METADATA", "METADATA.orig", "LEFT_OUT"):
            path = info / name
            assert record[f"demo-1.0.dist-info/{name}"] == (_hash(path), str(path.stat().st_size))


def test_find_names_a_distribution_that_is_not_installed(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="vllm is not installed here"):
        dr.DistInfo.find("vllm", [str(_site(tmp_path))])


def _run(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The script, seeing only the distributions in site (-S: no site-packages), with a
    copy of packaging beside them for it to import."""
    libs = site.parent / "libs"
    if not libs.exists():
        shutil.copytree(Path(packaging.__file__).parent, libs / "packaging")
    return subprocess.run(
        [sys.executable, "-S", str(SCRIPT), *args],
        env={"PYTHONPATH": f"{site}:{libs}"},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_command_line_trims_and_reports(tmp_path: Path) -> None:
    site = _site(tmp_path)
    assert _run(site, "is-trimmed", "demo").returncode == 1
    constraints = _run(site, "constraints", "demo", "--overridden", "torch")
    assert constraints.stdout == "present>=1.0\npresent<3\n"
    info = site / "demo-1.0.dist-info"
    # torch 2.13.0+cpu is installed: its line goes only when torch is overridden.
    assert _run(site, "trim", "demo").stdout.startswith("demo: 2 requirement(s) left out")
    assert (info / "LEFT_OUT").read_text().splitlines()[-2:] == [
        "absent",
        "optional-tool; python_version >= '3'",
    ]
    trim = _run(site, "trim", "demo", "--overridden", "torch")
    assert trim.returncode == 0, trim.stderr
    assert trim.stdout == (
        f"demo: 3 requirement(s) left out on purpose, removed from its METADATA "
        f"(listed in {info / 'LEFT_OUT'})\n"
    )
    assert (info / "LEFT_OUT").read_text().splitlines()[-3:] == [
        "absent",
        "torch==2.14.0",
        "optional-tool; python_version >= '3'",
    ]
    assert _run(site, "is-trimmed", "demo").returncode == 0
