"""comm/groups.py: a process set's membership and ranks as Horovod answers them, the refusals for bad
sets (empty, duplicate, outside the job, never added, not a member), the table's ids, which engine
group a tensor goes through, and the per-set state other modules keep."""

from __future__ import annotations

import pytest
import torch

from ringtrain.comm import groups
from ringtrain.comm.groups import GLOBAL, ProcessSet, ProcessSetTable
from ringtrain.errors import RingtrainError


def test_ranks_are_sorted_without_repeats_and_rank_is_the_position_in_them():
    ps = ProcessSet([2, 0, 2])  # this process is rank 0 of 1 (no group)
    assert ps.ranks == [0, 2] and ps.size() == 2 and ps.rank() == 0 and ps.included()
    assert ps.global_rank(1) == 2 and not ps.is_global
    other = ProcessSet(range(1, 4))
    assert other.ranks == [1, 2, 3] and other.rank() == -1 and not other.included()
    assert repr(other) == "ProcessSet(process_set_id=None, ranks=[1, 2, 3])"


def test_the_global_set_is_every_rank_and_rank_0_of_1_without_a_group():
    assert GLOBAL.is_global and GLOBAL.process_set_id == 0
    assert (GLOBAL.ranks, GLOBAL.size(), GLOBAL.rank(), GLOBAL.included()) == ([0], 1, 0, True)
    assert repr(ProcessSet(None)) == "ProcessSet(process_set_id=0, ranks=all)"


def test_the_rank_follows_the_job(monkeypatch):
    monkeypatch.setattr(groups, "_world_rank", lambda: 3)
    monkeypatch.setattr(groups, "_world_size", lambda: 4)
    assert ProcessSet([1, 3]).rank() == 1 and ProcessSet([0, 1]).rank() == -1
    assert ProcessSet(None).ranks == [0, 1, 2, 3] and ProcessSet(None).rank() == 3


def test_sets_are_equal_by_ranks():
    assert ProcessSet([1, 0]) == ProcessSet([0, 1]) and hash(ProcessSet([1, 0])) == hash(ProcessSet([0, 1]))
    assert ProcessSet([0, 1]) != ProcessSet([0, 2]) and ProcessSet([0]) != [0]
    assert len({ProcessSet([0, 1]), ProcessSet([1, 0]), ProcessSet([2])}) == 2


def test_a_set_with_no_ranks_is_refused():
    with pytest.raises(RingtrainError) as error:
        ProcessSet([])
    assert "a process set with no ranks was asked for" in str(error.value)
    assert "HINT: give at least one rank." in str(error.value)


def test_a_collective_on_a_set_this_rank_is_not_in_is_refused():
    with pytest.raises(RingtrainError) as error:
        ProcessSet([1, 2]).require_member("allreduce")
    text = str(error.value)
    assert "allreduce on ProcessSet(process_set_id=None, ranks=[1, 2]) was called on rank 0, which is not in that " \
           "process set" in text
    assert "HINT: call collectives of a process set only on its member ranks (check ps.included())." in text


def test_a_set_never_added_is_refused_in_a_job(monkeypatch):
    ProcessSet([0, 1]).require_member("allreduce")  # one process: nothing to add
    monkeypatch.setattr(groups, "_world_size", lambda: 2)
    with pytest.raises(RingtrainError) as error:
        ProcessSet([0, 1]).require_member("allreduce")
    assert "allreduce was called on ProcessSet(process_set_id=None, ranks=[0, 1]), which was never added" in \
           str(error.value)
    assert "HINT: register it first on every rank: hvd.add_process_set(ranks)" in str(error.value)
    ProcessSet(None).require_member("allreduce")  # the global set needs no adding
    ProcessSet([0]).require_member("allreduce")  # nor a set of one


