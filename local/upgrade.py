"""``make new`` and ``make upgrade``: this repository is a copier template (copier.yml), a project is made from it by
``copier copy`` and taken to a newer version by ``copier update``, three-way (docs/upgrading.md).

What copier alone does not: a project made before the template existed (v2.1.0, by a clone) is adopted, its answers
file written for the version its core says it is; a file of the core's that the project deleted comes back (copier
takes a deletion as the project's own change and keeps it, where ownership.toml says the core's files are replaced
whole); each entry of the project's own ``yours`` is excluded, so a file of its own is never touched; and a conflict
stops the upgrade with what to do.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from tempfile import TemporaryDirectory

import yaml

ANSWERS = ".copier-answers.yml"


def _copier(*arguments: str, cwd: Path | None = None) -> None:
    subprocess.run([sys.executable, "-m", "copier", *arguments], cwd=cwd, check=True)


def _git(project: Path, *arguments: str) -> str:
    return subprocess.run(["git", *arguments], cwd=project, capture_output=True, text=True, check=True).stdout


def recorded(project: Path) -> tuple[str, str]:
    """The template ``project`` was made from and its version, from its answers file; with none, the project is the
    template itself (this repository), at HEAD with its uncommitted changes (copier takes those of a local HEAD)."""
    if not (project / ANSWERS).exists():
        return str(project.resolve()), "HEAD"
    answers = yaml.safe_load((project / ANSWERS).read_text(encoding="utf-8"))
    return str(answers["_src_path"]), str(answers["_commit"])


def render(project: Path, target: Path) -> Path:
    """The template ``project`` records, at its recorded version, made into ``target``: the project as it was made,
    before any change of its own (the core's proof runs on it, with the examples, whatever the project replaced)."""
    _copy(*recorded(project), target, examples=True)
    return target


def _copy(source: str, ref: str, target: Path, *, examples: bool) -> None:
    """copier copy, the template's one task allowed (``--trust``), its one question answered."""
    _copier("copy", "--quiet", "--trust", "--defaults", "--vcs-ref", ref, "--data", f"examples={examples}", source,
            str(target))  # fmt: skip


def new(template: Path, target: Path, version: str | None, *, examples: bool) -> None:
    """A project at ``target`` from ``template`` as it is checked out (or at ``version``), committed, so that it
    upgrades."""
    _copy(str(template.resolve()), version or "HEAD", target, examples=examples)
    # A version before the template (v2.1.0) records nothing to upgrade from.
    assert (target / ANSWERS).exists(), f"{version} predates copier.yml: it makes no project that upgrades"
    _git(target, "init", "--quiet")
    _git(target, "add", "--all")
    _git(target, "commit", "--quiet", "--message", f"A new project from {template.resolve()}")


def _commit(project: Path, paths: list[str], message: str) -> None:
    _git(project, "add", "--", *paths)
    _git(project, "commit", "--quiet", "--message", message, "--", *paths)


def adopt(project: Path, template: Path) -> None:
    """An answers file for a project made before the template existed: the version its core says it is, with the
    examples (every such project was a clone, examples and all)."""
    version = re.search(r'^__version__ = "(.+)"$', (project / "src/consumer/__init__.py").read_text(), re.M)
    assert version, "src/consumer/__init__.py names no __version__: which core this project has is unknown"
    answers = {"_commit": f"v{version[1]}", "_src_path": str(template.resolve()), "examples": True}
    (project / ANSWERS).write_text(yaml.safe_dump(answers), encoding="utf-8")
    _commit(project, [ANSWERS], f"Record the core's version, v{version[1]}, for make upgrade")


def _ownership(project: Path) -> dict[str, list[str]]:
    return tomllib.loads((project / "ownership.toml").read_text(encoding="utf-8"))


def holds(entries: Iterable[str], path: str) -> bool:
    """Whether ownership.toml's ``entries`` (a column) hold ``path``: a folder's (ending in "/") every file under it, a
    file's itself."""
    return any(path.startswith(entry) if entry.endswith("/") else path == entry for entry in entries)


def restore_ours(project: Path) -> list[str]:
    """The core's files the project deleted, back as its recorded version has them (the update then takes them to the
    new one): the core's column is replaced whole."""
    ours = _ownership(project)["ours"]
    restored = []
    with TemporaryDirectory() as directory:
        old = render(project, Path(directory) / "old")
        for path in sorted(p for p in old.rglob("*") if p.is_file()):
            name = path.relative_to(old).as_posix()
            if holds(ours, name) and not (project / name).exists():
                (project / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, project / name)
                restored.append(name)
    if restored:
        _commit(project, restored, "Restore the core's files an upgrade replaces whole")
    return restored


def upgrade(project: Path, template: Path, version: str | None) -> int:
    if _git(project, "status", "--porcelain"):
        print("make upgrade needs a project with nothing uncommitted: commit (or stash) first", file=sys.stderr)
        return 2
    if not (project / ANSWERS).exists():
        if project.resolve() == template.resolve():
            print("this is the template itself: run make upgrade in a project made from it", file=sys.stderr)
            return 2
        adopt(project, template)
    excluded = [argument for entry in _ownership(project)["yours"] for argument in ("--exclude", entry)]
    reference = ["--vcs-ref", version] if version else []
    try:
        for name in restore_ours(project):
            print(f"restored {name} (the core's, deleted here)")
        _copier("update", "--trust", "--defaults", "--conflict", "inline", *reference, *excluded, cwd=project)
    except subprocess.CalledProcessError as error:
        # copier has said why, above (a version recorded from a template's uncommitted changes cannot be made again);
        # git's answer was captured, so it is told here.
        step = f"copier {error.cmd[3]}" if error.cmd[0] == sys.executable else " ".join(error.cmd[:2])
        why = f": {error.stderr.strip()}" if error.stderr else " (above)"
        print(f"make upgrade stopped: {step} failed{why}", file=sys.stderr)
        return error.returncode
    if conflicts := _git(project, "diff", "--name-only", "--diff-filter=U").split():
        print(
            "The upgrade stopped on conflicts, your lines against the core's new ones, in: " + ", ".join(conflicts)
            + ".\nIn each, keep what both need between <<<<<<< before updating and >>>>>>> after updating, then"
            " `git add` it; then make test and make proof, and commit. `git diff HEAD` shows the whole upgrade.",
            file=sys.stderr,
        )  # fmt: skip
        return 1
    print("Upgraded: review `git diff HEAD`, run make test and make proof, then commit.")
    return 0


def main(arguments: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m local.upgrade")
    parser.add_argument("command", choices=["new", "upgrade"])
    parser.add_argument("--template", type=Path, required=True, help="the template: a checkout of this repository")
    parser.add_argument("--dest", type=Path, help="new: the project's folder")
    parser.add_argument("--version", help="a tag (vX.Y.Z) or HEAD; if left out, upgrade takes the newest tag, new HEAD")
    parser.add_argument("--no-examples", action="store_true", help="new: without the examples")
    options = parser.parse_args(arguments)
    if options.command == "upgrade":
        return upgrade(Path.cwd(), options.template, options.version)
    if options.dest is None:
        parser.error("new needs --dest")
    new(options.template, options.dest, options.version, examples=not options.no_examples)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
