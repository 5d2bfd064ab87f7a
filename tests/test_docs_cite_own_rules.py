"""The repository cites its own rules (docs/design/README.md; docs/design/house.md#comments).

What a user reads (the OpenAPI schema, docs/, the READMEs) and the code show no id of a document outside the
repository, and the API descriptions show no docs/design path either; every ``docs/design/<file>.md#<anchor>``
cited anywhere in the repository's .py, .md and .html files names a heading (by its GitHub slug) or an explicit
``<a id>`` there.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design"
OUTSIDE_IDS = re.compile(r"\bSPEC\b|\bF\d{1,2}\b|ARCHITECTURE|\bSTYLE\b")
# A citation and the anchors of the same file that follow it, e.g. "docs/design/worker.md#verify, #refusal"
# (also across a wrapped docstring or comment line).
CITATION = re.compile(r"docs/design/([\w-]+\.md)((?:#[\w-]+)(?:,\s*(?:#\s+)?#[\w-]+)*)?")
# A link between the design pages: "[text](resume.md#lineage)".
LINK = re.compile(r"\]\(([\w-]+\.md)#([\w-]+)\)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    """Every anchor a link into ``path`` may name: headings' slugs (duplicates numbered) and ``<a id>``/``name``."""
    found, seen = set(), {}
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(1))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
        found.update(re.findall(r"<a\s+(?:id|name)=[\"']([^\"']+)[\"']", line))
    return found


def repository_files(*suffixes: str) -> list[Path]:
    """Files git tracks or would track (untracked, not ignored) with one of ``suffixes``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ROOT / name for name in sorted(set(listed)) if name.endswith(suffixes) and (ROOT / name).is_file()]


def user_docs() -> list[Path]:
    """Every page under docs/ (the design pages included) and the two READMEs."""
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md", ROOT / "sdk" / "README.md"]


def schema_texts(node, where="schema"):
    """``(place, text)`` for every ``description`` and ``summary`` in the OpenAPI document ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            place = f"{where}.{key}"
            if key in ("description", "summary") and isinstance(value, str):
                yield place, value
            else:
                yield from schema_texts(value, place)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from schema_texts(value, f"{where}[{index}]")


@pytest.mark.django_db
def test_the_api_schema_cites_no_outside_document_and_no_design_path():
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    offending = [
        f"{place}: {text[:160]!r}"
        for place, text in schema_texts(schema)
        if OUTSIDE_IDS.search(text) or "docs/design" in text
    ]
    assert not offending, "API descriptions a user reads must say the rule in words:\n" + "\n".join(offending)


def test_the_docs_and_readmes_cite_no_outside_document():
    offending = []
    for path in user_docs():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE_IDS.search(line):
                offending.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:160]}")
    assert not offending, "ids of documents outside the repository:\n" + "\n".join(offending)


# The two files that spell the ids out as patterns to look for.
ID_PATTERNS = {"tests/test_docs_cite_own_rules.py", "tests/sdk/test_cli_help.py"}
OLD_RULE_NUMBER = re.compile(r"\brule \d\b")


def test_the_code_cites_no_outside_document():
    """Code, pages, scripts and styles cite docs/design/ anchors, not SPEC / ARCHITECTURE / STYLE ids or bare
    "rule N" numbers of a document the repository does not hold (scatter.js's ``STYLE`` table is a name)."""
    offending = []
    for path in repository_files(".py", ".js", ".css", ".sh", ".html", "Makefile", ".ci/run"):
        relative = path.relative_to(ROOT).as_posix()
        if relative in ID_PATTERNS:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            line = line.replace("var STYLE = ", "").replace("STYLE[", "")
            if OUTSIDE_IDS.search(line) or OLD_RULE_NUMBER.search(line):
                offending.append(f"{relative}:{number}: {line.strip()[:160]}")
    assert not offending, "ids of documents outside the repository in the code:\n" + "\n".join(offending)


def test_every_design_citation_names_an_existing_anchor():
    anchors = {path.name: anchors_of(path) for path in DESIGN.glob("*.md")}
    broken, cited = [], 0
    for path in repository_files(".py", ".md", ".html"):
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in CITATION.finditer(text):
            name = match.group(1)
            line = text.count("\n", 0, match.start()) + 1
            if name not in anchors:
                broken.append(f"{path.relative_to(ROOT)}:{line}: docs/design/{name} does not exist")
            for anchor in re.findall(r"#([\w-]+)", match.group(2) or ""):
                cited += 1
                if anchor not in anchors.get(name, ()):
                    broken.append(f"{path.relative_to(ROOT)}:{line}: docs/design/{name}#{anchor}")
    for path in DESIGN.glob("*.md"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name, anchor in LINK.findall(line):
                if anchor not in anchors.get(name, ()):
                    broken.append(f"{path.relative_to(ROOT)}:{number}: ({name}#{anchor})")
    assert cited > 100, f"only {cited} citations found: is the pattern still right?"
    assert not broken, "citations of anchors that docs/design/ does not have:\n" + "\n".join(broken)
