#!/usr/bin/env python3
"""Checks the include rules of docs/design.md: every source file under include/ and src/ belongs
to exactly one part of the table between the include-rules markers, and includes only headers of
its own part or of the parts its row names. Public headers include only public headers.

    include_rules_test.py REPO_ROOT
"""
import fnmatch
import os
import re
import sys


def parse_rules(design_md):
    text = open(design_md, encoding="utf-8").read()
    begin = text.index("<!-- include-rules -->")
    end = text.index("<!-- /include-rules -->")
    parts = {}
    order = []
    for line in text[begin:end].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("part", "") or set(cells[0]) <= set("-"):
            continue
        name, files, allowed = cells
        globs = re.findall(r"`([^`]+)`", files)
        deps = {d.strip() for d in allowed.split(",") if d.strip()}
        parts[name] = (globs, deps)
        order.append(name)
    unknown = {d for _, deps in parts.values() for d in deps} - set(parts)
    if unknown:
        raise SystemExit(f"docs/design.md names unknown parts: {sorted(unknown)}")
    return parts, order


def part_of(path, parts, order):
    owners = [n for n in order if any(fnmatch.fnmatch(path, g) for g in parts[n][0])]
    return owners


def main(root):
    parts, order = parse_rules(os.path.join(root, "docs", "design.md"))
    problems = []
    sources = []
    for top in ("include", "src"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                if n.endswith((".h", ".cpp")):
                    sources.append(os.path.relpath(os.path.join(dirpath, n), root))
    include_re = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    checked = 0
    for path in sorted(sources):
        owners = part_of(path, parts, order)
        if len(owners) != 1:
            problems.append(f"{path}: belongs to {owners or 'no part'} of docs/design.md")
            continue
        mine = owners[0]
        allowed = parts[mine][1] | {mine}
        text = open(os.path.join(root, path), encoding="utf-8").read()
        for target in include_re.findall(text):
            target_path = ("include/" + target) if target.startswith("dcp/") else ("src/" + target)
            if not os.path.exists(os.path.join(root, target_path)):
                problems.append(f"{path}: includes \"{target}\", which is not in include/ or src/")
                continue
            checked += 1
            if path.startswith("include/") and not target_path.startswith("include/"):
                problems.append(f"{path}: a public header includes the private \"{target}\"")
                continue
            theirs = part_of(target_path, parts, order)
            if len(theirs) == 1 and theirs[0] not in allowed:
                problems.append(
                    f"{path} ({mine}): includes \"{target}\" ({theirs[0]}); "
                    f"{mine} may include only {sorted(allowed)}")
    print(f"{root}: {len(sources)} files, {checked} project includes checked against "
          f"{len(parts)} parts")
    for p in problems:
        print("VIOLATION: " + p)
    return problems


def self_test(root):
    """The checker must catch what it is for: a copy of the rules with a planner file that
    includes storage, a public header that includes a private one, and a file in no part."""
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "docs"))
        shutil.copy(os.path.join(root, "docs", "design.md"), os.path.join(tmp, "docs"))
        files = {
            "src/storage/paths.h": "",
            "src/planner/bad.cpp": '#include "storage/paths.h"\n',
            "include/dcp/planner.h": '#include "storage/paths.h"\n',
            "src/stray.cpp": "",
        }
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(text)
        problems = main(tmp)
    expected = ["src/planner/bad.cpp (planner): includes \"storage/paths.h\" (storage)",
                "include/dcp/planner.h: a public header includes the private",
                "src/stray.cpp: belongs to no part"]
    missed = [e for e in expected if not any(p.startswith(e) for p in problems)]
    if missed:
        print("SELF-TEST FAILED: not caught: " + "; ".join(missed))
    return not missed


if __name__ == "__main__":
    repo = sys.argv[1] if len(sys.argv) > 1 else "."
    ok = self_test(repo)
    problems = main(repo)
    sys.exit(0 if ok and not problems else 1)
