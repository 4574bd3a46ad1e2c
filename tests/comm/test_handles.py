"""comm/handles.py: poll never blocks, wait runs ``finish`` once and returns the same object on every
call, an engine failure becomes a CollectiveFailure naming the op (and the rank that left first, when
the liveness board knows), and a handle can wait on other handles."""

from __future__ import annotations

import pytest

from ringtrain.comm.handles import CollectiveFailure, Handle
from ringtrain.errors import RingtrainError
from ringtrain.liveness import membership


class Work:
    def __init__(self, fail: str | None = None, fail_poll: str | None = None):
        self.done, self.fail, self.fail_poll, self.waited = False, fail, fail_poll, 0

    def is_completed(self):
        if self.fail_poll:
            raise RuntimeError(self.fail_poll)
        return self.done

    def wait(self):
        self.waited += 1
        if self.fail is not None:
            raise RuntimeError(self.fail)
        self.done = True


def test_a_completed_handle_has_its_result_at_once():
    result = object()
    handle = Handle.completed(result, what="broadcast")
    assert handle.poll() and handle.is_completed() and handle.wait() is result
    assert repr(handle) == "<Handle broadcast done>"


def test_poll_reports_without_waiting_and_finish_runs_once():
    works = [Work(), Work()]
    finished = []
    handle = Handle(works, lambda: finished.append(1) or ["result"], what="allreduce")
    assert not handle.poll() and repr(handle) == "<Handle allreduce pending>" and finished == []
    works[0].done = True
    assert not handle.poll()
    first = handle.wait()
    assert first == ["result"] and [w.waited for w in works] == [1, 1]
    assert handle.wait() is first and finished == [1] and [w.waited for w in works] == [1, 1]
    assert handle.poll() and Handle([Work()]).wait() is None  # no finish: None


def test_an_engine_failure_in_wait_names_the_op_and_the_first_line():
    handle = Handle([Work(fail="Connection closed by peer [127.0.0.1]:1234\nmore detail")], lambda: 1,
                    what="allreduce 'loss'")
    with pytest.raises(CollectiveFailure) as error:
        handle.wait()
    assert isinstance(error.value, RingtrainError) and isinstance(error.value.__cause__, RuntimeError)
    assert error.value.message == "allreduce 'loss' failed in the engine: Connection closed by peer [127.0.0.1]:1234"
    assert error.value.hint.startswith("another rank probably exited or stopped calling collectives")
    assert handle.poll()  # it is over: Horovod's synchronize() of a failed handle then returns nothing
    assert handle.wait() is None


def test_an_engine_failure_in_poll_is_a_collective_failure_too():
    with pytest.raises(CollectiveFailure, match="allgather failed in the engine: timed out"):
        Handle([Work(fail_poll="timed out")], what="allgather").poll()
    with pytest.raises(CollectiveFailure, match="barrier failed in the engine: RuntimeError"):
        Handle([Work(fail="")], what="barrier").wait()


def test_the_rank_that_left_first_is_named_when_the_board_knows(monkeypatch):
    monkeypatch.setattr(membership, "explain", lambda: "rank 1 finished (process exit)")
    with pytest.raises(CollectiveFailure) as error:
        Handle([Work(fail="Connection reset")], what="allreduce").wait()
    assert error.value.message == "allreduce failed because rank 1 finished (process exit)"
    assert "that rank's own error (in its output, or first in the launcher's report) is the cause" in error.value.hint


def test_a_handle_waits_on_handles():
    inner = Handle([Work()], lambda: 41, what="inner")
    outer = Handle([inner], lambda: inner.wait() + 1, what="outer")
    assert not outer.poll() and outer.wait() == 42 and inner.poll()
    assert CollectiveFailure("boom").hint == "another rank probably failed first; see its error."
