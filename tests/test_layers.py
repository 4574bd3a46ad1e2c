"""The house (issue 29): the tree is the architecture, and this test is its rule.

* ``src/ringtrain`` holds the packages of ``LAYERS`` and four files — nothing loose;
* every import of ringtrain by ringtrain, function-level ones too, goes to the importer's own
  package or to a lower layer (``LAYERS`` is bottom first; packages on one line are peers and do
  not import each other);
* no import circle between modules, function-level imports counted;
* every function-level import of ringtrain carries a comment (on its line or the line above) that
  says why it is not at the top;
* docs/architecture.md shows the same list, so the prose cannot drift from the code.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ringtrain

SRC = Path(ringtrain.__file__).resolve().parent
DOC = SRC.parents[1] / "docs" / "architecture.md"

# Bottom first. A module may import its own package and the packages of the lines above its own.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),                          # RingtrainError, HintingParser: how every layer speaks to users
    ("liveness",),                        # is everyone alive and moving (no torch)
    ("tracking",),                        # what a run shows: ring.log, the timeline, pictures
    ("comm",),                            # the collectives core
    ("parallel",),                        # who am I and on what: environments, devices, mesh, process group
    ("loop",),                            # the training loop's parts
    ("checkpoint",),                      # files, state, sharded folders, the folder, resume
    ("strategies",),                      # one file per way of running
    ("planning",),                        # will it fit: memory and step time per layout, on fake tensors
    ("ring",),                            # Ring: the object a script holds
    ("launcher",),                        # starting processes
    ("__init__",),                        # the public names (loaded on first use)
    ("horovod", "bench", "doctor"),       # faces and tools on top
    ("cli",),                             # the `ringtrain` command's dispatcher and its small commands
    ("__main__",),                        # python -m ringtrain
)
FILES = {"__init__.py", "__main__.py", "errors.py", "ring.py"}


def _layer_of() -> dict[str, int]:
    return {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    """Dotted name (``ringtrain.checkpoint.files``) -> file, for every module of the package."""
    found = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _top(name: str) -> str:
    """The layer entry a module belongs to: its package under ringtrain, or the file's own name."""
    parts = name.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _resolve(importer: str, path: Path, node: ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    if node.level:
        package = importer if path.name == "__init__.py" else importer.rsplit(".", 1)[0]
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    targets = []
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        targets.append(candidate if candidate in known else base)
    return targets


def imports() -> list[tuple[str, str, int, bool, Path]]:
    """(importer, imported module, line, function-level?, file) for every import of ringtrain in ringtrain."""
    known = modules()
    out = []
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        inner = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = _resolve(name, path, node, known)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known and target != name and target.split(".")[0] == "ringtrain":
                    out.append((name, target, node.lineno, id(node) in inner, path))
    return out


def test_the_package_holds_only_the_layers():
    layer = _layer_of()
    entries = {p.name for p in SRC.iterdir() if p.name != "__pycache__" and not p.name.endswith(".egg-info")}
    loose = {e for e in entries if e.endswith(".py") and e not in FILES}
    assert not loose, f"modules loose at the top of src/ringtrain (put each in the package of its layer): {loose}"
    unknown = {e for e in entries if not e.endswith(".py") and e not in layer}
    assert not unknown, f"packages that are in no layer (add them to LAYERS and docs/architecture.md): {unknown}"
    assert len(entries) <= 17, sorted(entries)  # 13 packages and the four files


def going_up(found) -> list[str]:
    """The imports of ``found`` (as ``imports()`` gives them) that go up or sideways."""
    layer = _layer_of()
    wrong = []
    for importer, target, line, _, path in found:
        a, b = _top(importer), _top(target)
        if a != b and layer[b] >= layer[a]:
            wrong.append(f"{path.relative_to(SRC.parent)}:{line}: {importer} imports {target} "
                         f"({a} is layer {layer[a]}, {b} is layer {layer[b]})")
    return wrong


def test_every_import_goes_down_the_layers():
    wrong = going_up(imports())
    assert not wrong, "imports that go up or sideways:\n" + "\n".join(wrong)


def test_an_upward_import_is_caught():
    """What the rule catches: liveness reaching up for the Ring, the launcher for a face, a peer for a peer."""
    path = SRC / "liveness" / "watchdog.py"
    for importer, target in (("ringtrain.liveness.watchdog", "ringtrain.ring"),
                             ("ringtrain.checkpoint.files", "ringtrain.strategies.base"),
                             ("ringtrain.launcher.run", "ringtrain.horovod.basics"),
                             ("ringtrain.bench.cli", "ringtrain.doctor.check")):
        assert going_up([(importer, target, 1, False, path)]), (importer, target)
    assert not going_up([("ringtrain.ring", "ringtrain.liveness.watchdog", 1, False, path)])


def test_no_import_circle():
    graph: dict[str, set[str]] = {}
    for importer, target, *_ in imports():
        graph.setdefault(importer, set()).add(target)
    done: set[str] = set()
    stack: list[str] = []

    def visit(module: str) -> None:
        assert module not in stack, f"import circle: {' -> '.join(stack[stack.index(module):] + [module])}"
        if module in done:
            return
        stack.append(module)
        for dep in sorted(graph.get(module, ())):
            visit(dep)
        stack.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def _says_why(lines: list[str], index: int) -> bool:
    """A comment on the import's line, or right above the block of imports it stands in."""
    if "#" in lines[index]:
        return True
    index -= 1
    while index >= 0 and (lines[index].strip().startswith(("from ", "import ", ")")) or not lines[index].strip()
                          or lines[index].startswith(" " * 8) and lines[index].strip().endswith(",")):
        index -= 1
    return index >= 0 and lines[index].strip().startswith("#")


def test_every_function_level_import_says_why():
    silent = []
    for importer, target, line, inner, path in imports():
        if not inner:
            continue
        lines = path.read_text().splitlines()
        if not _says_why(lines, line - 1):
            silent.append(f"{path.relative_to(SRC.parent)}:{line}: {lines[line - 1].strip()}")
    assert not silent, "function-level imports with no comment saying why:\n" + "\n".join(silent)


def test_the_design_document_shows_the_same_layers():
    text = DOC.read_text()
    block = re.search(r"<!-- layers: checked by tests/test_layers.py -->\n```\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no layer block"
    written = []
    for row in block.group(1).splitlines():
        names = row.split("#", 1)[0].split()
        if names:
            written.append(tuple(n.rstrip("/").removesuffix(".py") for n in names))
    assert tuple(reversed(written)) == LAYERS, "docs/architecture.md's layer list differs from tests/test_layers.py"


def test_src_cites_no_design_file_outside_the_repository():
    cited = [str(p.relative_to(SRC.parent)) for p in SRC.rglob("*.py") if "DESIGN.md" in p.read_text()]
    assert not cited, f"cite docs/architecture.md, not a file outside the repository: {cited}"



def test_files_run_by_path_import_ringtrain_absolutely():
    """torchrun starts launcher/worker.py by its path, as a script: a relative import there fails in every worker."""
    tree = ast.parse((SRC / "launcher" / "worker.py").read_text())
    relative = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, f"launcher/worker.py has relative imports at lines {relative}"


def test_the_horovod_alias_imports_ringtrain_absolutely():
    """horovod/_alias is imported as the top-level package ``horovod`` (its folder goes on sys.path): a relative
    import there reaches past the top and fails in every unmodified Horovod script."""
    for path in (SRC / "horovod" / "_alias").rglob("*.py"):
        tree = ast.parse(path.read_text())
        relative = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
        assert not relative, f"{path.relative_to(SRC)} has relative imports at lines {relative}"


def test_test_files_have_unique_names():
    """tests/ has no __init__.py, so pytest imports each test file by its name alone: two folders' test_x.py stop
    the whole suite at collection ("import file mismatch") — a folder's own run does not show it."""
    seen: dict[str, list[str]] = {}
    for path in (SRC.parents[1] / "tests").rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.parent.name))
    twice = {name: folders for name, folders in seen.items() if len(folders) > 1}
    assert not twice, f"rename one of each (tests/<folder>/<name>): {twice}"
