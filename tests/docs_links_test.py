#!/usr/bin/env python3
"""Every link between the repository's pages, and every `NAME.md#anchor` a source comment cites,
lands: the page exists and, when an anchor is given, has a heading whose GitHub anchor it is. The
documents and the comments that point into them cannot drift apart silently (a section renamed, a
page split). No source cites the DESIGN.md that is not in the repository. Prints each broken link
(file:line: what) and exits 1."""
import pathlib
import re
import subprocess
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent).resolve()
SOURCE_FOLDERS = ("src", "include", "tests", "bench", "docs", "python", "examples", "scripts", "fuzz", "cmake")
SOURCE_SUFFIXES = {".cc", ".h", ".py", ".md", ".txt", ".sh", ".proto", ".cmake"}
FENCE = re.compile(r"^\s*(```|~~~)")


def github_anchor(heading: str) -> str:
    # GitHub's rule: the heading's text (inline code and links by their text), lower-case, drop
    # punctuation except '-' and '_', spaces become '-'.
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors_of(page: pathlib.Path, cache={}) -> set:
    if page not in cache:
        found, seen, fenced = set(), {}, False
        for line in page.read_text(errors="replace").splitlines():
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"^#{1,6} (.+?)\s*#*\s*$", line)
            if m is None:
                continue
            anchor = github_anchor(m.group(1))
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            found.add(anchor if n == 0 else f"{anchor}-{n}")  # GitHub numbers a repeated heading
        for m in re.finditer(r'<a (?:name|id)="([^"]+)"', page.read_text(errors="replace")):
            found.add(m.group(1))
        cache[page] = found
    return cache[page]


problems, checked = [], 0


def check(where: str, page: pathlib.Path, anchor: str, shown: str):
    global checked
    checked += 1
    if not page.exists():
        problems.append(f"{where}: {shown}: no such page")
    elif anchor and page.suffix == ".md" and anchor not in anchors_of(page):
        problems.append(f"{where}: {shown}: {page.relative_to(root)} has no heading for #{anchor}")


# Links in the Markdown pages (every tracked *.md): [text](target) with a relative target.
try:
    tracked = subprocess.run(["git", "-C", str(root), "ls-files", "*.md"], capture_output=True, text=True, check=True)
    pages = sorted(root / line for line in tracked.stdout.splitlines() if line)
except (OSError, subprocess.CalledProcessError):  # not a git checkout: every page but the build's
    pages = sorted(p for p in root.rglob("*.md") if not any(part.startswith(("build", ".")) for part in
                                                              p.relative_to(root).parts))
for page in pages:
    fenced = False
    for number, line in enumerate(page.read_text(errors="replace").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        for target in re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = page if not path else (page.parent / path).resolve()
            check(f"{page.relative_to(root)}:{number}", dest, anchor, target)

# Citations in sources and comments: a path from the repository's root (bench/README.md#x), or a
# page's name meaning docs/NAME.md (README.md and CHANGELOG.md: the root's). Not inside a URL.
CITATION = re.compile(r"(?<![\w/.:\-])((?:[\w\-]+/)*[\w\-]+\.md)#([\w\-]+)")
for folder in SOURCE_FOLDERS:
    for path in sorted((root / folder).rglob("*")):
        if not path.is_file() or path.suffix not in SOURCE_SUFFIXES:
            continue
        if path.resolve() == pathlib.Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            where = f"{path.relative_to(root)}:{number}"
            if re.search(r"(?<![\w/])DESIGN\.md", line):
                problems.append(f"{where}: cites DESIGN.md, which is not in the repository; cite docs/design.md#SECTION")
            if path.suffix == ".md":  # a page's links are checked above
                continue
            for cited, anchor in CITATION.findall(line):
                if "/" in cited:
                    dest = root / cited
                elif cited in ("README.md", "CHANGELOG.md"):
                    dest = root / cited
                else:
                    dest = root / "docs" / cited
                check(where, dest, anchor, f"{cited}#{anchor}")
for p in problems:
    print(p)
print(f"{checked} links and citations checked in {len(pages)} pages and the sources; {len(problems)} broken")
sys.exit(1 if problems else 0)
