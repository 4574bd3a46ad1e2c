"""``hvd.elastic``: state that survives a failed collective, and the loop that restores it.

Horovod's elastic mode (horovod/common/elastic.py, horovod/torch/elastic/) keeps the
processes alive through failures: when a collective fails (``HorovodInternalError``)
``run`` restores the last ``commit()``-ed state, re-initialises, re-synchronises
from rank 0 and calls the training function again. Here the same loop runs on
torch.distributed for a fixed set of processes: re-initialising (``shutdown()`` then
``init()``) keeps the same process group and the same peers, so it recovers from a
failure every process survives (a ``HorovodInternalError`` a collective or the script
raised), not from a dead peer. A rank that dies or leaves ends the whole job within
seconds instead (ringtrain.liveness.membership); ``ringtrain run --max-restarts N`` (torchrun's
agent) then restarts every worker, and the script starts again from its own checkpoint.
Hosts joining or leaving (Horovod's host discovery) is not supported.
"""

from __future__ import annotations

import functools

from ..basics import init, shutdown
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState

MAX_FAILURES_WITHOUT_PROGRESS = 3


def run(func):
    """Decorator: call ``func(state, ...)``; on a collective failure, restore ``state`` and call it again.

    ``state`` (a :class:`State`, usually :class:`TorchState`) is synchronised from rank 0
    before every attempt. Collectives must not run in code outside ``func`` that every
    attempt repeats, as in Horovod.
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        failures, commits = 0, state.commits
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                # With a fixed host set a dead peer never comes back: stop retrying when
                # attempts keep failing without a single commit in between.
                failures = failures + 1 if state.commits == commits else 1
                commits = state.commits
                if failures > MAX_FAILURES_WITHOUT_PROGRESS:
                    raise
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            _reset()
            state.on_reset()

    return wrapper


def _reset() -> None:
    shutdown()
    init()


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "HorovodInternalError",
           "HostsUpdatedInterrupt"]
