"""Horovod's exception names (horovod/common/exceptions.py)."""

from ..comm.handles import CollectiveFailure

# A collective failed in the engine; ``hvd.elastic.run`` restores and retries on it.
HorovodInternalError = CollectiveFailure


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``state.commit()`` when the set of hosts changed (``skip_sync``: state need not be re-sent)."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
