"""benchmarks/results/INDEX.md: which result file backs which claim.

For every file of ``benchmarks/results/`` (the current record of each benchmark and card)
the index gives the command that wrote it, its date, the code (the commit that added the
file: it was measured on that commit's parent or a working tree close to it), and the
README / docs sections that cite it; for every file of ``history/`` (superseded runs, one
JSON per benchmark: ``benchmarks/results_history.py``) its runs and the pages citing it.

Command, date and commit come from the file's own ``command`` / ``date`` / ``commit``
fields where it has them, else from the sidecar ``benchmarks/results/provenance.json``.
A new result file needs an entry there (after committing the file)::

    python benchmarks/results_index.py --add NAME --command "python benchmarks/bench_x.py ..."
    python benchmarks/results_index.py            # rewrite INDEX.md
    python benchmarks/results_index.py --check    # exit 1 when INDEX.md is stale

tests/unit/test_results_index.py checks that INDEX.md is current, that every current file
is cited by README.md or a docs page, and that every ``benchmarks/results/...`` path the
README, docs, code or tests name exists."""

from __future__ import annotations

import argparse
import fnmatch
import json
import pathlib
import re
import subprocess
import sys

__all__ = ["META", "Citation", "cited_paths", "citations", "current_files", "history_files",
           "index", "missing_paths", "provenance", "uncited"]

ROOT = pathlib.Path(__file__).resolve().parents[1]
META = ("INDEX.md", "provenance.json")
"""Files of benchmarks/results/ that are about the results, not results."""
FIELDS = ("command", "date", "commit")

Citation = tuple[str, str, str]
"""(page relative to the root, heading, anchor) of a README / docs line citing a file."""


def _results(root: pathlib.Path) -> pathlib.Path:
    return root / "benchmarks" / "results"


def current_files(root: pathlib.Path = ROOT) -> list[str]:
    """Names of the current records (benchmarks/results/ itself, less :data:`META`)."""
    return sorted(p.name for p in _results(root).iterdir()
                  if p.is_file() and p.name not in META)


def history_files(root: pathlib.Path = ROOT) -> list[str]:
    """Names of the history files, as ``history/NAME``."""
    folder = _results(root) / "history"
    return sorted(f"history/{p.name}" for p in folder.glob("*") if p.is_file()) \
        if folder.is_dir() else []


def _own_fields(path: pathlib.Path) -> dict:
    if path.suffix != ".json":
        return {}
    doc = json.loads(path.read_text(encoding="utf-8"))
    return {k: str(doc[k]) for k in FIELDS if isinstance(doc, dict) and doc.get(k)}


def provenance(name: str, root: pathlib.Path = ROOT) -> dict:
    """Command, date and commit of a current file: its own fields over the sidecar's."""
    sidecar_path = _results(root) / "provenance.json"
    sidecar = json.loads(sidecar_path.read_text(encoding="utf-8")) \
        if sidecar_path.exists() else {}
    found = {**sidecar.get(name, {}), **_own_fields(_results(root) / name)}
    lacking = [k for k in FIELDS if not found.get(k)]
    if lacking:
        raise ValueError(
            f"benchmarks/results/{name}: no {'/'.join(lacking)} in the file or in "
            f"benchmarks/results/provenance.json; commit the file, then run python "
            f"benchmarks/results_index.py --add {name} --command '...'")
    return {k: found[k] for k in FIELDS}


# ----- who cites what ------------------------------------------------------------------
_PATH = re.compile(r"benchmarks/results/(?:[\w.*/-]|<[^<>]*>|\{[^{}]*\}|"
                   r"\$\((?:[^()]|\([^()]*\))*\))*[\w*>}]")
"""A results path as README, docs or code write it; ``*``, ``<placeholder>``,
``{name}`` and ``$(make function)`` parts stand for any text."""


def _as_glob(path: str) -> str:
    return re.sub(r"<[^<>]*>|\{[^{}]*\}|\$\((?:[^()]|\([^()]*\))*\)", "*", path)


