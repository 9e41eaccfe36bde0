#!/usr/bin/env python3
"""Packs a results directory's raw files into one raw.tar.gz (bench/results/README.md).

Usage: bench/archive-raw.py [--dry-run] bench/results/<date>-<scenario> [...]

Raw: per-run results and logs (*.json but summary*.json, results.json and *config*.json;
*.txt but environment.txt, Cargo.toml.txt, main.rs.txt, notes*, README* and commands*;
*.log, *.jsonl, *.csv, *.tsv, *.du, *.bytes, *.folded, perf.data*), in the directory and
below it. Kept in place: everything else
(summary.md and other notes, results.json, summary.json, scripts, patches, SVG plots and flame
graphs) and any raw file that a .md file of the repository links to or names by its
bench/results/ path. The archive is reproducible (sorted names, fixed mtime and owner, gzip -n);
the originals are removed with `git rm` when tracked, else deleted. A directory that already has
a raw.tar.gz is refused: extract it first, then run again on the whole directory.
"""
import os
import re
import subprocess
import sys

RAW_EXT = {"json", "txt", "log", "jsonl", "csv", "tsv", "du", "bytes", "folded"}
KEEP_NAMES = {"results.json", "environment.txt", "Cargo.toml.txt", "main.rs.txt"}


def is_raw(name):
    if name in KEEP_NAMES or name.startswith(("summary", "notes", "README", "commands")) or "config" in name:
        return False
    if name.startswith("perf.data"):
        return True
    return "." in name and name.rsplit(".", 1)[1] in RAW_EXT


def linked_files(root):
    """Files any .md of the repository links to, or names by a bench/results/ path."""
    found = set()
    for dp, dn, fn in os.walk(root):
        dn[:] = [d for d in dn if d not in (".git", "target")]
        for f in fn:
            if not f.endswith(".md"):
                continue
            text = open(os.path.join(dp, f), errors="replace").read()
            for m in re.finditer(r"\]\(([^)\s]+)\)", text):
                found.add(os.path.normpath(os.path.join(dp, m.group(1).split("#")[0])))
            for m in re.finditer(r"bench/results/[^\s`)'\",;]+", text):
                found.add(os.path.normpath(os.path.join(root, m.group(0).rstrip(".:"))))
    return found


def main(argv):
    dry = "--dry-run" in argv
    dirs = [a for a in argv if a != "--dry-run"]
    if not dirs:
        sys.exit(__doc__)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    linked = linked_files(root)
    for d in dirs:
        d = os.path.abspath(d)
        archive = os.path.join(d, "raw.tar.gz")
        raw = []
        for dp, dn, fn in os.walk(d):
            for f in fn:
                p = os.path.join(dp, f)
                if is_raw(f) and p not in linked:
                    raw.append(os.path.relpath(p, d))
        raw.sort()
        print(f"{d}: {len(raw)} raw files")
        if not raw or dry:
            continue
        if os.path.exists(archive):
            sys.exit(f"{archive} exists: extract it first (tar -xzf raw.tar.gz), then run again")
        listing = "\n".join(raw) + "\n"
        tar = subprocess.Popen(
            ["tar", "--sort=name", "--mtime=2026-12-07 00:00:00Z", "--owner=0", "--group=0",
             "--numeric-owner", "-C", d, "-cf", "-", "-T", "-"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        with open(archive, "wb") as out:
            gz = subprocess.Popen(["gzip", "-9n"], stdin=tar.stdout, stdout=out)
            tar.stdout.close()
            tar.communicate(listing.encode())
            gz.wait()
        if tar.returncode or gz.returncode:
            sys.exit(f"{archive}: tar or gzip failed")
        listed = subprocess.run(["tar", "-tzf", archive], capture_output=True, text=True,
                                check=True).stdout.split("\n")
        if sorted(x for x in listed if x) != raw:
            sys.exit(f"{archive}: the archive does not list exactly the raw files; nothing removed")
        for rel in raw:
            tracked = subprocess.run(["git", "ls-files", "--error-unmatch", rel], cwd=d,
                                     capture_output=True).returncode == 0
            if tracked:
                subprocess.run(["git", "rm", "-q", "--", rel], cwd=d, check=True)
            else:
                os.remove(os.path.join(d, rel))
        print(f"{archive}: {os.path.getsize(archive)} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
