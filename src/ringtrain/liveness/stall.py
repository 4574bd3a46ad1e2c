"""Reports about live ranks: a stalled collective, a rank that holds the others back, a run's per-rank times.

Pure functions of the ranks' ``Whereabouts`` (records.py) and what they answered: the watchdog
(watchdog.py) prints them during a run, the launcher (launcher/report.py) at its end. Torch-free.
"""

from __future__ import annotations

import dataclasses
import textwrap
import time

from .records import Whereabouts

FRESH_S = 3.0  # a rank whose watchdog has not published for this long is not responding
SLOW_SHARE = 0.2  # the others wait for one rank >= this share of their step: it is the bottleneck


def _ago(since: float | None, now: float) -> str:
    return f"{max(0.0, now - since):.0f} s" if since else "?"


def place_of(view: Whereabouts, now: float) -> str:
    """``in backward (gradient all-reduce) of step 4 at train.py:52 in main, for 61 s``: where a rank is, and since when."""
    what = view.doing()
    # A plain script's steps are its own (step_unknown): no number is better than a wrong one.
    in_step = view.waiting and (view.phase in ("backward", "optimizer") or "backward" in view.waiting)
    if view.step_unknown is None and in_step:
        what += f" of {view.step_said()}"
    elif view.step_unknown is None and not view.waiting and view.phase:
        what += f" ({view.step_said()})"
    since = view.waiting_since if view.waiting else view.phase_since
    return what + (f" at {view.site}" if view.site else "") + (f", for {_ago(since, now)}" if since else "")


def responding(view: Whereabouts | None, now: float) -> bool:
    return view is not None and now - view.beat <= FRESH_S


def mismatch(views: dict[int, Whereabouts]) -> str | None:
    """``rank 0 is in all_reduce #8 at train.py:40; rank 1 is in backward ... at train.py:52`` when every
    rank waits, but not in the same collective."""
    if views:  # a position older than the others' by more than a publishing beat says where a rank was, not is
        newest = max(v.beat for v in views.values())
        views = {r: v for r, v in views.items() if newest - v.beat <= FRESH_S}
    waiting = {r: v for r, v in views.items() if v.waiting}
    if len(waiting) < 2 or len(waiting) != len(views):
        return None
    kinds = {(v.waiting, v.seq) for v in waiting.values()}
    if len(kinds) == 1:
        return None
    return "; ".join(f"rank {r} is in {v.waiting}" + (f" at {v.site}" if v.site else "") for r, v in sorted(waiting.items()))


def _stuck(view: Whereabouts, now: float, after_s: float) -> bool:
    """Waiting in a collective with no progress for ``after_s`` seconds, by its latest word."""
    return bool(view.waiting) and view.waiting_since is not None and now - view.waiting_since >= after_s


# What each checkpoint is, the sentence for a rank that skipped it, and the fix (`if ring.is_main: ring.save(...)` hung 30 minutes).
_CHECKPOINT_WORDS = {
    "ring.save": ("ring.save runs on every rank and writes the file once (from rank 0); called on some ranks only",
                  "call ring.save on every rank: remove the `if ring.is_main:` (or rank check) around it; it saves once."),
    "ring.load": ("ring.load runs on every rank (each one loads the state into its own model); called on some ranks "
                  "only",
                  "call ring.load on every rank: remove the `if ring.is_main:` (or rank check) around it."),
    "ring.save (or ring.load)": ("ring.save and ring.load run on every rank (a save writes the file once, from rank "
                                 "0); called on some ranks only",
                                 "call ring.save and ring.load on every rank: remove the `if ring.is_main:` (or rank "
                                 "check) around them; a save writes once."),
    "the periodic checkpoint": ("every rank writes the periodic checkpoint, at the same step; reached by some ranks "
                                "only",
                                "every rank must run the same steps of the loop: look for a branch on the rank (or on "
                                "per-rank data) that makes a rank leave the loop, or skip or add a step."),
}


