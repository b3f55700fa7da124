"""docs/SPEC.md lists exactly the invariant catalogue: one section and one table row per
id, with the profile and kind the code registers, and no id the code does not know."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from schedspec.reference import sizing
from schedspec.spec.invariants import CATALOGUE, SPEC_DOC, Violation, rule_anchor, rule_link

SPEC = Path(__file__).resolve().parent.parent / "docs" / "SPEC.md"

ID = r"[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*"
HEADING = re.compile(rf"^### ({ID})\s*$", re.MULTILINE)
ROW = re.compile(rf"^\| `({ID})` \|(.*)\|\s*$", re.MULTILINE)
FIELDS = re.compile(r"^- \*\*Profile / kind:\*\* (\S+) / (\S+)\.$", re.MULTILINE)


def spec_text() -> str:
    return SPEC.read_text(encoding="utf-8")


def sections(text: str) -> dict[str, str]:
    """Each `### ID` heading's body, up to the next heading."""
    matches = list(HEADING.finditer(text))
    bodies: dict[str, str] = {}
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following is not None else len(text)
        body = text[match.end() : end]
        bodies[match.group(1)] = body.split("\n## ", 1)[0]
    return bodies


def table_rows(text: str) -> dict[str, list[str]]:
    return {
        m.group(1): [cell.strip() for cell in m.group(2).split("|")] for m in ROW.finditer(text)
    }


def test_every_id_has_exactly_one_section() -> None:
    headings = HEADING.findall(spec_text())
    duplicated = sorted({h for h in headings if headings.count(h) > 1})
    assert not duplicated, f"ids with more than one section: {duplicated}"
    assert sorted(set(CATALOGUE) - set(headings)) == [], "ids with no section in SPEC.md"
    assert sorted(set(headings) - set(CATALOGUE)) == [], "sections for unknown ids"


def test_the_table_lists_the_catalogue() -> None:
    rows = table_rows(spec_text())
    assert sorted(set(CATALOGUE) - set(rows)) == [], "ids missing from the table"
    assert sorted(set(rows) - set(CATALOGUE)) == [], "table rows for unknown ids"
    assert len(ROW.findall(spec_text())) == len(CATALOGUE), "an id listed twice"


@pytest.mark.parametrize("invariant_id", sorted(CATALOGUE))
def test_table_row_matches_the_registration(invariant_id: str) -> None:
    info = CATALOGUE[invariant_id]
    profile, kind, state_machine, z3, crosshair = table_rows(spec_text())[invariant_id]
    assert (profile, kind) == (info.profile, info.kind)
    assert state_machine == "yes"
    assert z3 and crosshair


@pytest.mark.parametrize("invariant_id", sorted(CATALOGUE))
def test_section_states_profile_kind_and_why(invariant_id: str) -> None:
    info = CATALOGUE[invariant_id]
    body = sections(spec_text())[invariant_id]
    fields = FIELDS.findall(body)
    assert fields == [(info.profile, info.kind)]
    for label in ("**Statement:**", "**Why it matters:**", "**Checked by:**"):
        assert label in body, f"{invariant_id}: no {label}"


# ------------------------------------------------------------------ checked by Z3

Z3_PROVED = "proved, every N"


def test_z3_column_matches_what_schedspec_prove_proves() -> None:
    """The Z3 column says "proved, every N" for exactly the ids `schedspec prove` proves."""
    from schedspec.spec.formal.prover import ALL_IDS as PROVE_IDS
    from schedspec.spec.formal.prover import ALL_N, ProveSettings, prove_for_all_n

    rows = table_rows(spec_text())
    claimed = sorted(rid for rid, cells in rows.items() if cells[3] == Z3_PROVED)
    proved = sorted(rid for rid in PROVE_IDS if rid in CATALOGUE)
    assert claimed == proved
    for rid in proved:
        row = prove_for_all_n(rid, ProveSettings(max_n=0, timeout_s=60))
        assert (row.n, row.verdict) == (ALL_N, "proved")


def test_sections_of_z3_proved_ids_name_the_broken_variant_and_trace() -> None:
    from schedspec.spec.formal.variants import BREAKS

    bodies = sections(spec_text())
    for rid, cells in table_rows(spec_text()).items():
        body = " ".join(bodies[rid].split())
        if cells[3] != Z3_PROVED:
            assert "Z3: proved" not in body, rid
            continue
        assert "Z3: proved for every N by `schedspec prove`" in body, rid
        if rid in BREAKS:
            assert f"`{BREAKS[rid].mutant}`" in body, rid
            trace = SPEC.parent.parent / "tests" / "formal_traces" / f"{rid}.json"
            assert f"tests/formal_traces/{rid}.json" in body and trace.is_file(), rid


def sizing_support() -> dict[str, list[str]]:
    """Invariant id -> the sizing.py functions whose `Supports:` line names it, in file order."""
    found: dict[str, list[tuple[int, str]]] = {}
    for name, function in inspect.getmembers(sizing, inspect.isfunction):
        if function.__module__ != sizing.__name__:
            continue
        match = re.search(r"Supports: ([A-Z, -]+)\.", function.__doc__ or "")
        for invariant_id in match.group(1).split(", ") if match else ():
            found.setdefault(invariant_id, []).append((function.__code__.co_firstlineno, name))
    return {i: [name for _, name in sorted(fns)] for i, fns in found.items()}


def test_sizing_supports_only_catalogue_ids() -> None:
    support = sizing_support()
    assert len(support) >= 8
    assert sorted(set(support) - set(CATALOGUE)) == []


@pytest.mark.parametrize("invariant_id", sorted(CATALOGUE))
def test_crosshair_column_lists_the_contracts_that_support_the_invariant(
    invariant_id: str,
) -> None:
    crosshair = table_rows(spec_text())[invariant_id][4]
    functions = sizing_support().get(invariant_id, [])
    assert crosshair == (", ".join(f"`{f}`" for f in functions) or "none")
    body = sections(spec_text())[invariant_id]
    assert ("CrossHair:" in body) == bool(functions)


# ------------------------------------------------------------ rule links


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading's text (lower case, punctuation but '-' and '_'
    dropped, spaces to hyphens): stated here independently of rule_anchor, which it checks."""
    return "".join(c for c in heading.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def test_rule_link_worked_example() -> None:
    assert rule_link("PREEMPT-RESET") == "docs/SPEC.md#preempt-reset"
    violation = Violation("PREEMPT-RESET", "not reset: block_ids", "r3", expected=(), actual=(2,))
    assert violation.rule == "docs/SPEC.md#preempt-reset"
    assert str(violation) == (
        "[PREEMPT-RESET] request 'r3': not reset: block_ids "
        "(expected (), actual (2,); rule: docs/SPEC.md#preempt-reset)"
    )


def test_every_rule_link_lands_on_its_own_section() -> None:
    """Each id's link names docs/SPEC.md and an anchor that GitHub gives the id's own
    `### ID` heading: the first heading in the file with that anchor (GitHub suffixes later
    ones), so no other heading can take it."""
    assert Path(__file__).resolve().parent.parent / SPEC_DOC == SPEC
    first_with: dict[str, str] = {}
    for line in spec_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip()
            first_with.setdefault(heading_anchor(title), title)
    wrong = {
        i: first_with.get(rule_anchor(i))
        for i in CATALOGUE
        if first_with.get(rule_anchor(i)) != i or rule_link(i) != f"{SPEC_DOC}#{rule_anchor(i)}"
    }
    assert not wrong, f"rule links that miss their section: {wrong}"
