"""Turn torchelastic's ``ChildFailedError`` into the one report a person needs.

When a worker dies the agent stops every other worker on the node and raises
``ChildFailedError``, whose ``failures`` map global rank -> ``ProcessFailure``
(local rank, pid, exit code, error file). torchrun's own summary picks the root cause by
the error files' timestamps, in whole seconds: a rank that merely timed out waiting for the
real culprit was often named instead. ringtrain's workers record more (failures.py: the
sub-second time, and whether they failed by themselves or because of a peer), so
``first_cause`` names the rank that caused it, and the report leads with that one and its
traceback and only lists the rest.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import time
from typing import Any, Callable

from ..liveness import failures as _failures
from ..liveness import procs as _procs
from ..liveness import stall as _stall
from ..liveness.activity import is_user_file
from ..liveness.procs import exists as process_exists
from ..liveness.records import PREEMPTED, PREEMPTED_EXIT, SENT_TO_IT, Blame, Post
from ..liveness.stall import mismatch, per_rank_summary
from .worker import native_dump_path

# Frames of the machinery between the agent and the user's code: ringtrain's worker entry,
# runpy, and torchelastic's @record wrapper. The report shows the user's frames only.
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
_MACHINERY = re.compile(
    r'^  File "(?:' + re.escape(_WORKER) + r'|<frozen runpy>|[^"]*[/\\]runpy\.py'
    r'|[^"]*torch[/\\]distributed[/\\]elastic[/\\]multiprocessing[/\\]errors[/\\]__init__\.py)", line \d+'
)

HINTS = {
    "signal": "a worker killed by a signal was often out of memory (check `dmesg` for the OOM "
    "killer) or crashed in native code; the faulthandler dump above, if any, shows where.",
    "exit": "the failing rank's own output above (its stderr) says why it exited; "
    "re-run with --nproc-per-node 1 to debug it as a plain script.",
    "exception": "fix the exception above; every other rank was stopped because of it.",
    "stuck": "the stack above is where that rank was while the others waited for it in a collective: a "
    "data loader, a loop or a backward hook that does not end, a rank that takes another branch, or a process stopped "
    "(SIGSTOP, a debugger). Ring(stall_warning=...) reports such stalls while the job runs.",
    "abort": "native code aborted the process (SIGABRT); its message is above the faulthandler dump. With Gloo, "
    "\"Received data size doesn't match expected size\" means the ranks called different collectives (or one "
    "with other sizes): the dump shows this rank's call, the lines above where the others were.",
    "mismatch": "every rank must call the same collectives in the same order: look at the lines above for the "
    "call one rank makes and the other does not (a branch on the rank, or on per-rank data).",
    "unreachable": "look at node 0 (the machine at --master-addr): its ringtrain run's output, `dmesg` there for the "
    "OOM killer, whether the machine is up and this node still reaches it; then start the job again on every node "
    "(a checkpoint_dir resumes it).",
    "sent": "a SIGTERM to one worker is not a preemption under ringtrain run: torchrun's agent stops workers with "
    "SIGTERM for its own reasons too (a failed peer, a restart), so a worker takes one it gets alone for a stop, and the "
    "job ends without a checkpoint. To preempt the job (a checkpoint, exit 75), signal ringtrain run itself (kill -TERM "
    "<its pid>, as Slurm and Kubernetes do); for a rank's stacks without stopping it, `ringtrain stacks`.",
    "peer": "every rank must make the same collective calls until the end: a rank that returns, "
    "breaks out of its loop or calls ring.close() early leaves the others waiting (look for a branch "
    "on the rank or on per-rank data, e.g. a dataset that is empty on one rank).",
}


def _traceback(failure: Any) -> str | None:
    # ProcessFailure.message is a dict when the worker's `record` wrote the error file
    # ({"message": "...", "extraInfo": {"py_callstack": "..."}}), a str otherwise.
    message = failure.message
    if isinstance(message, dict):
        return message.get("extraInfo", {}).get("py_callstack") or message.get("message")
    return None


def ending(traceback: str) -> str:
    """Where a traceback ended: its last frame in the user's code (not ringtrain's own), and the exception with
    its HINT."""
    lines = user_frames(traceback).rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the ringtrain package
    theirs = [i for i in frames if ours not in lines[i]]
    if not frames:
        return "\n".join(lines[-1:])
    start = (theirs or frames)[-1]
    end = next((i for i in frames if i > start), None)
    if end is None:
        return "\n".join(lines[start:])
    last = frames[-1]
    exception = next((i for i in range(last + 1, len(lines)) if lines[i][:1].strip()), len(lines))
    return "\n".join(lines[start:end] + lines[exception:])


def user_frames(traceback: str) -> str:
    """Drop the launcher's own frames (each a `  File` line and its indented source lines)."""
    kept: list[str] = []
    skipping = False
    for line in traceback.splitlines():
        if line.startswith('  File "'):
            skipping = bool(_MACHINERY.match(line))
        elif not line.startswith("    "):
            skipping = False  # "Traceback (most recent call last):", the exception line, chained causes
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by signal {-exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def first_cause(failures: dict[int, Any], stops: Any = None) -> tuple[int, Any, Blame | None]:
    """The rank whose failure caused the others', its ProcessFailure, and who it blames (if a peer).

    Each worker's error file says when it stopped (to the sub-second) and whether it failed by
    itself or because of a peer (failures.py): the earliest rank that failed by itself is the
    cause. A rank that died by a signal left no word: it comes next (the OOM killer, a
    segfault) — unless the signal was the agent's own SIGTERM, sent to the rest after a
    failure. Ranks stopped because of a peer come after, and their record names the peer —
    possibly one that finished early with exit code 0, which the agent does not count as failed.
    ``stops`` (exits.Stops): which workers the agent signalled itself; without it every SIGTERM is
    taken for the agent's. With it, a SIGTERM the agent did not send is a signal from outside: a cause.
    """
    own, silent, peer, rest = [], [], [], []
    for rank, failure in failures.items():
        info = _failures.info_of(failure.message)
        post = Post.from_dict(info) if info is not None else None
        if post is None:
            by_agent = stops.by_agent(failure.pid) if stops is not None else failure.exitcode == -signal.SIGTERM
            stopped = by_agent or failure.exitcode == 0 or failure.exitcode > 0
            (rest if stopped else silent).append((float("inf"), rank, failure, None))
        elif post.cause == "own":
            own.append((post.time, rank, failure, None))
        else:
            peer.append((post.time, rank, failure, post))
    # A rank blamed as stuck or not responding (a peer's collective timed out waiting for it) is the
    # cause even when it was killed by the agent afterwards (frozen: it could not say so itself).
    stuck = [(p.time, p.blame.rank, failures[p.blame.rank], None) for *_, p in peer
             if p.blame is not None and p.blame.state in ("stuck", "not responding") and p.blame.rank in failures]
    for group in (own, stuck, silent, peer, rest):
        if group:
            _, rank, failure, post = min(group, key=lambda item: (item[0], item[1]))
            if group is stuck:
                return rank, failure, None
            return rank, failure, post.blame if post is not None else None
    raise ValueError("no failures to report")


def stuck_blame(failures: dict[int, Any], rank: int) -> Blame | None:
    """What a peer said of ``rank`` when it blamed it as stuck or not responding, if one did."""
    for failure in failures.values():
        info = _failures.info_of(failure.message)
        blame = Post.from_dict(info).blame if info is not None else None
        if blame is not None and blame.rank == rank and blame.state in ("stuck", "not responding"):
            return blame
    return None


_FAULT_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


def native_crash(rank: int) -> tuple[str | None, str] | None:
    """(the crashed rank's innermost user frame, its thread's stack) from faulthandler's dump of this
    launcher's worker ``rank`` (worker.py writes it on SIGABRT/SIGSEGV), or None when there is none."""
    path = native_dump_path(os.getpid(), rank)
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    def user_site(block: str) -> str | None:
        for line in block.splitlines():  # most recent call first: the first user frame is the innermost
            m = _FAULT_FRAME.match(line)
            if m and is_user_file(m["file"]):
                shown = os.path.relpath(m["file"])
                return f"{m['file'] if shown.startswith('..') else shown}:{m['line']} in {m['name']}"
        return None

    # The thread that crashed ("Current thread"), when it ran Python; else (Gloo aborts from a thread of its
    # own) the thread in the user's code: the main thread.
    blocks = [b for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", text) if "most recent call first" in b]
    ordered = [b for b in blocks if b.startswith("Current thread")] + [b for b in blocks if not b.startswith("Current")]
    chosen = next((b for b in ordered if user_site(b)), None)
    if chosen is None:
        return None
    return user_site(chosen), chosen.strip()


def preempted(marks: dict[int, int], failures: dict[int, Any] | None = None, signame: str | None = None) -> str | None:
    """The line a preempted job ends with (loop/preempt.py), or None when it was not one. ``marks``: the ranks of
    this node that saved their preemption checkpoint and left (``preempt.marked``); ``failures``: torchelastic's
    exits of this node's workers, when it knows them — each must be 75."""
    if not marks or (failures and any(f.exitcode != PREEMPTED_EXIT for f in failures.values())):
        return None
    how = f" by {signame}" if signame else ""
    steps = set(marks.values())
    at = f" at step {steps.pop()}" if len(steps) == 1 else ""
    return (f"ringtrain run: preempted{how}{at}: every rank saved its checkpoint; exit {PREEMPTED_EXIT}.\n"
            "HINT: run the same command again: it resumes from that checkpoint.")


_FROZEN = ("stopped (SIGSTOP?)", "stopped by a debugger", "a zombie", "gone")  # no signal is answered from there


def preemption_not_saved(marks: dict[int, int], board: Any, stops: Any, signame: str) -> str | None:
    """The report of a preemption that saved nothing, or not on every rank of this node: which
    rank did not save, and why — stopped (SIGSTOP) or frozen when the signal came, gone already, or waiting for such
    a rank — and that a rerun resumes from the job's previous checkpoint. None when no rank of this node answers
    ``signame`` with a checkpoint (no ring with a checkpoint_dir: nothing was to be saved), or when every one saved.
    ``marks``: the ranks that saved (``preempt.marked``); ``board``: the job's, when known; ``stops``: exits.Stops."""
    views = board.whereabouts() if board is not None else {}
    hellos = board.hellos_so_far() if board is not None else {}
    posts = board.read() if board is not None else {}
    here = _procs.host_identity()
    ranks = sorted(r for r, h in hellos.items() if h.get("host") == here) or sorted(views) or sorted(marks)
    if not marks and not any(views[r].preemptible for r in ranks if r in views):
        return None
    saved = {r for r in ranks if r in marks or (r in posts and posts[r].reason.startswith(PREEMPTED))}
    unsaved = [r for r in ranks if r not in saved]
    if not unsaved:
        return None
    at = stops.signalled_at if stops is not None and stops.signalled_at else time.time()
    pid = {r: hellos[r].get("pid") for r in ranks if r in hellos}
    state = {r: stops.states.get(pid[r]) for r in ranks if stops is not None and r in pid}

    def cannot_answer(r: int) -> str | None:
        """Why rank ``r`` could not answer the signal at all, if it could not."""
        view, post = views.get(r), posts.get(r)
        if state.get(r) in _FROZEN:
            return f"it was {state[r]} when the signal came (pid {pid[r]}), and a stopped process answers no signal"
        if post is not None and not post.reason.startswith(PREEMPTED):
            return f"it had left before the signal came ({post.state}: {post.reason})"
        if view is not None and at - view.beat > _stall.FRESH_S and not view.waiting:
            return (f"it did not answer: its last word came {at - view.beat:.0f} s before the signal "
                    f"({_stall.place_of(view, view.beat)}) — frozen, or holding the GIL in native code")
        return None

    causes = {r: why for r in unsaved if (why := cannot_answer(r)) is not None}
    blamed = ", ".join(f"rank {r}" for r in causes) or "the others"

    def why(r: int) -> str:
        if r in causes:
            said = causes[r]
        else:
            view = views.get(r)
            if view is not None and view.waiting:
                said = f"it waited for {blamed} in {_stall.place_of(view, at).removeprefix('in ')}"
            elif view is not None:
                said = f"it did not reach the next step in time: it was {_stall.place_of(view, at)}"
            else:
                said = "it said nothing of where it was"
        if stops is not None and r in pid and stops.killed_after_grace(pid[r]):
            grace = f"{stops.grace:g} s " if stops.grace is not None else ""
            said += f"; it was killed (SIGKILL) after the {grace}--shutdown-timeout"
        return said

    order = [*causes, *(r for r in unsaved if r not in causes)]
    lines = [f"ringtrain run: preempted by {signame}, but the job's checkpoint was not written: rank {order[0]} did "
             f"not save: {why(order[0])}."]
    lines += [f"  rank {r} did not save: {why(r)}." for r in order[1:]]
    if saved:
        lines.append("  saved: " + ", ".join(f"rank {r}" + (f" (step {marks[r]})" if r in marks else "")
                                             for r in sorted(saved)) + " — a checkpoint needs every rank's part")
    stopped = [r for r in causes if state.get(r, "").startswith("stopped")]
    hint = ("a rerun resumes from the job's previous checkpoint (the newest complete one in its checkpoint_dir, from "
            "before this signal): the steps since are done again.")
    if stopped:
        hint += (f" {'Rank' if len(stopped) == 1 else 'Ranks'} {', '.join(map(str, stopped))} "
                 f"{'was' if len(stopped) == 1 else 'were'} stopped (a debugger, kill -STOP, Ctrl-Z in a terminal): "
                 "a preemption can save only while every rank runs.")
    lines.append(f"HINT: {hint}")
    return "\n".join(lines)


def run_summary(board: Any) -> str | None:
    """The per-rank step times of a finished job (ring loops publish them), or None."""
    if board is None:
        return None
    summary = per_rank_summary({r: v.times for r, v in board.whereabouts().items()})
    restarts = board.generation.split("-")[0]
    if summary and restarts.isdigit() and int(restarts) > 0:
        # The board is the last attempt's: an earlier attempt's steps are not in it (45 of a run's 60 steps, shown
        # as the run's). The run log keeps every step once.
        summary += (f"\n  (the last of {int(restarts) + 1} attempts only: ring.log's ranks.csv holds every step of the "
                    "run; `ringtrain plot RUN_DIR` adds it up)")
    return summary


def whereabouts_lines(board: Any) -> list[str]:
    """Where every rank was last seen: for a job that died in a collective (a mismatch aborts Gloo).

    A rank says where it is about once a second (watchdog.PUBLISH_S), so what it last said may be older than
    its end by up to that, and more for a rank frozen or holding the GIL: each line says how much older (its
    post's time, else the newest word of any rank) — a kill -9 report put rank 0 at step 69 and rank 1 at 63,
    which ranks that synchronise every step cannot be, without a word."""
    if board is None:
        return []
    views = board.whereabouts()
    if not views:
        return []
    posts = board.read()
    newest = max(v.beat for v in views.values())
    lines = ["", "Where the ranks were last seen (each rank says where it is about once a second; the age is "
             "how long before its end it said so):"]
    for r, v in sorted(views.items()):
        post = posts.get(r)
        end = post.time if post is not None and post.time != float("inf") else newest
        lines.append(f"  rank {r}: {v.doing()}" + (f" at {v.site}" if v.site else "")
                     + f" ({v.step_said()}; {max(0.0, end - v.beat):.1f} s before its end)")
    steps = [v.step for v in views.values() if v.step_unknown is None]
    if steps and max(steps) - min(steps) > 1:
        lines.append("  (ranks that synchronise every step are at most one step apart: the lower steps are older "
                     "news — those ranks went on after they last said where they were)")
    different = mismatch(views)
    if different:
        lines += ["", f"The ranks were in different collectives: {different}."]
    return lines


_SENT = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # a stop someone sends (a kill of a worker), not a crash


def _sent_signal(failure: Any, stops: Any) -> str | None:
    """The name of the stopping signal (SIGTERM...) someone sent this worker — not its agent — if it died of one."""
    if stops is None or failure.exitcode >= 0 or stops.by_agent(failure.pid):
        return None
    with contextlib.suppress(ValueError):
        name = signal.Signals(-failure.exitcode).name
        return name if name in _SENT else None
    return None


def stderr_shown(args: Any, local_rank: int) -> bool:
    """Did this node's worker ``local_rank`` write its stderr to this terminal? Not under torchrun's ``--redirects``
    of stderr without ``--tee``, nor when ``--local-ranks-filter`` leaves it out. ``args``: torchrun's."""
    from torch.distributed.elastic.multiprocessing import Std

    def to_files(spec: Any) -> bool:
        std = Std.from_str(str(spec)) if spec not in (None, "") else Std.NONE
        std = std.get(local_rank, Std.NONE) if isinstance(std, dict) else std
        return std in (Std.ERR, Std.ALL)

    shown = {int(r) for r in str(getattr(args, "local_ranks_filter", "") or "").split(",") if r.strip().isdigit()}
    if shown and local_rank not in shown:
        return False
    return not to_files(getattr(args, "redirects", None)) or to_files(getattr(args, "tee", None))


def format_child_failure(error: Any, node_rank: int, board: Any = None, stops: Any = None,
                         shown: Callable[[int], bool] | None = None) -> str:
    """The report for a ``ChildFailedError`` raised by this node's agent (``board``: the job's, when known;
    ``stops``: exits.Stops, the signals the agent sent its workers itself; ``shown(local_rank)``: whether that
    worker's stderr is on this terminal, where its traceback is then, printed as it failed)."""
    rank, failure, blame = first_cause(error.failures, stops)
    place = f"local rank {failure.local_rank} on node {node_rank}, host {socket.gethostname()}, pid {failure.pid}"
    where = f"{place}, {describe_exit(failure.exitcode)}"  # failures are always this node's: one agent per node
    traceback = _traceback(failure)
    sent = _sent_signal(failure, stops) if blame is None else None
    info = _failures.info_of(failure.message)
    own = Post.from_dict(info) if info is not None else None
    stuck = stuck_blame(error.failures, rank)
    if stuck is not None or (own is not None and own.cause == "own" and own.reason.startswith(("stuck", "not responding"))):
        # A live rank that never arrived: a peer's collective timed out waiting for it. It is the cause;
        # the waiting rank's timeout is a consequence.
        why = stuck.reason if stuck is not None else own.reason.split(": ", 1)[-1]
        state = stuck.state if stuck is not None else own.reason.split(":", 1)[0]
        lines = [f"ringtrain run: rank {rank} was {state} ({why}), and the others gave up waiting for it ({where}); "
                 "all workers on this node were stopped."]
        stack = (stuck.stack if stuck is not None else None) or traceback
        if stack:
            lines += ["", f"Where rank {rank} was:", user_frames(stack).rstrip()]
        hint = HINTS["stuck"]
    elif blame is not None:
        # The cause is a rank that finished early, failed on another node, or was stopped after it.
        lines = [f"ringtrain run: {blame.describe()}, and rank {rank} could not go on without it "
                 f"({where}); all workers on this node were stopped."]
        message = failure.message.get("message") if isinstance(failure.message, dict) else None
        if message:
            lines += ["", f"rank {rank}: {message}"]
        # A rank killed on another node (its agent posted it: exits.py) is the signal's case, not an early return.
        hint = {"killed": HINTS["signal"], "unreachable": HINTS["unreachable"]}.get(blame.state, HINTS["peer"])
    elif sent is not None and not traceback:
        # Someone signalled that worker, not the launcher: it is the cause, and the rank the agent stopped after it
        # is not (which of the two the agent reaped first is a race: it named rank 0 in 2 of 5 runs).
        lines = [f"ringtrain run: rank {rank} was stopped by {sent} ({SENT_TO_IT}: {place}); all workers on this "
                 "node were stopped."]
        view = board.whereabouts().get(rank) if board is not None else None
        if sent == "SIGTERM" and view is not None and view.preemptible:
            lines += ["", f"rank {rank} answers SIGTERM with a checkpoint (its ring has a checkpoint_dir), but only a "
                      "signal to ringtrain run is a preemption there: no checkpoint was written for this signal; a "
                      "rerun resumes from the job's last checkpoint before it."]
        hint = HINTS["sent"]
    else:
        lines = [f"ringtrain run: worker rank {rank} failed first ({where}); all workers on this node were stopped."]
        if traceback and shown is not None and shown(failure.local_rank):
            # Rank N printed it as it failed: one copy on the terminal. Here only where it ended: its last frame
            # (the user's line) and the exception, not the same lines again.
            lines += ["", f"Traceback from rank {rank}: above, in rank {rank}'s own lines; it ended:", ending(traceback)]
            hint = HINTS["exception"]
        elif traceback:
            lines += ["", f"Traceback from rank {rank}:", user_frames(traceback).rstrip()]
            hint = HINTS["exception"]
        elif failure.exitcode == -signal.SIGABRT:
            hint = HINTS["abort"]
            crash = native_crash(rank)
            if crash is not None:
                site, stack = crash
                lines += ["", f"rank {rank} aborted" + (f" at {site}" if site else "") +
                          "; its stack at the crash (faulthandler, most recent call first):", stack]
        elif failure.exitcode < 0:
            hint = HINTS["signal"]
        else:
            lines += ["", f"rank {rank} left no Python traceback (its exception was raised before ringtrain's "
                      "worker entry point ran, or it exited from native code)."]
            hint = HINTS["exit"]
    seen = whereabouts_lines(board)
    if seen and (failure.exitcode < 0 or any("different collectives" in line for line in seen)):
        lines += seen  # a rank killed by a signal (Gloo aborts on mismatched collectives) left no traceback
        if blame is None and any("different collectives" in line for line in seen):
            # Not where a peer's end is the cause: a rank that returned early is "elsewhere" by definition, and the
            # peer hint says what to fix (it lost to this one when the finished rank's last place was posted).
            hint = HINTS["mismatch"]
    others = sorted(r for r in error.failures if r != rank)

    def ended(r: int) -> str:
        other = error.failures[r]
        if stops is not None and stops.by_agent(other.pid):
            return f"stopped by this launcher after rank {rank} ended: {'/'.join(stops.sent[other.pid])}"
        return describe_exit(other.exitcode)

    if others:
        lines += ["", "Other ranks that ended abnormally (usually stopped by the launcher after the first "
                  "failure, or failing because of it): " + ", ".join(f"rank {r} ({ended(r)})" for r in others)]
    lines += ["", f"HINT: {hint}"]
    return "\n".join(lines)


def remove_native_dumps() -> None:
    """The end of a job: this launcher's workers' crash-dump files go (empty unless a worker crashed), and
    those of launchers that no longer exist (killed before their own end could remove them)."""
    import glob
    import re

    for path in glob.glob(native_dump_path("*", "*")):  # type: ignore[arg-type]
        found = re.match(r"ringtrain-native-(\d+)-", os.path.basename(path))
        if found and (int(found[1]) == os.getpid() or not process_exists(int(found[1]))):
            try:
                os.unlink(path)
            except OSError:
                pass
