"""The docs hold their budgets: word counts, no lab notes in user docs, links and anchors that resolve, the figures
they show, and a CHANGELOG whose newest release is the package's version."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lightning_hetero

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
#: absolute links into this repository (the README's, which must work on a package index) and where they point
OWN_URLS = (
    "https://github.com/lightning-hetero/lightning-hetero/blob/main/",
    "https://raw.githubusercontent.com/lightning-hetero/lightning-hetero/main/",
)
#: words at most, per page; never raise one (cut the page instead)
README_WORDS = 1_000
GUIDE_WORDS = 2_000
RESULTS_WORDS = 3_000
ARCHITECTURE_WORDS = 2_754

MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
ISSUE_NUMBER = re.compile(r"(?<![\w/&#])#\d+\b|\bissues?[ \t-]*#?\d+\b", re.IGNORECASE)
#: 7-40 lowercase hex characters with a digit and a letter, standing alone (not inside a file name like run_0ac8bd8)
COMMIT_HASH = re.compile(r"(?<![\w.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")


def user_docs() -> list[Path]:
    """The pages a user reads: the README and docs/*.md (the lab log under docs/lab/ is not one)."""
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def guides() -> list[Path]:
    return [page for page in sorted(DOCS.glob("*.md")) if page.name not in ("results.md", "architecture.md")]


def linked_docs() -> list[Path]:
    """Every page whose links must resolve: the README, the CHANGELOG and docs/ with its subfolders."""
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


def words(path: Path) -> int:
    return len(path.read_text().split())


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but ``-`` and ``_``), spaces to ``-``.

    >>> slug("ASP under torchrun's elastic agent")
    'asp-under-torchruns-elastic-agent'
    >>> slug("Memory caps (`memory_caps=\\"auto\\"`)")
    'memory-caps-memory_capsauto'
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, with GitHub's ``-1``, ``-2`` suffixes for repeats."""
    found: set[str] = set()
    for line in prose(path.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            base = slug(match.group(1))
            anchor, count = base, 0
            while anchor in found:
                count += 1
                anchor = f"{base}-{count}"
            found.add(anchor)
    return found


def link_targets(path: Path) -> list[str]:
    return MARKDOWN_LINK.findall(INLINE_CODE.sub("", prose(path.read_text())))


def resolve(page: Path, target: str) -> tuple[Path, str] | None:
    """The file and anchor a link points to in this repository, or ``None`` for a link elsewhere."""
    for prefix in OWN_URLS:
        if target.startswith(prefix):
            target = target[len(prefix) :]
            base = REPO
            break
    else:
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ... elsewhere
            return None
        base = page.parent
    file_part, _, anchor = target.partition("#")
    file_part = file_part.split("?", 1)[0]
    return ((base / file_part).resolve() if file_part else page), anchor


@pytest.mark.parametrize(
    ("path", "budget"),
    [
        (REPO / "README.md", README_WORDS),
        (DOCS / "results.md", RESULTS_WORDS),
        (DOCS / "architecture.md", ARCHITECTURE_WORDS),
        *((guide, GUIDE_WORDS) for guide in guides()),
    ],
    ids=lambda value: value.name if isinstance(value, Path) else str(value),
)
def test_page_within_its_word_budget(path, budget):
    assert words(path) <= budget, f"{path.relative_to(REPO)} has {words(path)} words, over its budget of {budget}"


def test_every_guide_has_a_budget():
    assert {page.name for page in guides()} >= {"hetero_batch.md", "async_ps.md", "local_sgd.md", "gpu.md"}


@pytest.mark.parametrize("path", user_docs(), ids=lambda path: path.name)
def test_user_doc_holds_no_lab_notes(path):
    text = path.read_text()
    problems = [f"issue number {m.group(0)!r}" for m in ISSUE_NUMBER.finditer(text)]
    problems += [f"commit hash {m.group(0)!r}" for m in COMMIT_HASH.finditer(text)]
    problems += ["'not kept'"] * len(re.findall(r"not\s+kept", text, re.IGNORECASE))
    assert problems == [], f"{path.relative_to(REPO)}: {problems}"


def test_lab_notes_are_recognised():
    assert ISSUE_NUMBER.findall("see #25 and issue 31, Issue #7") == ["#25", "issue 31", "Issue #7"]
    assert not ISSUE_NUMBER.search("[results](results.md#gpu), controller_issue25.json, &#38;")
    assert COMMIT_HASH.findall("main at 636e984, or 0ac8bd8e1f2a") == ["636e984", "0ac8bd8e1f2a"]
    assert not COMMIT_HASH.search("asp_accuracy_merged_0ac8bd8.json 16384 deadbeef 2026-11-29 1e-12")


@pytest.mark.parametrize("path", [p for p in linked_docs() if p.exists()], ids=lambda path: str(path.name))
def test_links_and_anchors_resolve(path):
    broken = []
    for target in link_targets(path):
        resolved = resolve(path, target)
        if resolved is None:
            continue
        file, anchor = resolved
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading for #{anchor} in {file.name}")
    assert broken == [], f"{path.relative_to(REPO)}: {broken}"


def test_broken_links_are_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title\n\n## Where ASP's server lives\n\n```\n[x](nowhere.md)\n```\n")
    assert anchors(page) == {"a-title", "where-asps-server-lives"}
    assert link_targets(page) == []
    assert resolve(page, "#a-title") == (page, "a-title")
    assert resolve(page, "https://example.org/x") is None
    assert resolve(page, OWN_URLS[0] + "docs/gpu.md#what-ran") == (REPO / "docs" / "gpu.md", "what-ran")


def test_readme_and_guides_show_the_figures():
    shown = {target for page in [REPO / "README.md", *guides()] for target in link_targets(page) if ".png" in target}
    figures = {Path(target.split("?")[0]).name for target in shown}
    assert len(figures) >= 2, figures
    assert {"demo_throughput.png", "demo_batch_sizes.png"} <= figures
    assert all((DOCS / "figures" / name).exists() for name in figures), figures


def test_figures_are_drawn_from_committed_json(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("draw_figures", REPO / "scripts" / "draw_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    drawn = module.draw_all(tmp_path)
    assert {path.name for path in drawn} == {path.name for path in (DOCS / "figures").glob("*.png")}
    assert all(path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for path in drawn)


def test_changelog_releases_the_package_version():
    headings = re.findall(r"^## \[([^\]]+)\](.*)$", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings[0] == ("Unreleased", "")
    version, date = headings[1]
    assert version == lightning_hetero.__version__ == "0.2.0"
    assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", date), date