def _pages(root: pathlib.Path) -> list[pathlib.Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _cites(line: str, name: str) -> bool:
    """Whether a line names ``name`` (a current file, or ``history/NAME``) as a results
    path, a bare file name, or a pattern matching it (``mcore_lane_*.txt``; not one
    that names every file, ``*.json``)."""
    history = name.startswith("history/")
    base = name.split("/")[-1]
    for match in re.finditer(r"[\w./*-]*" + re.escape(base) + r"(?![\w-])", line):
        prefix = match.group(0)[:-len(base)]
        if history and prefix.endswith("history/"):
            return True
        if not history and (prefix == "" or prefix.endswith("results/")):
            return True
    for path in _PATH.findall(line):
        pattern = _as_glob(path)[len("benchmarks/results/"):]
        if "*" in pattern and not pattern.startswith("*") \
                and (pattern.startswith("history/") == history) \
                and fnmatch.fnmatch(name, pattern):
            return True
    return False


def citations(name: str, root: pathlib.Path = ROOT) -> list[Citation]:
    """The README / docs sections with a line citing ``name`` (outside code blocks)."""
    found: list[Citation] = []
    for page in _pages(root):
        heading, fenced = "", False
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif not fenced and _cites(line, name):
                cite = (str(page.relative_to(root)), heading, _slug(heading) if heading else "")
                if cite not in found:
                    found.append(cite)
    return found


def uncited(root: pathlib.Path = ROOT) -> list[str]:
    """Current files no README / docs line cites."""
    return [name for name in current_files(root) if not citations(name, root)]




def cited_paths(root: pathlib.Path = ROOT) -> dict[str, list[str]]:
    """Every ``benchmarks/results/...`` path that README, docs, code, tests, the Makefile
    and the shell scripts name, with the files naming it (results/ itself excluded)."""
    sources = [*_pages(root), root / "Makefile", root / "csrc" / "README.md"]
    for folder, pattern in (("odc_pp", "*.py"), ("tools", "*"), ("tests", "*.py"),
                            ("benchmarks", "*.py"), ("benchmarks/data", "*")):
        sources += sorted((root / folder).rglob(pattern)) if folder != "benchmarks" \
            else sorted((root / folder).glob(pattern))
    out: dict[str, list[str]] = {}
    for source in sources:
        if not source.is_file() or source.suffix in (".so", ".pyc"):
            continue
        for path in _PATH.findall(source.read_text(encoding="utf-8", errors="replace")):
            out.setdefault(path, []).append(str(source.relative_to(root)))
    return out


def missing_paths(root: pathlib.Path = ROOT, *, not_yet: frozenset = frozenset()) -> dict:
    """Cited results paths that name no file (a ``*`` or ``$(...)`` pattern: that match
    nothing); ``not_yet``: output paths of scripts no one has run yet."""
    missing = {}
    for path, sources in cited_paths(root).items():
        rel = path[len("benchmarks/results/"):]
        if rel in not_yet:
            continue
        pattern = _as_glob(path)
        hits = list(root.glob(pattern)) if "*" in pattern else \
            ([root / path] if (root / path).exists() else [])
        if not hits:
            missing[path] = sources
    return missing


# ----- the index -----------------------------------------------------------------------
def _backs(name: str, root: pathlib.Path) -> str:
    cites = citations(name, root)
    links = [f"[{page}{' § ' + heading if heading else ''}](../../{page}"
             f"{'#' + anchor if anchor else ''})" for page, heading, anchor in cites]
    return "<br>".join(links) if links else "(cited nowhere)"


def _history_row(name: str, root: pathlib.Path) -> str:
    doc = json.loads((_results(root) / name).read_text(encoding="utf-8"))
    if "logs" in doc:
        dates = sorted({meta["date"] for meta in doc["added"].values()})
        what = f"{len(doc['logs'])} logs from {len(doc['added'])} files"
    else:
        dates = sorted({run["date"] for run in doc["runs"]})
        pooled = sum(bool(run.get("pooled")) for run in doc["runs"])
        count = len(doc["runs"])
        what = f"{count} run{'s' if count > 1 else ''}" + (f" ({pooled} pooled)" if pooled else "")
    span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} .. {dates[-1]}"
    about = doc["about"].replace("|", "\\|")
    return f"| [`{name}`]({name}) | {what} | {span} | {about} | {_backs(name, root)} |"


def index(root: pathlib.Path = ROOT) -> str:
    """The text of INDEX.md."""
    lines = ["# benchmarks/results: which file backs which claim", "",
             "Generated by `python benchmarks/results_index.py` (do not edit; "
             "tests/unit/test_results_index.py checks it is current). One current record per "
             "benchmark and card; superseded runs are merged into one `history/` file per "
             "benchmark (`benchmarks/results_history.py`). *Code* is the commit that added "
             "the file (measured on its parent or a working tree close to it); command, "
             "date and code come from the file's own fields or from `provenance.json`.", "",
             "| file | command | date | code | backs |", "| --- | --- | --- | --- | --- |"]
    for name in current_files(root):
        meta = provenance(name, root)
        command = meta["command"].replace("|", "\\|")
        lines.append(f"| [`{name}`]({name}) | `{command}` | {meta['date'][:10]} | "
                     f"{meta['commit']} | {_backs(name, root)} |")
    lines += ["", "## History", "", "| file | holds | dates | about | backs |",
              "| --- | --- | --- | --- | --- |"]
    lines += [_history_row(name, root) for name in history_files(root)]
    return "\n".join(lines) + "\n"


def _git_added(name: str, root: pathlib.Path) -> tuple[str, str]:
    out = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--",
                          f"benchmarks/results/{name}"], cwd=root, capture_output=True,
                         text=True, check=True).stdout.split()
    if not out:
        raise SystemExit(f"benchmarks/results/{name}: not committed yet; commit it first")
    return out[0], out[1]


def add(name: str, command: str, root: pathlib.Path = ROOT) -> None:
    """Record ``name``'s command, and date and commit from git, in provenance.json."""
    if not (_results(root) / name).is_file():
        raise SystemExit(f"--add: benchmarks/results/{name} does not exist")
    path = _results(root) / "provenance.json"
    sidecar = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    commit, date = _git_added(name, root)
    sidecar[name] = {"command": command, "date": date, "commit": commit}
    path.write_text(json.dumps(dict(sorted(sidecar.items())), indent=1) + "\n",
                    encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when INDEX.md is not what this script writes")
    parser.add_argument("--add", metavar="NAME",
                        help="record NAME's command (--command), date and commit")
    parser.add_argument("--command", help="the command that wrote the --add file")
    args = parser.parse_args(argv)
    if args.add:
        if not args.command:
            parser.error("--add needs --command")
        add(args.add, args.command)
    target = _results(ROOT) / "INDEX.md"
    text = index()
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            print(f"{target.relative_to(ROOT)} is stale: run python "
                  "benchmarks/results_index.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
