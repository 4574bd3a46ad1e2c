"""Write docs/api.md, the API reference, from the docstrings of ringtrain's public names.

    .venv/bin/python scripts/api_reference.py            # (re)write docs/api.md
    .venv/bin/python scripts/api_reference.py --check    # exit 1 when docs/api.md is not what the code says

The public names are what a script reaches: ``rt.Ring`` and its methods and properties, the other names of
``ringtrain.__all__`` (``rt.launch``, ``rt.spawn``, ``rt.split``, ``rt.SyncBatchNorm``, ...), every name of
``rt.strategies.__all__`` and of ``ringtrain.horovod.__all__``, and the ``ringtrain`` command's subcommands.
Plain ``inspect``: each entry is the name, its signature and its docstring as written (``code`` spelled the
Markdown way). tests/test_docs.py regenerates the page and compares, and fails on a public name without a
docstring (``missing()``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"


@dataclass(frozen=True)
class Entry:
    name: str        # as a script spells it: rt.Ring.setup, rt.strategies.FSDP, hvd.allreduce, ringtrain run
    kind: str        # class, method, property, function, value, command
    signature: str   # "(model, *more, **options)", or "" where there is none
    doc: str         # the docstring, cleaned by inspect.getdoc; "" when there is none


class _Written(str):
    """An annotation as its module wrote it (``from __future__ import annotations`` keeps it a string): shown
    bare, ``strategy: str | Strategy``, not quoted, ``strategy: 'str | Strategy'``."""

    def __repr__(self) -> str:
        return str(self)


def _bare(annotation):
    return _Written(annotation) if isinstance(annotation, str) else annotation


def _signature(obj) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    sig = sig.replace(parameters=[p.replace(annotation=_bare(p.annotation)) for p in sig.parameters.values()],
                      return_annotation=_bare(sig.return_annotation))
    text = str(sig)
    return re.sub(r" at 0x[0-9a-f]+", "", text)  # an object's default repr: stable across runs


def _doc(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    if isinstance(obj, type) and doc == inspect.getdoc(object):
        return ""
    return doc


def _ring_members(cls) -> list[Entry]:
    """The Ring's own public methods and properties, in the order its class defines them."""
    entries = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            entries.append(Entry(f"rt.Ring.{name}", "property", "", _doc(member)))
        elif isinstance(member, (staticmethod, classmethod)):
            entries.append(Entry(f"rt.Ring.{name}", "method", _signature(getattr(cls, name)), _doc(member.__func__)))
        elif inspect.isfunction(member):
            signature = re.sub(r"^\(self(, )?", "(", _signature(member))
            entries.append(Entry(f"rt.Ring.{name}", "method", signature, _doc(member)))
    return entries


def _named(prefix: str, name: str, obj) -> Entry:
    if inspect.isclass(obj):
        return Entry(f"{prefix}{name}", "class", _signature(obj), _doc(obj))
    if callable(obj):
        return Entry(f"{prefix}{name}", "function", _signature(obj), _doc(obj))
    if isinstance(obj, dict):  # a registry: its keys are what a script may write
        return Entry(f"{prefix}{name}", "value", "", f"{{{', '.join(repr(k) for k in obj)}}}")
    return Entry(f"{prefix}{name}", "value", "", _doc(obj) if not isinstance(obj, (str, int, float)) else repr(obj))


def _commands() -> list[Entry]:
    from ringtrain.cli import COMMANDS

    entries = []
    for name, command in COMMANDS.items():
        module = importlib.import_module(command.module)
        first = (inspect.getdoc(module) or "").split("\n\n", 1)[0]
        doc = f"{command.summary}.\n\n{first}\n\n`ringtrain {name} --help` prints its manual." if first else ""
        entries.append(Entry(f"ringtrain {name}", "command", "", doc))
    return entries


def sections() -> list[tuple[str, str, list[Entry]]]:
    """(title, intro, entries) for each part of the page."""
    import ringtrain as rt
    import ringtrain.horovod as hvd

    top = [n for n in rt.__all__ if n not in ("Ring", "strategies", "__version__")]
    return [
        ("`rt.Ring` and its methods", "The one object a training script holds (`import ringtrain as rt`).",
         [_named("rt.", "Ring", rt.Ring), *_ring_members(rt.Ring)]),
        ("`rt.*`", "The other names of `ringtrain`: launching from Python, splitting a model, SyncBatchNorm, "
         "checkpoints, seeds.", [_named("rt.", n, getattr(rt, n)) for n in top]),
        ("`rt.strategies`", "`Ring(strategy=...)` takes a name of `REGISTRY` or one of these objects.",
         [_named("rt.strategies.", n, getattr(rt.strategies, n)) for n in rt.strategies.__all__]),
        ("`ringtrain.horovod`", "Horovod's `horovod.torch` API on `torch.distributed` (`import ringtrain.horovod as "
         "hvd`, or `import horovod.torch as hvd` under `ringtrain run --horovod`).",
         [_named("hvd.", n, getattr(hvd, n)) for n in hvd.__all__]),
        ("The `ringtrain` command", "Each subcommand's `--help` is its whole manual.", _commands()),
    ]


def _markdown(doc: str) -> str:
    doc = re.sub(r"``([^`]+?)``", r"`\1`", doc)
    # A docstring's line that goes on with "+ keep_last" is prose, not the bullet Markdown would make of it.
    return re.sub(r"(?m)^\+ ", r"\\+ ", doc)


def render() -> str:
    parts = sections()
    lines = [
        "# API reference",
        "",
        "[README](../README.md) · [the guide](../README.md#the-guide) · 中文指南：[README.zh-CN.md](../README.zh-CN.md)",
        "",
        "Generated from the docstrings by `scripts/api_reference.py`; do not edit by hand (tests/test_docs.py "
        "regenerates it and compares). The guide's pages say how these fit together; this page is what each one is.",
        "",
    ]
    for title, _, entries in parts:
        lines.append(f"- {title}: " + ", ".join(f"`{e.name}`" for e in entries))
    for title, intro, entries in parts:
        lines += ["", f"## {title}", "", intro]
        for e in entries:
            lines += ["", f"### {e.name}", "", f"*{e.kind}*", ""]
            if e.kind in ("class", "method", "function"):  # the call as a script writes it; a long one laid out
                call = f"{e.name}{e.signature}"
                lines += ["```python", call if len(call) < 110 else _laid_out(e.name, e.signature), "```", ""]
            lines.append(_markdown(e.doc) if e.doc else "(no docstring)")
    return "\n".join(lines).rstrip() + "\n"


def _laid_out(name: str, signature: str) -> str:
    """A long signature one parameter a line (the commas between parameters, not those inside a default)."""
    inner, tail = signature[1:signature.rindex(")")], signature[signature.rindex(")") + 1:]
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(inner):
        if quote:
            quote = "" if ch == quote and inner[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    parts.append(inner[start:].strip())
    return f"{name}(\n" + "".join(f"    {p},\n" for p in parts if p) + f"){tail}"


def missing() -> list[str]:
    """The public names without a docstring."""
    return [e.name for _, _, entries in sections() for e in entries if not e.doc.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with docs/api.md instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if PAGE.read_text() != text:
            print("docs/api.md is not what the docstrings say\nHINT: run .venv/bin/python scripts/api_reference.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    undocumented = missing()
    print(f"wrote {PAGE.relative_to(ROOT)}" + (f"; no docstring: {', '.join(undocumented)}" if undocumented else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
