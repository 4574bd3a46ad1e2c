"""comm/named.py: ops paired by name, not by order (held until every rank holds the name, then
started sorted by name), a name reused in flight (DuplicateName, a ValueError), finished names
forgotten, held ops dropped at shutdown, and waits nobody can satisfy raising on every rank. Ranks are
threads whose check rounds go through a HashStore; the ops' launches are plain callables."""

from __future__ import annotations

import pytest
from _comm_util import Member, as_ranks, raised, store_members

from ringtrain.comm import checks, named
from ringtrain.comm.checks import Call, InvalidArgument, Kind, hash_text
from ringtrain.comm.groups import ProcessSet
from ringtrain.comm.handles import Handle
from ringtrain.errors import RingtrainError


class Pending:
    """An engine Work that is not done until ``done`` is set."""

    def __init__(self):
        self.done = False

    def is_completed(self):
        return self.done

    def wait(self):
        self.done = True


def launcher(log: list, value):
    def launch():
        log.append(value)
        return Handle.completed(value)

    return launch


def test_an_unnamed_or_unchecked_op_starts_at_once():
    log: list = []
    ps = Member([0, 1], 0)
    assert named.submit(ps, None, launcher(log, 1), check=True, what="allreduce").wait() == 1
    assert named.submit(ps, "x", launcher(log, 2), check=False, what="allreduce").wait() == 2
    alone = ProcessSet(None)
    assert named.submit(alone, "x", launcher(log, 3), check=True, what="allreduce").wait() == 3
    assert log == [1, 2, 3]
    assert list(named.ops_of(ps).inflight) == ["x"] and not named.ops_of(ps).held


def test_a_name_in_flight_cannot_be_reused_until_its_op_is_done():
    ps = ProcessSet(None)
    work = Pending()
    named.submit(ps, "loss", lambda: Handle([work]), check=True, what="allreduce")
    with pytest.raises(named.DuplicateName) as error:
        named.submit(ps, "loss", lambda: Handle.completed(0), check=True, what="allreduce")
    assert isinstance(error.value, ValueError) and isinstance(error.value, InvalidArgument)
    assert error.value.message == "allreduce was called with name 'loss' while an op of that name is still in " \
                                  "flight on this rank"
    assert error.value.hint == "give concurrent ops distinct names, or synchronize() the first one before reusing " \
                               "its name."
    work.done = True
    assert named.submit(ps, "loss", lambda: Handle.completed(5), check=True, what="allreduce").wait() == 5


def test_finished_names_are_forgotten_once_many_are_recorded():
    ps = ProcessSet(None)
    ops = named.ops_of(ps)
    for i in range(256):
        named.submit(ps, f"loss.{i}", lambda: Handle.completed(0), check=True, what="allreduce")
    assert len(ops.inflight) == 256
    named.submit(ps, "loss.256", lambda: Handle.completed(0), check=True, what="allreduce")
    assert list(ops.inflight) == ["loss.256"] and ops.inflight_sweep == 256
    works = [Pending() for _ in range(300)]
    for i, work in enumerate(works):
        named.submit(ps, f"open.{i}", lambda work=work: Handle([work]), check=True, what="allreduce")
    assert len(ops.inflight) == 300 and ops.inflight_sweep == 2 * 255  # 255 still running at the sweep


def test_a_named_checked_op_on_several_ranks_is_held_not_started():
    log: list = []
    ps = Member([0, 1], 0)
    held = named.submit(ps, "grad.w", launcher(log, 1), check=True, what="allreduce 'grad.w'")
    assert isinstance(held, named.Held) and not held.started and not held.poll() and log == []
    assert repr(held) == "<Handle allreduce 'grad.w' held>"
    ops = named.ops_of(ps)
    assert ops.held == {"grad.w": held} and ops.inflight == {"grad.w": held}
    call = Call(Kind.BARRIER)
    named.describe_held(ps, call)
    assert (call.held, call.held_digest) == (1, hash_text("grad.w"))
    held.start()
    assert log == [1] and held.poll() and held.wait() == 1 and repr(held) == "<Handle allreduce 'grad.w' started>"


