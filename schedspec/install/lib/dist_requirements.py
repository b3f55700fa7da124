"""An installed distribution's requirements (Requires-Dist), for scripts/install_vllm.sh.

    python dist_requirements.py constraints DIST [--overridden NAME ...]
    python dist_requirements.py trim DIST [--overridden NAME ...]
    python dist_requirements.py is-trimmed DIST

Run it with the venv's python: it reads that venv's installed distributions. An
overridden NAME is one the venv provides on its own terms, whatever DIST pins (vLLM pins
torch 2.14.0; the venv has the CPU torch 2.13.0, which vLLM's scheduler runs on).

`constraints` prints a pip constraints file: each requirement of DIST that applies here
(its marker holds with no extra) and pins a version, overridden names left out.

`trim` is for a distribution installed with --no-deps on purpose: it removes from DIST's
METADATA each requirement that applies here and that the venv leaves out (not installed
at all, or an overridden name at a version the requirement refuses), so that pip's
resolver and `pip check` stop reporting them on every later install, and keep checking
every requirement that stayed. The original is kept as METADATA.orig, the removed lines
are listed in LEFT_OUT next to it, and RECORD lists both, so that uninstalling the
distribution removes them. Trimming again starts from METADATA.orig.

`is-trimmed` exits 0 when DIST's METADATA has been trimmed, 1 when not.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ORIGINAL = "METADATA.orig"
LEFT_OUT = "LEFT_OUT"
_LEFT_OUT_HEADER = (
    "# Requires-Dist lines removed from METADATA (the original is METADATA.orig): the\n"
    "# venv leaves these out on purpose (scripts/install_vllm.sh installed this\n"
    "# distribution with --no-deps).\n"
)


def applies_here(requirement: Requirement) -> bool:
    """Whether pip would install this requirement here, for the distribution without extras."""
    return requirement.marker is None or requirement.marker.evaluate({"extra": ""})


def requirements(metadata_text: str) -> list[tuple[str, Requirement]]:
    """Each Requires-Dist line of a METADATA file, as written and parsed."""
    message = HeaderParser().parsestr(metadata_text)
    return [(line, Requirement(line)) for line in message.get_all("Requires-Dist") or []]


def constraints(metadata_text: str, overridden: Iterable[str]) -> list[str]:
    """NAME+SPECIFIER for each requirement that applies here, pins a version and is not
    overridden (extras dropped: pip constraints cannot carry them)."""
    skip = {canonicalize_name(name) for name in overridden}
    return [
        f"{req.name}{req.specifier}"
        for _, req in requirements(metadata_text)
        if applies_here(req) and str(req.specifier) and canonicalize_name(req.name) not in skip
    ]


def left_out(
    metadata_text: str, installed: Mapping[str, str], overridden: Iterable[str]
) -> list[str]:
    """The Requires-Dist lines that apply here and that the venv leaves out: the named
    distribution is not installed (`installed` maps names to versions), or it is an
    overridden name whose installed version the requirement does not accept."""
    present = {canonicalize_name(name): version for name, version in installed.items()}
    override = {canonicalize_name(name) for name in overridden}
    lines = []
    for line, req in requirements(metadata_text):
        name = canonicalize_name(req.name)
        if not applies_here(req):
            continue
        if name not in present or (
            name in override and not req.specifier.contains(present[name], prereleases=True)
        ):
            lines.append(line)
    return lines


def without_lines(metadata_text: str, lines: Sequence[str]) -> str:
    """metadata_text minus the `Requires-Dist: LINE` header of each line (the body, after
    the first blank line, is kept as it is)."""
    header, blank, body = metadata_text.partition("\n\n")
    drop = {f"Requires-Dist: {line}" for line in lines}
    kept = [row for row in header.split("\n") if row not in drop]
    return "\n".join(kept) + blank + body


@dataclass(frozen=True)
class DistInfo:
    """An installed distribution's .dist-info folder."""

    name: str
    folder: Path

    @classmethod
    def find(cls, name: str, path: Sequence[str] | None = None) -> DistInfo:
        """The installed distribution `name`, looked up on `path` (default: sys.path)."""
        found = [
            dist
            for dist in metadata.distributions(path=list(sys.path if path is None else path))
            if canonicalize_name(dist.metadata["Name"]) == canonicalize_name(name)
        ]
        if not found:
            raise SystemExit(f"dist_requirements.py: {name} is not installed here")
        record = [f for f in found[0].files or [] if f.name == "RECORD"]
        if not record:
            raise SystemExit(f"dist_requirements.py: {name} has no RECORD (not a wheel install)")
        return cls(name, Path(str(found[0].locate_file(record[0]))).parent)

    def original_metadata(self) -> str:
        original = self.folder / ORIGINAL
        return (original if original.exists() else self.folder / "METADATA").read_text()

    def is_trimmed(self) -> bool:
        return (self.folder / ORIGINAL).exists()

    def trim(self, lines: Sequence[str]) -> None:
        """METADATA without these Requires-Dist lines; METADATA.orig and LEFT_OUT beside it."""
        original = self.original_metadata()
        (self.folder / ORIGINAL).write_text(original)
        (self.folder / LEFT_OUT).write_text(_LEFT_OUT_HEADER + "".join(f"{x}\n" for x in lines))
        (self.folder / "METADATA").write_text(without_lines(original, lines))
        self._rewrite_record()

    def _rewrite_record(self) -> None:
        """RECORD with METADATA's new hash and size, and rows for the files trim added."""
        record = self.folder / "RECORD"
        rows = list(csv.reader(io.StringIO(record.read_text())))
        prefix = self.folder.name
        ours = {f"{prefix}/{name}" for name in ("METADATA", ORIGINAL, LEFT_OUT)}
        kept = [row for row in rows if row and row[0] not in ours]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerows(kept)
        for name in ("METADATA", ORIGINAL, LEFT_OUT):
            writer.writerow([f"{prefix}/{name}", *_hash_and_size(self.folder / name)])
        record.write_text(out.getvalue())


def _hash_and_size(path: Path) -> tuple[str, str]:
    """A RECORD row's hash (sha256, urlsafe base64 without padding) and size."""
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}", str(len(data))


def installed_versions(path: Sequence[str] | None = None) -> dict[str, str]:
    """Every distribution installed on `path` (default: sys.path), with its version."""
    found = metadata.distributions(path=list(sys.path if path is None else path))
    return {dist.metadata["Name"]: dist.version for dist in found}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dist_requirements.py", description=__doc__)
    parser.add_argument("command", choices=("constraints", "trim", "is-trimmed"))
    parser.add_argument("dist")
    parser.add_argument("--overridden", nargs="*", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    dist = DistInfo.find(args.dist)
    if args.command == "is-trimmed":
        return 0 if dist.is_trimmed() else 1
    text = dist.original_metadata()
    if args.command == "constraints":
        print("\n".join(constraints(text, args.overridden)))
        return 0
    lines = left_out(text, installed_versions(), args.overridden)
    dist.trim(lines)
    print(
        f"{args.dist}: {len(lines)} requirement(s) left out on purpose, removed from its "
        f"METADATA (listed in {dist.folder / LEFT_OUT})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
