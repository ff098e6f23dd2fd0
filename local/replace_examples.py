"""docs/replacing-the-examples.md, done to a project: what ``copier copy`` runs for a project made without the
examples (copier.yml's question ``examples``), and what tests/tooling/test_replacing_the_examples.py checks the page
against. The page is read, not restated, so the page and what a new project gets cannot drift apart.

Run in a project's root: ``python -m local.replace_examples`` removes the examples' files, registrations and template
lines; ``--template-only`` removes their lines of template.yaml alone (an upgrade's renders of the template, which never
hold the application's files).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


def handlers_statement(source: str) -> tuple[ast.AnnAssign, list[ast.expr]]:
    """The ``HANDLERS: ... = (...)`` statement of ``source`` and the entries of its tuple."""
    statements = ast.parse(source).body
    (node,) = [
        node for node in statements if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "HANDLERS"
    ]
    assert isinstance(node.value, ast.Tuple), "HANDLERS is no longer a tuple: update docs/tables.md's step 2 and this"
    return node, node.value.elts


def register(registry: Path, block: str = "", remove: tuple[str, ...] = ()) -> None:
    """docs/tables.md's registration ``block`` (an import, then ``HANDLERS`` with ``...`` for the handlers already
    there) applied to ``registry``: the import among the handler imports, its names at the end of ``HANDLERS``, every
    registration kept but those of ``remove`` (their imports go too)."""
    import_line, statement = block.strip().split("\n", 1) if block else ("", "HANDLERS: T = ()")
    added = [element.id for element in handlers_statement(statement)[1] if isinstance(element, ast.Name)]
    source = registry.read_text()
    node, elements = handlers_statement(source)
    kept = [ast.get_source_segment(source, element) or "" for element in elements]
    names = [name for name in [*kept, *added] if name not in remove]
    lines = source.splitlines(keepends=True)
    # As ruff formats it: one entry on one line, more one per line; none is "(\n)", valid until the next is added.
    tuple_text = (
        f"({', '.join(names)},)" if len(names) == 1 else "(" + "".join(f"\n    {name}," for name in names) + "\n)"
    )
    lines[node.lineno - 1 : node.end_lineno] = [f"HANDLERS: {ast.unparse(node.annotation)} = {tuple_text}\n"]
    lines = [line for line in lines if not (line.startswith("from service.handlers.") and line.split()[-1] in remove)]
    if import_line:
        imports = [i for i, line in enumerate(lines) if line.startswith("from service.handlers.")]
        # With no handler left, the new import goes after the core's imports.
        after = imports or [i for i, line in enumerate(lines) if line.startswith("from consumer.")]
        lines.insert(next((i for i in imports if lines[i] > import_line), after[-1] + 1), import_line + "\n")
    registry.write_text("".join(lines))


def _delete_with_indented(path: Path, block: str) -> None:
    """Each line of ``block`` deleted from ``path`` (where it must appear exactly once) with the lines indented under
    it, as the page asks."""
    lines = path.read_text().splitlines(keepends=True)
    for wanted in filter(str.strip, block.splitlines()):
        found = [i for i, line in enumerate(lines) if line.rstrip("\n") == wanted]
        assert len(found) == 1, f"{wanted!r} is {len(found)} times in {path.name}: update the page's list"
        start, end = found[0], found[0] + 1
        depth = len(wanted) - len(wanted.lstrip())
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > depth):
            end += 1
        del lines[start:end]
    path.write_text("".join(lines))


def _shipped_handlers(project: Path) -> list[str]:
    """The handler classes the project ships, registered (src/service/handlers/) or not (examples/)."""
    modules = [*(project / "src/service/handlers").glob("*.py"), *(project / "examples").glob("*.py")]
    return sorted(
        name for path in modules for name in re.findall(r"^class (\w+)\(MessageHandler\[", path.read_text(), re.M)
    )


def replace_the_examples(project: Path, *, template_only: bool = False) -> None:
    """The page on ``project``: every example's files deleted, its registration removed (a registered example's
    module too), its lines of template.yaml deleted with the lines indented under them."""
    section = (project / "docs" / "replacing-the-examples.md").read_text()
    if not template_only:
        removed = tuple(re.findall(r"^- Registration: `(\w+)`", section, re.MULTILINE))
        assert sorted(removed) == _shipped_handlers(project), "the page names every shipped example's registration"
        for listed in re.findall(r"^- Files: ((?:.|\n  )*)", section, re.MULTILINE):
            for name in re.findall(r"`([^`]+)`", listed):
                (project / name).unlink()
        registry = project / "src/service/registry.py"
        # The refund example's copy, when a user registered it, goes with its registration.
        for module, name in re.findall(r"^from service\.handlers\.(\w+) import (\w+)$", registry.read_text(), re.M):
            if name in removed:
                (registry.parent / "handlers" / f"{module}.py").unlink(missing_ok=True)
        register(registry, remove=removed)
    template = project / "template.yaml"
    for name in re.findall(r"each line marked\s+`# example: (\w+)`", section):
        marked = [line for line in template.read_text().splitlines() if line.endswith(f"  # example: {name}")]
        assert marked, f"no line of template.yaml is marked '# example: {name}': update the page or the template"
        _delete_with_indented(template, "\n".join(marked))
    for block in re.findall(r"^```yaml\n(.*?)^```", section, re.MULTILINE | re.DOTALL):
        _delete_with_indented(template, block)


if __name__ == "__main__":
    replace_the_examples(Path.cwd(), template_only="--template-only" in sys.argv[1:])