def test_a_held_op_whose_launch_fails_reports_it_at_wait():
    ps = Member([0, 1], 0)
    problem = RingtrainError("allreduce 'x' differs", "same tensors everywhere.")

    def launch():
        raise problem

    held = named.submit(ps, "x", launch, check=True, what="allreduce 'x'")
    held.start()
    assert held.started and held.poll() and repr(held) == "<Handle allreduce 'x' failed>"
    with pytest.raises(RingtrainError) as error:
        held.wait()
    assert error.value is problem


def test_shutdown_drops_held_ops_and_waiting_on_one_says_so():
    ps = Member([0, 1], 0)
    held = named.submit(ps, "x", launcher([], 1), check=True, what="allreduce")
    named.ops_of(ps).clear()
    assert not named.ops_of(ps).held and not named.ops_of(ps).inflight
    with pytest.raises(RingtrainError) as error:
        held.wait()
    assert str(error.value) == ("allreduce 'x' was never started: Horovod was shut down first\n"
                                "HINT: synchronize() named ops before hvd.shutdown().")


def test_ops_submitted_in_different_orders_start_by_name_on_every_rank():
    members = store_members([0, 1])
    logs: list[list] = [[], []]

    def rank(r):
        order = ["b", "a"] if r == 0 else ["a", "b"]
        handles = {name: named.submit(members[r], name, launcher(logs[r], name), check=True, what=f"op {name!r}")
                   for name in order}
        assert logs[r] == []  # held until paired
        named.barrier(members[r])  # the barrier's check round finds both held everywhere: they start
        return {name: h.wait() for name, h in handles.items()}

    assert as_ranks(rank) == [{"a": "a", "b": "b"}] * 2
    assert logs == [["a", "b"], ["a", "b"]]  # sorted by name, whatever the submission order


def test_a_wait_starts_the_op_once_the_other_rank_holds_it_too():
    members = store_members([0, 1])
    assert as_ranks(lambda r: named.submit(members[r], "x", lambda: Handle.completed(10 + r), check=True,
                                           what="op 'x'").wait()) == [10, 11]


def test_waits_nobody_can_satisfy_raise_on_every_rank():
    members = store_members([0, 1])

    def rank(r):
        if r == 0:  # waits for an op rank 1 never submits
            return named.submit(members[0], "x", lambda: Handle.completed(1), check=True, what="op 'x'").wait()
        return named.barrier(members[1])  # while rank 1 waits in a barrier

    out = as_ranks(rank)
    for r, result in enumerate(out):
        text = raised(result)
        assert text.startswith("every rank waits for the others (in barrier() or in synchronize() of a named op that "
                               f"not every rank has submitted); held on this rank: {[['x'], []][r]}\n")
        assert "collective #1 differs across ranks: rank 0 called synchronize() of a named op not yet submitted " \
               "everywhere; rank 1 called barrier()" in text
        assert "HINT: submit the same named ops on every rank before synchronizing any of them" in text


def test_a_held_op_no_longer_held_is_named():
    ps = Member([0, 1], 0)
    held = named.Held("x", lambda: Handle.completed(1), ps, "op")
    with pytest.raises(RingtrainError) as error:
        named.wait_for(held)
    assert "op 'x' is no longer held (Horovod was shut down)" in str(error.value)
    assert "HINT: synchronize() named ops before hvd.shutdown()." in str(error.value)


def test_settle_starts_nothing_unless_every_active_rank_holds_ops():
    ps = Member([0, 1], 0)
    log: list = []
    named.submit(ps, "x", launcher(log, 1), check=True, what="op")
    holding = checks._encode(Call(Kind.BARRIER, held=1, held_digest=hash_text("x")))
    assert named.settle(ps, [holding, checks._encode(Call(Kind.BARRIER))]) is False and log == []
    assert named.settle(ps, [holding, holding]) is True and log == [1] and not named.ops_of(ps).held