def one_sided_checkpoint(rank: int, world: int, views: dict[int, Whereabouts], now: float,
                         after_s: float) -> tuple[str, str] | None:
    """(what happened, the fix) when ``rank`` waits in a checkpoint's collective that some ranks never call: the
    translation of ``if dist.get_rank() == 0: torch.save(...)`` into ``if ring.is_main: ring.save(...)`` — a proven
    deadlock, told in seconds rather than at the collective's timeout. None unless, by every rank's fresh word:

    * ``rank`` is in a checkpoint and waits in one of its collectives, with no progress for ``after_s`` seconds
      (the caller knows it is a collective's wait for sure: ``activity.in_collective``);
    * every other rank answers and waits too, for as long: none is computing, evaluating or merely slow;
    * some rank outside any checkpoint waits in another collective, and has issued more collectives than ``rank``
      had when its checkpoint began: it went past the point where it should have joined it, and never will;
    * ``rank`` is the lowest rank in a checkpoint (one speaks for the job; the others are stopped by its post).

    Ranks all in checkpoints (the same save, reached by every rank) are left to the stall report.
    """
    me = views.get(rank)
    if me is None or not me.checkpoint or me.checkpoint_at is None or not _stuck(me, now, after_s):
        return None
    peers = {r: views.get(r) for r in range(world) if r != rank}
    if not peers or not all(v is not None and responding(v, now) and _stuck(v, now, after_s) for v in peers.values()):
        return None
    if any(v.checkpoint for r, v in peers.items() if r < rank):  # type: ignore[union-attr]
        return None
    past = {r: v for r, v in peers.items() if v is not None and not v.checkpoint and v.waiting != me.waiting
            and v.issued is not None and v.issued > me.checkpoint_at}
    if not past:
        return None
    shown = sorted(past.items())[:3]
    where = "; ".join(f"rank {r} is in {v.collective()}" + (f" at {v.site}" if v.site else "") for r, v in shown)
    if len(past) > len(shown):
        where += f"; and {len(past) - len(shown)} more ranks are elsewhere"
    what, hint = _CHECKPOINT_WORDS.get(me.checkpoint, _CHECKPOINT_WORDS["ring.save (or ring.load)"])
    return f"{me.checkpoint} waits for the other ranks (in {me.waiting}), but {where} — {what}, it waits for ever.", hint


def stall_report(reporter: int, world: int, views: dict[int, Whereabouts], stacks: dict[int, str],
                 states: dict[int, str], next_in: float | None, now: float | None = None,
                 hellos: dict[int, dict] | None = None) -> str:
    """The stall report: who waits and in what, who has not arrived and where it is (its stack), who
    does not answer (with its process state where it is on this host)."""
    now = time.time() if now is None else now
    me = views.get(reporter)

    def answers(r: int, view: Whereabouts | None) -> bool:
        # The reporter answers: it is writing this. Its word on the board may be older than FRESH_S — it spent that
        # long waiting for the others' answers (a frozen rank's never come) — and it is never "not responding".
        return view is not None and (r == reporter or responding(view, now))

    waited = _ago(me.waiting_since if me else None, now)
    lines = [f"ringtrain: stall: no progress for {waited}; rank {reporter} waits "
             + (f"{place_of(me, now)}." if me else "in a collective.")]
    fresh = {r: v for r, v in views.items() if answers(r, v)}
    if me is not None:
        fresh[reporter] = dataclasses.replace(me, beat=max(me.beat, max(v.beat for v in fresh.values())))
    different = mismatch(fresh)
    if different:
        lines.append(f"  the ranks are in different collectives: {different}")
    waiting = sorted(r for r, v in views.items() if v.waiting and answers(r, v))
    if waiting:
        lines.append("  waiting:       " + "; ".join(f"rank {r} {place_of(views[r], now)}" for r in waiting))
    for r in range(world):
        view = views.get(r)
        if r in waiting:
            continue
        if not answers(r, view) or (r in states and r not in stacks):
            state = f": {states[r]}" if r in states else ""
            last = f"; its last word {_ago(view.beat, now)} ago: {place_of(view, now)}" if view else ""
            hello = (hellos or {}).get(r, {})
            pid = (f"pid {view.pid} on {view.hostname}" if view else
                   f"pid {hello['pid']} on {hello.get('hostname', '?')}" if "pid" in hello else "never joined")
            lines.append(f"  not responding: rank {r} ({pid}{state}){last}" + (", and now:" if stacks.get(r) else ""))
            if stacks.get(r):
                lines.append(textwrap.indent(stacks[r].rstrip(), "      "))
            continue
        lines.append(f"  not arrived:   rank {r} {place_of(view, now)}" + (":" if stacks.get(r) else ""))
        if stacks.get(r):
            lines.append(textwrap.indent(stacks[r].rstrip(), "      "))
    hint = ("HINT: every rank must reach the same collectives in the same order; the stacks above show "
            "where the others are. `kill -USR1 <ringtrain run pid>` (or `ringtrain stacks <pid>`) prints every "
            "rank's stack now.")
    computing = [r for r in range(world) if r not in waiting and answers(r, views.get(r))
                 and views[r].computing_backward]
    if computing:
        who = ", ".join(f"rank {r}" for r in computing)
        hint += (f" {who} {'runs' if len(computing) == 1 else 'run'} code of its own inside its backward (a backward "
                 "hook, a custom autograd Function: on its stack above), waiting for nobody: the others wait for its "
                 "gradients.")
    if next_in:
        hint += f" Next report in {next_in:.0f} s unless the job moves on."
    lines.append(hint)
    return "\n".join(lines)


