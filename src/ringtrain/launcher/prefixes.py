"""The abbreviations torchrun and horovodrun accept (``--nnode=1`` for ``--nnodes``), and only those.

Both tools parse with argparse's default ``allow_abbrev=True``: a long option may be shortened to any
prefix that starts no other of *their* option strings (``--nnode``, ``--rdzv-i``, ``--slots`` for
horovodrun's ``--slots-per-host``); a prefix of several is an error ("ambiguous option: --nproc could
match --nproc-per-node, --nproc_per_node"). ringtrain's own flags are never abbreviated (a typo must
not become a silent guess), so ringtrain run's parser keeps ``allow_abbrev=False`` and this module
writes out, before parsing, the prefixes that torchrun's or horovodrun's parser would have taken:

* a prefix that torch's parser resolves to one option, and no other flag of ringtrain run starts with:
  that option (and the same for horovodrun's list);
* a prefix of several: refused, naming them, as those tools do — also when torch alone would have
  taken it but a flag of ringtrain's or horovodrun's starts with it too (``--t``: torchrun's ``--tee``,
  or ``--timeout``, ``--timeline``);
* anything else is left to argparse (an unknown flag: "unrecognized arguments", with its HINT).

Only the launcher's own part of the command line is read: the first word that is not an option or an
option's value is the script, and nothing from there on is touched (the script's ``--log`` stays
the script's).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from ..errors import RingtrainError


class Vocabulary:
    """The option strings of ringtrain run's parser, and the two tools' lists they are resolved against."""

    def __init__(self, takes: Mapping[str, int], tools: Mapping[str, Iterable[str]]):
        self.takes = dict(takes)  # option string -> how many values follow it (0 for a switch)
        self.tools = {name: tuple(options) for name, options in tools.items()}

    def resolve(self, word: str) -> str | None:
        """``word`` (``--name`` without ``=value``) written out, or None when it is no tool's abbreviation."""
        if not word.startswith("--") or word in self.takes:
            return None
        everyone = [o for o in self.takes if o.startswith(word)]
        if not everyone:
            return None
        for tool, options in self.tools.items():
            theirs = [o for o in options if o.startswith(word)]
            if len(theirs) == 1 and set(everyone) == {theirs[0]}:
                return theirs[0]
        expected = "; ".join(f"{tool}: {', '.join(o for o in options if o.startswith(word))}"
                             for tool, options in self.tools.items() if any(o.startswith(word) for o in options))
        raise RingtrainError(
            f"ambiguous option: {word} could match {', '.join(everyone)}"
            + (f" ({expected})" if expected else ""),
            f"write the whole flag, e.g. {everyone[0]}.",
        )

    def expand(self, argv: list) -> list:
        """``argv`` with the tools' abbreviations written out, up to the script."""
        out, i = list(argv), 0
        while i < len(out):
            word = out[i]
            if word == "--" or not word.startswith("-") or word == "-":
                break  # the script (or `--` before it): the rest is the script's
            name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
            full = self.resolve(name)
            if full is not None:
                name = full
                out[i] = full + eq + value
            takes = self.takes.get(name, 0)
            i += 1 + (takes if not eq else 0)
        return out
