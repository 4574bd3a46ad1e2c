"""The tutorials our users learn from (/work/shared/seeds), as doctor reads them.

``seeds/`` holds the seeds' code blocks rewritten as small files — the same calls, names
and structure, shortened, placeholders given values, blocks a reader puts together put
together (each file's docstring says which) — with the findings marked by hand. These are
the numbers docs/doctor.md reports per seed; a rule change that moves them fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _marks import expected

from ringtrain.doctor import check_source

SEEDS = sorted((Path(__file__).parent / "seeds").glob("*.py"))


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_seed_findings_are_the_marked_ones(path):
    source = path.read_text()
    found = {(f.line, f.rule) for f in check_source(source, str(path))}
    assert found == expected(source)


def test_the_set_epoch_experiment_is_clean_once_it_calls_set_epoch():
    path = Path(__file__).parent / "seeds" / "seed003_set_epoch_experiment_fixed.py"
    assert check_source(path.read_text(), str(path)) == []