def bottleneck(views: dict[int, Whereabouts]) -> tuple[int, str] | None:
    """(rank, line) when one rank holds the others back: its peers wait for it >= ``SLOW_SHARE`` of their step.

    A rank waits for the others inside its synchronising part (backward and the optimizer step,
    where the gradient all-reduce completes): the rank that waits least there is the one the others
    wait for, and how long each other rank waits is how much longer its synchronising part takes.
    """
    timed = {r: v.times for r, v in views.items() if v.times.get("steps", 0) >= 5 and v.times.get("step", 0) > 0}
    if len(timed) < 2 or len(timed) != len(views):
        return None
    slow = min(timed, key=lambda r: timed[r]["sync"])
    others = [r for r in timed if r != slow]
    waits = {r: timed[r]["sync"] - timed[slow]["sync"] for r in others}
    if min(waits[r] / timed[r]["step"] for r in others) < SLOW_SHARE:
        return None
    mine = timed[slow]
    data_others = sorted(timed[r]["data"] for r in others)[len(others) // 2]
    compute = {r: timed[r]["step"] - timed[r]["data"] - (waits.get(r, 0.0)) for r in timed}
    compute_others = sorted(compute[r] for r in others)[len(others) // 2]
    if mine["data"] - data_others >= compute[slow] - compute_others:
        where = f"data loading {mine['data']:.0f} ms/step (the others {data_others:.0f})"
    else:
        where = f"compute {compute[slow]:.0f} ms/step (the others {compute_others:.0f})"
    wait = sorted(waits.values())[len(waits) // 2]
    return slow, (f"ringtrain: rank {slow} is the slowest: {where}; the others wait {wait:.0f} ms/step for it "
                  f"({100 * wait / timed[others[0]]['step']:.0f}% of their step).")


def per_rank_stats(times: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """Each rank's whole-run ``steps``, ``ms_per_step`` and the percent of a step spent waiting for data
    (``data_pct``), computing (``compute_pct``) and waiting for the other ranks (``wait_pct``: how much
    longer its synchronising part took than the fastest rank's). ``times``: ``StepTimes.summary()`` by rank."""
    rows = {r: t for r, t in sorted(times.items()) if t.get("steps")}
    if not rows:
        return {}
    fastest_sync = min(t["total_sync"] / t["steps"] for t in rows.values())
    out = {}
    for r, t in rows.items():
        steps = t["steps"]
        step = t["total_step"] / steps
        data = t["total_data"] / steps
        wait = max(0.0, t["total_sync"] / steps - fastest_sync)
        compute = max(0.0, step - data - wait)
        pct = (lambda x: 100 * x / step) if step else (lambda x: 0.0)
        out[r] = {"steps": int(steps), "ms_per_step": step, "data_pct": pct(data), "compute_pct": pct(compute),
                  "wait_pct": pct(wait)}
    return out


def per_rank_summary(times: dict[int, dict[str, float]]) -> str | None:
    """The end-of-run table: steps, ms/step, and the share of data wait, compute and waiting for the others."""
    stats = per_rank_stats(times)
    if not stats:
        return None
    lines = ["ringtrain: per-rank step times (data = waiting for the loader, wait = waiting for the other ranks):",
             "  rank  steps  ms/step  data %  compute %  wait %"]
    for r, s in stats.items():
        lines.append(f"  {r:>4}  {s['steps']:>5}  {s['ms_per_step']:>7.1f}  {s['data_pct']:>6.1f}  "
                     f"{s['compute_pct']:>9.1f}  {s['wait_pct']:>6.1f}")
    return "\n".join(lines)
