#!/usr/bin/env python3
"""Every `docs/design.md#anchor` cited in the sources names a heading of docs/design.md, and no
source cites the DESIGN.md that is not in the repository: the comments and the design document
cannot drift apart silently. Prints each broken citation (file:line: what) and exits 1."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
design = root / "docs" / "design.md"


def github_anchor(heading: str) -> str:
    # GitHub's rule: lower-case, drop punctuation except '-' and '_', spaces become '-'.
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


anchors = {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", design.read_text(), re.M)}
problems = []
cited = 0
for folder in ("src", "include", "tests", "bench", "docs", "python", "examples"):
    for path in sorted((root / folder).rglob("*")):
        if not path.is_file() or path.suffix not in {".cc", ".h", ".py", ".md", ".txt", ".sh"}:
            continue
        if path.resolve() == pathlib.Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            where = f"{path.relative_to(root)}:{number}"
            for anchor in re.findall(r"design\.md#([\w\-]+)", line):
                cited += 1
                if anchor not in anchors:
                    problems.append(f"{where}: docs/design.md has no heading for #{anchor}")
            if re.search(r"(?<![\w/])DESIGN\.md", line):
                problems.append(f"{where}: cites DESIGN.md, which is not in the repository; cite docs/design.md#SECTION")
for p in problems:
    print(p)
print(f"{cited} citations of docs/design.md checked against {len(anchors)} headings; {len(problems)} broken")
sys.exit(1 if problems else 0)
