#!/usr/bin/env python3
"""Checks that the project's documentation points only at things inside the repository.

A clone of the project has nothing but its own files, so every reason and reference must live in
them. Three checks, each failure printed as `FILE:LINE: broken link TARGET (why)`:

1. Links. Every relative link in README.md and docs/**/*.md (`[text](target)`, `![alt](target)`,
   `[name]: target`; not inside code) resolves to a file or folder of the repository, and a
   `#fragment` to a heading of that file under GitHub's anchor rules (lowercase; punctuation other
   than '-' and '_' dropped; spaces become '-'; a repeated heading gets -1, -2, ...).
2. Citations. Every mention of a doc page in a tracked text file, `docs/NAME.md`, names a page that
   exists; followed by `#anchor` it must be a heading's anchor, followed by ` "Heading"` (how code
   comments cite a section) a heading of the page must start with that text.
3. Outside references. No tracked file mentions the parent project's folders (`../shared`,
   `shared/spec`, `shared/notes`). Exempt: this script, and in .ci/ and scripts/ the invocations
   of the fresh-machine tool `../shared/tools/fresh-check` (a tool the CI machine runs, not a
   citation); any other outside reference on such a line still fails.

Files are those `git ls-files` lists, or, when ROOT is not the top of a git work tree (or git is
not installed), every file under ROOT less .git/ and the top-level names .gitignore lists plainly
(build/, runs/). Python 3 standard library only.

Usage: scripts/check_links.py [ROOT]     ROOT defaults to the repository holding this script.
Exit status: 0 all good (prints `check_links: N links in M files OK`), 1 failures, 2 usage.
"""
import os
import re
import subprocess
import sys
import urllib.parse

SELF = "scripts/check_links.py"
_OUTSIDE = r"(?:\.\./shared|shared/spec|shared/notes)"
_PATH_CHARS = r"[^\s`'\"()<>\[\]]*"
OUTSIDE = re.compile(_OUTSIDE)
OUTSIDE_TOKEN = re.compile(_PATH_CHARS + _OUTSIDE + _PATH_CHARS)  # the whole path, for the report
TOOL_CALL = "../shared/tools/fresh-check"
TOOL_CALL_DIRS = (".ci/", "scripts/")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")  # ATX; closing #s dropped
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title"), ![alt](<target>): the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]"
                         r"\(\s*<?([^)\s>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")
CITATION = re.compile(r"(?<![\w./-])(docs/[\w./-]*?\.md)(?:#([\w-]+)|\s+\"([^\"\n]+)\")?")


def list_files(root):
    """Repository-relative paths of the files to check, with '/' separators."""
    try:
        top = subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"], check=True,
                             capture_output=True, text=True).stdout.strip()
        if os.path.realpath(top) == os.path.realpath(root):
            out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                                 capture_output=True).stdout
            return sorted(p for p in out.decode().split("\0") if p)
    except (OSError, subprocess.CalledProcessError):
        pass  # no git, or ROOT is not the top of a work tree: walk the folder
    # Without git: every file, less .git/ and what the top-level .gitignore names plainly
    # (`/build/`, `/runs/`, `*.swp`: run outputs are not part of the project).
    skip_dirs, skip_suffixes = {".git", "build"}, set()
    try:
        with open(os.path.join(root, ".gitignore")) as f:
            for entry in (line.strip() for line in f):
                if entry.startswith("*.") and "/" not in entry:
                    skip_suffixes.add(entry[1:])
                elif entry and not entry.startswith("#") and not any(c in entry for c in "*?[!"):
                    skip_dirs.add(entry.strip("/"))
    except OSError:
        pass
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        at_top = os.path.relpath(dirpath, root) == "."
        dirnames[:] = [d for d in dirnames if d != ".git" and not (at_top and d in skip_dirs)]
        filenames = [n for n in filenames if not (at_top and n in skip_dirs)
                     and not n.endswith(tuple(skip_suffixes))]
        for name in filenames:
            files.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return sorted(files)


