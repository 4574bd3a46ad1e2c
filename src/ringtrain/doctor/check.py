"""Run every rule over one source text and honour ``# ringtrain: ignore[rule]`` comments."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import tokenize

from .findings import RULES, Finding
from .rules import CHECKS
from .script import Script

_IGNORE = re.compile(r"#\s*ringtrain:\s*ignore(?:\[([^\]]*)\])?")
ALL = "*"


def ignore_comments(source: str) -> dict[int, set[str]]:
    """Line -> rule ids ignored there (``*`` for a bare ``# ringtrain: ignore``). Read from
    the tokens, so the text inside a string is not a comment."""
    found: dict[int, set[str]] = {}
    # The source parsed with ast, so a tokenize error is an edge of tokenize: the comments read
    # up to it are honoured, the rest are not.
    with contextlib.suppress(tokenize.TokenError, SyntaxError):
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                match = _IGNORE.search(tok.string)
                if match:
                    ids = {r.strip() for r in match.group(1).split(",")} if match.group(1) is not None else {ALL}
                    found.setdefault(tok.start[0], set()).update(ids - {""})
    return found


def _lines(node: ast.AST) -> range:
    """Lines where an ignore comment applies: a statement's header (``for ...:``), or the
    whole span of an expression (a call written over several lines)."""
    start = node.lineno
    body = getattr(node, "body", None)
    if isinstance(body, list) and body:
        return range(start, body[0].lineno)
    return range(start, (getattr(node, "end_lineno", None) or start) + 1)


def _severity(rule_id: str, lower: list[str]) -> str:
    """The rule's severity, or its lesser one when the check says the file leaves the condition open."""
    rule = RULES[rule_id]
    if lower and lower[0] is not None and lower[0] != rule.severity:
        if lower[0] != rule.lesser:
            raise ValueError(f"{rule_id}: a finding rated {lower[0]!r}, which is neither {rule.severity!r} nor "
                             f"its lesser severity {rule.lesser!r}")
        return lower[0]
    return rule.severity


def check_source(source: str, path: str = "<string>", ignore: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings for one script's text. Raises SyntaxError when it is not valid Python."""
    tree = ast.parse(source, filename=path)
    script = Script(path, source, tree)
    comments = ignore_comments(source)
    findings: dict[tuple[int, str], Finding] = {}
    for rule_id, check in CHECKS.items():
        if rule_id in ignore:
            continue
        for node, message, hint, *lower in check(script):
            if any(rule_id in comments.get(line, ()) or ALL in comments.get(line, ()) for line in _lines(node)):
                continue
            key = (node.lineno, rule_id)
            if key not in findings:
                findings[key] = Finding(path, node.lineno, rule_id, message, hint, _severity(rule_id, lower))
    return sorted(findings.values(), key=lambda f: (f.line, f.rule))
