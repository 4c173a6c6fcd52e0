#!/usr/bin/env python3
"""scripts/check_links.py on small made-up repositories: good links pass (exit 0), each kind of
broken link fails (exit 1) naming the file, the line and the target.

Run: python3 tests/scripts/check_links_test.py   (ctest runs it as check_links.selftest)

The outside references these cases need are assembled from pieces, so that this file itself
mentions none and passes the checker when it checks the real repository.
"""
import os
import subprocess
import sys
import tempfile
import unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                       "check_links.py")
DOCS = "docs"
PARENT = ".." + "/shared"                         # the parent project's folder
SPEC = PARENT + "/spec/runtime.md"
NOTES = "shared" + "/notes"
TOOL = PARENT + "/tools/fresh-check"

GOOD_PAGE = """# A page

## Streams and events

Some text, a [link back](../README.md#a-project) and one to [itself](#streams-and-events).

## `epo bench`: running it

## Measured

## Measured

```bash
# not a heading; [not a link](missing.md)
```

Inline code is not a link: `[x](missing.md)`.
"""


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full) or root, exist_ok=True)
    with open(full, "w") as f:
        f.write(text)


def good_repo(root):
    write(root, "README.md",
          f"# A project\n\nSee [the page]({DOCS}/page.md), [its section]"
          f"({DOCS}/page.md#streams-and-events), [a folder]({DOCS}/) and [a heading with code]"
          f"({DOCS}/page.md#epo-bench-running-it).\n"
          f"[the second Measured]: {DOCS}/page.md#measured-1\n"
          "External links are not checked: [x](https://example.com/a.md).\n")
    write(root, f"{DOCS}/page.md", GOOD_PAGE)
    write(root, "src/thing.h",
          f"// Why: {DOCS}/page.md \"Streams and events\"; also {DOCS}/page.md#measured and "
          f"{DOCS}/page.md \"Measured\".\n")
    write(root, ".ci/run", f"#!/bin/sh\n{TOOL} . './scripts/test.sh'\n")
    write(root, "scripts/fresh.sh", f"#!/bin/sh\nexec {TOOL} --rebuild . \"$@\"\n")


def run_checker(root):
    return subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)


class CheckLinks(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        good_repo(self.root)

    def tearDown(self):
        self.tmp.cleanup()

    def assert_ok(self):
        r = run_checker(self.root)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"^check_links: \d+ links in \d+ files OK$")

    def assert_broken(self, where, target):
        r = run_checker(self.root)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(f"{where}: broken link {target}", r.stdout)

    def test_good_links_pass(self):
        self.assert_ok()

    def test_missing_file_fails(self):
        write(self.root, "README.md", f"# A project\n\nSee [gone]({DOCS}/gone.md).\n")
        self.assert_broken("README.md:3", f"{DOCS}/gone.md")

    def test_missing_anchor_fails(self):
        with open(os.path.join(self.root, DOCS, "page.md"), "a") as f:
            f.write("\nSee [nowhere](#no-such-heading).\n")
        self.assert_broken(f"{DOCS}/page.md:19", "#no-such-heading")

    def test_link_leaving_the_repository_fails(self):
        write(self.root, f"{DOCS}/other.md", "# Other\n\n[up](../../outside.md)\n")
        self.assert_broken(f"{DOCS}/other.md:3", "../../outside.md")

    def test_outside_spec_in_a_comment_fails(self):
        write(self.root, "src/rule.cpp", f"// the rule ({SPEC} section 3)\nint x;\n")
        self.assert_broken("src/rule.cpp:1", SPEC)

    def test_outside_notes_in_a_doc_fails(self):
        write(self.root, f"{DOCS}/notes.md", f"# Notes\n\nas measured in {NOTES}/facts.md\n")
        self.assert_broken(f"{DOCS}/notes.md:3", f"{NOTES}/facts.md")

    def test_tool_call_outside_ci_and_scripts_fails(self):
        write(self.root, f"{DOCS}/fresh.md", f"# Fresh\n\nRun `{TOOL} .`\n")
        self.assert_broken(f"{DOCS}/fresh.md:3", TOOL)

    def test_tool_call_line_with_another_outside_reference_fails(self):
        write(self.root, ".ci/run", f"#!/bin/sh\n{TOOL} . './scripts/test.sh'  # {SPEC}\n")
        self.assert_broken(".ci/run:2", SPEC)

    def test_citation_of_a_missing_heading_fails(self):
        write(self.root, "src/thing.h", f"// Why: {DOCS}/page.md \"Schedules\"\n")
        self.assert_broken("src/thing.h:1", f"{DOCS}/page.md \"Schedules\"")

    def test_citation_of_a_missing_page_fails(self):
        write(self.root, "tests/thing_test.cpp", f"// see {DOCS}/nope.md\n")
        self.assert_broken("tests/thing_test.cpp:1", f"{DOCS}/nope.md")

    @unittest.skipUnless(subprocess.run(["git", "--version"], capture_output=True).returncode == 0,
                         "git not installed")
    def test_in_a_git_work_tree_an_untracked_target_fails(self):
        def git(*args):
            subprocess.run(["git", "-C", self.root, *args], check=True, capture_output=True)

        git("init", "-q")
        git("add", "-A")
        self.assert_ok()
        write(self.root, f"{DOCS}/untracked.md", "# Untracked\n")
        write(self.root, "README.md", f"# A project\n\n[new]({DOCS}/untracked.md)\n")
        self.assert_broken("README.md:3", f"{DOCS}/untracked.md")


if __name__ == "__main__":
    unittest.main()
