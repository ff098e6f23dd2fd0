"""The lines a template must carry for its core (core-lines.yaml), and those a template lacks.

A template lags its core when an upgrade brought a core that reads a variable, needs a grant or relies on a setting of
the queue that the template, merged by hand, does not have yet. Every other check would fail on that in its own way,
some several times over; this one names each missing line once, with where the core's are and what CHANGELOG.md says.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import consumer
from testkit.template import REPO_ROOT, load_template

CORE_LINES = Path(__file__).parent / "core-lines.yaml"
# A list's entries of these keys are told apart by them: a policy by its name, a statement by its Sid.
_NAMES = ("PolicyName", "Sid")
_VARIABLES = ("Resources", "ConsumerFunction", "Properties", "Environment", "Variables")


def core_variables(document: dict[str, Any] | None = None) -> dict[str, Any]:
    """The function's variables the core needs from its stack (of ``document``, by default core-lines.yaml's): each
    with the value it must have, or None where any value will do."""
    found: Any = load_template(CORE_LINES) if document is None else document
    for key in _VARIABLES:
        found = found.get(key) if isinstance(found, dict) else None
    return found if isinstance(found, dict) else {}


def missing_lines(core: Any, template: Any, path: str = "") -> list[str]:
    """Each line of ``core`` that ``template`` lacks (or gives another value), as ``<path>: <the core's value>``.

    A mapping must have each key of the core's (a key the core leaves empty, with any value); a list each entry of the
    core's, anywhere in it (a statement found by its Sid is compared line by line); an intrinsic function (``!Ref``,
    ``!GetAtt``...) is one value."""
    if core is None:
        return []
    if isinstance(core, dict) and not _intrinsic(core):
        if not isinstance(template, dict):
            return [_line(path, core)]
        missing = []
        for key, value in core.items():
            where = f"{path}.{key}" if path else key
            missing += missing_lines(value, template[key], where) if key in template else [_line(where, value)]
        return missing
    if isinstance(core, list):
        entries = template if isinstance(template, list) else [template]
        missing = []
        for entry in core:
            if any(not missing_lines(entry, theirs) for theirs in entries):
                continue
            named = [theirs for theirs in entries if _name(entry) is not None and _name(theirs) == _name(entry)]
            if named:
                missing += missing_lines(entry, named[0], f"{path}[{_name(entry)}]")
            else:
                missing.append(_line(path, entry))
        return missing
    return [] if core == template else [_line(path, core)]


def misspelt_as(name: str, names: list[str]) -> str | None:
    """The one of ``names`` that ``name``, absent, is taken to be misspelt as: the environment check names it as the
    line to rename, and a lagging template's lines leave it to that check, so both go by this one rule."""
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
    return near[0] if near else None


def lag(template_path: Path) -> str | None:
    """Why the template at ``template_path`` lags its core: every line of the core's it lacks, in one message."""
    core, template = load_template(CORE_LINES), load_template(template_path)
    # A variable of the core's set under a name close to it is misspelt, not missing: test_function names the line
    # to rename. Left to it: ``wanted`` is ``core``'s own mapping, so a name deleted from it is left out of
    # missing_lines below.
    wanted, given = core_variables(core), core_variables(template)
    others = [name for name in given if name not in wanted]
    for name in [name for name in wanted if name not in given]:
        if misspelt_as(name, others):
            del wanted[name]
    missing = missing_lines(core, template)
    if not missing:
        return None
    return (
        f"{template_path.name} lags its core (consumer {consumer.__version__}): merge these lines of the core's"
        f" (tests/deployment/core-lines.yaml has each in its place); CHANGELOG.md says what each is for, in its"
        f' sections from "## {newest_section()}" down to the version you upgraded from:\n  ' + "\n  ".join(missing)
    )


def newest_section(changelog: Path = REPO_ROOT / "CHANGELOG.md") -> str:
    """The title of CHANGELOG.md's newest section with an entry: "Unreleased" while changes gather there, else the
    newest release."""
    sections = re.findall(r"^## (.+)\n((?:(?!## ).*\n?)*)", changelog.read_text(encoding="utf-8"), re.MULTILINE)
    return next(title for title, body in sections if body.strip() not in ("", "Nothing yet."))


def _intrinsic(value: dict[str, Any]) -> bool:
    return len(value) == 1 and all(key == "Ref" or key.startswith("Fn::") for key in value)


def _name(entry: Any) -> str | None:
    return next((str(entry[key]) for key in _NAMES if key in entry), None) if isinstance(entry, dict) else None


def _line(path: str, value: Any) -> str:
    return f"{path}: {_shown(value)}"


def _shown(value: Any) -> str:
    """``value`` as template.yaml would write it: intrinsics in their short form, the rest in YAML's flow style."""
    if value is None:
        return "<a value of yours>"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return f"!Ref {value['Ref']}"
    if isinstance(value, dict) and set(value) == {"Fn::GetAtt"}:
        return f"!GetAtt {'.'.join(value['Fn::GetAtt'])}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_shown(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(map(_shown, value)) + "]"
    return str(value)