def test_the_table_counts_ids_from_1_and_refuses_duplicates():
    table = ProcessSetTable()
    a, b = table.add([0]), table.add(ProcessSet([0, 1]))
    assert (a.process_set_id, b.process_set_id) == (1, 2)
    assert table.get(0) is GLOBAL and table.get(2) is b and list(table) == [GLOBAL, a, b]
    assert table.add(ProcessSet(None)) is GLOBAL and table.add(None) is GLOBAL
    with pytest.raises(RingtrainError) as error:
        table.add([1, 0])
    assert "a process set with ranks [0, 1] is already registered (ProcessSet(process_set_id=2, ranks=[0, 1]))" in \
           str(error.value)
    assert "HINT: reuse that process set object, or remove it first." in str(error.value)
    assert table.add([1]).process_set_id == 3


class _Part:
    def __init__(self):
        self.cleared = 0

    def clear(self):
        self.cleared += 1


def test_removing_frees_the_id_and_clears_the_sets_state():
    table = ProcessSetTable()
    ps = table.add([0, 1])
    part = ps.part(_Part)
    assert ps.part(_Part) is part  # one per set, made on first use
    ps.grad_layout = (1, [])
    assert table.remove(ps) is True
    assert ps.process_set_id is None and part.cleared == 1 and ps.grad_layout is None
    assert table.remove(ps) is False and table.remove(ProcessSet([3])) is False
    assert list(table) == [GLOBAL]
    for global_set in (GLOBAL, ProcessSet(None)):
        with pytest.raises(RingtrainError) as error:
            table.remove(global_set)
        assert "the global process set cannot be removed" in str(error.value)
        assert "HINT: remove only sets you added." in str(error.value)


def test_reset_forgets_every_set_and_starts_ids_again():
    table = ProcessSetTable()
    ps = table.add([0, 1])
    part = ps.part(_Part)
    rounds, steps = GLOBAL.check_rounds, GLOBAL.grad_steps
    try:
        GLOBAL.check_rounds, GLOBAL.grad_steps = 5, 2
        table.reset()
        assert GLOBAL.check_rounds == 0 and GLOBAL.grad_steps == 0
    finally:
        GLOBAL.check_rounds, GLOBAL.grad_steps = rounds, steps
    assert ps.process_set_id is None and part.cleared == 1 and list(table) == [GLOBAL]
    assert table.add([0, 1]).process_set_id == 1


def test_cpu_tensors_and_checks_take_the_gloo_twin_others_the_main_group():
    ps = ProcessSet([0, 1])
    assert ps.group_for(None) is None and ps.grad_group_for(torch.ones(1)) is None  # the default group
    ps._group, ps._cpu_group, ps._grad_group, ps._grad_cpu_group = "main", "twin", "grad", "grad twin"
    on_device = torch.empty(1, device="meta")
    assert (ps.group_for(torch.ones(1)), ps.group_for(None), ps.group_for(on_device)) == ("twin", "twin", "main")
    assert (ps.grad_group_for(torch.ones(1)), ps.grad_group_for(on_device)) == ("grad twin", "grad")
    ps._cpu_group = ps._grad_cpu_group = None  # Gloo: no twin
    assert ps.group_for(torch.ones(1)) == "main" and ps.grad_group_for(torch.ones(1)) == "grad"


def test_one_process_binds_nothing():
    ps = ProcessSet([0])
    ps.bind()
    assert (ps._group, ps._cpu_group, ps._grad_group, ps._grad_cpu_group) == (None, None, None, None)


@pytest.mark.timeout(90)
def test_on_two_ranks_sets_outside_the_job_unadded_and_foreign_are_refused(two_ranks):
    for rank, res in enumerate(two_ranks):
        assert "process set ranks [5] are outside the job's 2 ranks" in res["outside"]
        assert "HINT: use ranks in [0, 2)." in res["outside"]
        assert "which was never added" in res["never_added"] and "hvd.add_process_set" in res["never_added"]
        assert res["only_1"] == (1, 1, [-1, 0][rank], [False, True][rank])
        assert res["removed"] == (True, False)
    assert "allreduce on ProcessSet(process_set_id=1, ranks=[1]) was called on rank 0, which is not in that " \
           "process set" in two_ranks[0]["not_member"]
    assert two_ranks[1]["not_member"] == 7.0  # a set of one: its own value
