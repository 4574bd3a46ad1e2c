"""The `# expect: <rule-id>[, <rule-id>]` markers test scripts carry on the lines a finding
must be reported at (written by hand, independently of the rules)."""

from __future__ import annotations

import re

EXPECT = re.compile(r"#\s*expect:\s*([\w\-, ]+)")


def expected(source: str) -> set[tuple[int, str]]:
    marks = set()
    for number, line in enumerate(source.splitlines(), 1):
        match = EXPECT.search(line)
        if match:
            marks |= {(number, rule.strip()) for rule in match.group(1).split(",") if rule.strip()}
    return marks
