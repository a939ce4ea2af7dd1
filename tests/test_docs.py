"""The design notes in docs/: every note the code, tests and README cite exists, nothing cites
notes that live outside the repository, and every registered policy has a model note."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from allocsim import policies

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("allocsim", "tests", "benchmarks", "examples", "docs", "README.md")
SUFFIXES = (".py", ".md", ".sh")
MODELS = ROOT / "docs" / "models"

#: a cited Markdown file: ``docs/models/torch.md``, ``../metrics.md``, ``trace-format.md``
MD_FILE = re.compile(r"[\w./-]*[\w-]\.md\b")
#: paths that only exist outside the repository (the project's shared notes, the workspace)
OUTSIDE = re.compile(r"\.\./shared\b|\bshared/reference\b|/work/")


def scanned_files(root: Path) -> list[Path]:
    """The text files whose citations are checked (this module excepted: it names the patterns)."""
    out = []
    for name in SCANNED:
        p = root / name
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file())
    me = Path(__file__).resolve()
    return [f for f in out if f.resolve() != me]


def resolves(root: Path, citing: Path, cited: str) -> bool:
    """Whether ``cited`` names a file of the repository: from the root, beside the citing file,
    or, for a bare file name, in docs/ or docs/models/."""
    places = [root, citing.parent]
    if "/" not in cited:
        places += [root / "docs", root / "docs" / "models"]
    return any(os.path.isfile(os.path.normpath(p / cited)) for p in places)


def stray_citations(root: Path, files) -> list[str]:
    """``file:line: what`` for every cited .md file that is not in the repository and every
    path that points outside it."""
    bad = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{f.relative_to(root)}:{n}"
            bad += [f"{where}: {m.group(0)} is not in the repository"
                    for m in MD_FILE.finditer(line) if not resolves(root, f, m.group(0))]
            bad += [f"{where}: {m.group(0)} points outside the repository" for m in OUTSIDE.finditer(line)]
    return bad


def test_every_cited_note_is_in_the_repository():
    files = scanned_files(ROOT)
    assert any(f.suffix == ".py" for f in files) and ROOT / "README.md" in files
    assert stray_citations(ROOT, files) == []


def test_the_code_cites_the_notes():
    """At least the policies, metrics and cost model cite docs/ (the citations checked above)."""
    cited = {m.group(0) for f in scanned_files(ROOT) if f.suffix == ".py"
             for m in MD_FILE.finditer(f.read_text(encoding="utf-8"))}
    for note in ("docs/models/torch.md", "docs/models/cupy.md", "docs/models/cuarrays.md", "docs/models/knet.md",
                 "docs/models/bestfit-oracle.md", "docs/metrics.md", "docs/importers.md"):
        assert note in cited, f"no Python file cites {note}"


def test_the_check_catches_stray_citations(tmp_path):
    (tmp_path / "docs" / "models").mkdir(parents=True)
    (tmp_path / "docs" / "metrics.md").write_text("# metrics\n")
    (tmp_path / "docs" / "models" / "x.md").write_text("see [metrics](../metrics.md) and ../shared/notes\n")
    code = tmp_path / "mod.py"
    code.write_text('"""Source: `docs/metrics.md`, `metrics.md`, `docs/models/x.md`.\n'
                    'Also `reference/allocator-notes.md` §3 and docs/gone.md."""\n')
    got = stray_citations(tmp_path, [code, tmp_path / "docs" / "models" / "x.md"])
    assert got == ["mod.py:2: reference/allocator-notes.md is not in the repository",
                   "mod.py:2: docs/gone.md is not in the repository",
                   "docs/models/x.md:1: ../shared points outside the repository"]


#: a Markdown link to a section: ``[text](file.md#anchor)`` or ``[text](#anchor)``
SECTION_LINK = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")


def heading_anchors(md: Path) -> set[str]:
    """GitHub's anchors of the headings of ``md``: lower case, punctuation dropped, spaces to hyphens."""
    heads = (line.lstrip("#").strip() for line in md.read_text(encoding="utf-8").splitlines() if line.startswith("#"))
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_section_links_in_the_notes_resolve():
    notes = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    links = [(md, target, anchor) for md in notes
             for target, anchor in SECTION_LINK.findall(md.read_text(encoding="utf-8"))]
    assert links, "the notes link to no section"
    for md, target, anchor in links:
        dest = (md.parent / target) if target else md
        assert dest.is_file() and anchor in heading_anchors(dest), f"{md.relative_to(ROOT)}: {target}#{anchor}"


@pytest.mark.parametrize("name", policies.names())
def test_every_registered_policy_has_a_model_note(name):
    notes = {p.name: p.read_text(encoding="utf-8") for p in MODELS.glob("*.md")}
    assert any(f"`{name}`" in text for text in notes.values()), f"no note in docs/models/ names `{name}`"


@pytest.mark.parametrize("name", [n for n in policies.names() if not policies.get(n).real_gpu])
def test_every_simulated_policy_cites_its_note(name):
    """``models`` (printed by ``allocsim policies``) names the note the model follows."""
    m = re.search(r"docs/models/[\w-]+\.md", policies.get(name).models)
    assert m, f"policy {name!r}: models={policies.get(name).models!r} cites no docs/models/ note"
    assert (ROOT / m.group(0)).is_file()


def test_every_compare_and_fit_column_is_in_the_metrics_columns_table():
    """Each label compare's and fit's tables print is mapped to its field in docs/metrics.md ("The tables'
    columns"): a renamed or added column without it maps to nowhere."""
    from allocsim.report.text import compare_table, fit_table
    section = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8").split("## The tables' columns")[1]
    section = section.split("\n## ")[0]
    heads = compare_table([]).splitlines()[0]
    heads += "  " + fit_table({"trace": "t", "load_bytes": 1, "resolution_bytes": 1, "fits": []}, 1).splitlines()[1]
    labels = {h for h in re.split(r"\s{2,}", heads.strip())} - {"policy", "cap", "runtime"}
    assert labels and all(f"`{label}`" in section for label in labels), sorted(
        label for label in labels if f"`{label}`" not in section)