def read_text(root, path):
    try:
        with open(os.path.join(root, path), "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def github_anchor(text):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


class Page:
    """The headings of one markdown file: their texts and GitHub anchors."""

    def __init__(self, text):
        self.headings, self.anchors = [], set()
        counts = {}
        in_fence = False
        for line in text.split("\n"):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            self.anchors.update(HTML_ANCHOR.findall(line))
            m = HEADING.match(line)
            if not m:
                continue
            title = m.group(2)
            self.headings.append(title.replace("`", ""))
            base = github_anchor(title)
            n = counts.get(base, 0)
            counts[base] = n + 1
            self.anchors.add(base if n == 0 else f"{base}-{n}")

    def has_heading_starting(self, text):
        want = text.replace("`", "").strip().lower()
        return any(h.strip().lower().startswith(want) for h in self.headings)


class Checker:
    def __init__(self, root):
        self.root = root
        # A file deleted from the work tree but still in git's index is gone for a reader.
        self.files = [f for f in list_files(root) if os.path.isfile(os.path.join(root, f))]
        self.tracked = set(self.files)
        self.dirs = {"."}
        for f in self.files:
            parts = f.split("/")
            for i in range(1, len(parts)):
                self.dirs.add("/".join(parts[:i]))
        self.pages = {}
        self.failures = []
        self.links = 0

    def page(self, path):
        if path not in self.pages:
            text = read_text(self.root, path)
            self.pages[path] = Page(text) if text is not None else None
        return self.pages[path]

    def fail(self, path, line, target, why):
        self.failures.append(f"{path}:{line}: broken link {target} ({why})")

    def resolve(self, base_dir, target):
        """Repository-relative path of `target` seen from `base_dir`, or None if it leaves ROOT."""
        joined = os.path.normpath(os.path.join(base_dir, target)).replace(os.sep, "/")
        if joined == ".." or joined.startswith("../") or os.path.isabs(joined):
            return None
        return joined

    def check_anchor(self, path, line, target, file, anchor):
        if not file.endswith(".md"):
            return
        page = self.page(file)
        if page is not None and anchor.lower() not in page.anchors:
            self.fail(path, line, target, f"no heading #{anchor} in {file}")

    def check_link(self, path, line, target):
        if not target or SCHEME.match(target):
            return
        self.links += 1
        file_part, _, anchor = target.partition("#")
        file_part = urllib.parse.unquote(file_part)
        if not file_part:
            file = path
        else:
            file = self.resolve(os.path.dirname(path) or ".", file_part)
            if file is None:
                self.fail(path, line, target, "points outside the repository")
                return
            if file not in self.tracked and file not in self.dirs:
                self.fail(path, line, target, "no such file in the repository")
                return
        if anchor:
            self.check_anchor(path, line, target, file, anchor)

    def check_markdown_links(self, path, text):
        in_fence = False
        for number, line in enumerate(text.split("\n"), 1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            prose = CODE_SPAN.sub("", line)
            for m in INLINE_LINK.finditer(prose):
                self.check_link(path, number, m.group(1))
            m = REF_DEF.match(prose)
            if m:
                self.check_link(path, number, m.group(1))

    def check_citations(self, path, text):
        markdown = path.endswith(".md")
        for number, line in enumerate(text.split("\n"), 1):
            if markdown:  # link targets are the link check's
                line = re.sub(r"\]\([^)]*\)", "]", line)
            for m in CITATION.finditer(line):
                file, anchor, heading = m.group(1), m.group(2), m.group(3)
                target = m.group(0)
                self.links += 1
                if file not in self.tracked:
                    self.fail(path, number, target, "no such file in the repository")
                elif anchor:
                    self.check_anchor(path, number, target, file, anchor)
                elif heading:
                    page = self.page(file)
                    if page is not None and not page.has_heading_starting(heading):
                        self.fail(path, number, target, f"no heading \"{heading}\" in {file}")

    def check_outside(self, path, text):
        if path == SELF:
            return
        tool_calls_allowed = path.startswith(TOOL_CALL_DIRS)
        for number, line in enumerate(text.split("\n"), 1):
            if not OUTSIDE.search(line):
                continue
            rest = line.replace(TOOL_CALL, "") if tool_calls_allowed else line
            for m in OUTSIDE_TOKEN.finditer(rest):
                self.fail(path, number, m.group(0), "points outside the repository")

    def run(self):
        scanned = 0
        for path in self.files:
            text = read_text(self.root, path)
            if text is None:
                continue
            scanned += 1
            if path == "README.md" or (path.startswith("docs/") and path.endswith(".md")):
                self.check_markdown_links(path, text)
            if path != SELF:
                self.check_citations(path, text)
            self.check_outside(path, text)
        return scanned


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        print("usage: scripts/check_links.py [ROOT]", file=sys.stderr)
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    root = argv[1] if len(argv) == 2 else os.path.dirname(here)
    if not os.path.isdir(root):
        print(f"check_links: {root} is not a folder", file=sys.stderr)
        return 2
    checker = Checker(root)
    scanned = checker.run()
    for failure in checker.failures:
        print(failure)
    if checker.failures:
        print(f"check_links: {len(checker.failures)} broken of {checker.links} links in "
              f"{scanned} files", file=sys.stderr)
        return 1
    print(f"check_links: {checker.links} links in {scanned} files OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
