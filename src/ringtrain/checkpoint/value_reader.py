"""Reading ``ring.extras`` values back: the inverse of values.py's ``encode``, for what a checkpoint holds.

A checkpoint is input from a file (docs/architecture.md, principle 12): ``decode`` runs no code of the file's
choosing. A class a payload names is looked up in modules already in ``sys.modules`` (nothing is imported) through
their ``__dict__`` (no module ``__getattr__``), must be a dataclass, Enum or namedtuple class, and is rebuilt without
its ``__init__``/``__post_init__``; a malformed payload is a ``DamagedValue`` naming the key. Kept apart from the
encoder (values.py), which every assignment to ``ring.extras`` runs, to keep each module one idea.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import fractions
import math
import pathlib
import uuid
from typing import Any

import torch

from ..errors import RingtrainError
from .values import (MAX_DEPTH, MAX_NODES, TAG, DamagedValue, _DTYPE, _FACTORIES, _FRACTION_BITS, _MISSING, _PATHS,
                     _kind_of_class, _label, _lookup, _own, _short)


class _Decoder:
    def __init__(self, label: str):
        self.label, self.nodes = label, 0

    def need(self, ok: Any, what: str) -> None:  # ``what`` only where it is cheap to make: it is made every time
        if not ok:
            raise self.damaged(what)

    def damaged(self, what: str) -> DamagedValue:
        return DamagedValue(f"{self.label} in the checkpoint is damaged: {what}", "the file was damaged, or not "
                            "written by ringtrain; resume from another checkpoint (or remove this entry).")

    def dec(self, tree: Any, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise self.damaged(f"more than {MAX_NODES:,} values, or nested deeper than {MAX_DEPTH} (a cycle?)")
        t = type(tree)
        if t is list or t is tuple:
            return t(self.dec(v, depth + 1) for v in tree)
        if t is not dict:
            return tree  # a leaf the safe reader made (or a set, OrderedDict... of a checkpoint from before tags)
        if TAG not in tree:
            return {k: self.dec(v, depth + 1) for k, v in tree.items()}
        kind = tree[TAG]
        fields, rebuild = _KINDS.get(kind, (None, None)) if type(kind) is str else (None, None)
        if fields is None:
            raise self.damaged(f"a value of the unknown kind {_short(kind)}")
        if set(tree) != {TAG, *fields}:
            raise self.damaged(f"a {kind} with the fields {sorted(map(repr, tree))}, not {sorted(fields)}")
        try:
            return rebuild(self, tree, depth + 1)
        except RingtrainError:
            raise
        except Exception as e:  # a constructor's own check: a month 13, a range step 0, an unhashable set item...
            raise self.damaged(f"a {kind} that does not rebuild ({type(e).__name__}: {_short(str(e))})") from e

    def get(self, tree: dict, name: str, *types: type, length: int | None = None) -> Any:
        """Field ``name``, checked to be exactly of one of ``types`` (and of ``length`` items, if given)."""
        value = tree[name]
        if type(value) not in types or (length is not None and len(value) != length):
            raise self.damaged(f"its {name!r} is {_short(value)}")
        return value

    def ints(self, tree: dict, length: int, *more: type) -> list:
        parts = self.get(tree, "parts", list, tuple, length=length)
        if not all(type(p) in (int, *more) for p in parts):
            raise self.damaged(f"its parts {_short(parts)} are not numbers")
        return list(parts)

    def seq(self, tree: dict, name: str, depth: int, length: int | None = None) -> list:
        return [self.dec(v, depth) for v in self.get(tree, name, list, tuple, length=length)]

    def pairs(self, tree: dict, depth: int) -> list:
        items = self.get(tree, "items", list, tuple)
        self.need(all(type(p) in (list, tuple) and len(p) == 2 for p in items), "its items are not (key, value) pairs")
        return [(self.dec(k, depth), self.dec(v, depth)) for k, v in items]

    def cls(self, tree: dict, kind: str) -> Any:
        module, name = self.get(tree, "module", str), self.get(tree, "class", str)
        if (found := _lookup(module, name)) is _MISSING:
            raise RingtrainError(f"{self.label} in the checkpoint is an instance of {module}.{name} ({kind}), which "
                                 "this program has not defined or imported (reading a checkpoint imports nothing)",
                                 f"define or import {name} (from {module}) before ring.setup, as the run that wrote "
                                 "the checkpoint did.")
        self.need(_kind_of_class(found) == kind, f"it names {module}.{name} as a {kind} class, which it is not "
                  "(nothing was called)")
        return found

    def fields(self, tree: dict, names: list[str], depth: int) -> list:
        got = self.get(tree, "fields", dict)
        if set(got) != set(names):
            raise self.damaged(f"its fields {sorted(map(repr, got))} are not the class's {sorted(names)} (has the "
                               "class changed since the checkpoint was written?)")
        return [self.dec(got[n], depth) for n in names]

    def raw(self, tree: dict) -> bytes:
        data = self.get(tree, "data", torch.Tensor)
        self.need(data.dtype == torch.uint8 and data.dim() == 1 and data.layout == torch.strided,
                  f"its data is a {data.dtype} tensor of shape {tuple(data.shape)}, not bytes")
        try:
            return data.cpu().numpy().tobytes()
        except RuntimeError:  # a torch without numpy ("Numpy is not available"): slower, the same bytes
            return bytes(data.tolist())

    def numpy(self, tree: dict, data: bytes) -> tuple[Any, Any]:
        if not _DTYPE.match(dtype := self.get(tree, "dtype", str)):
            raise self.damaged(f"a numpy value of dtype {_short(dtype)}")
        try:
            import numpy as np  # only a payload that says numpy needs it (numpy is optional)
        except ImportError as e:
            raise RingtrainError(f"{self.label} in the checkpoint is a numpy value, and numpy is not installed",
                                 "pip install numpy") from e
        dtype = np.dtype(dtype)
        self.need(len(data) % dtype.itemsize == 0, f"a numpy {dtype} value in {len(data)} bytes")
        return np.frombuffer(data, dtype=dtype), dtype

    def scalar(self, tree: dict, depth: int) -> Any:
        flat, dtype = self.numpy(tree, self.get(tree, "data", bytes))
        self.need(len(flat) == 1, f"a numpy {dtype} scalar of {len(flat)} values")
        return flat[0]

    def array(self, tree: dict, depth: int) -> Any:
        flat, dtype = self.numpy(tree, self.raw(tree))
        shape, order = self.get(tree, "shape", list, tuple), self.get(tree, "order", str)
        if len(shape) > 64 or not all(type(n) is int and 0 <= n < 1 << 63 for n in shape) or order not in "CF":
            raise self.damaged(f"a numpy array of shape {_short(shape)}, order {_short(order)}")
        self.need(math.prod(shape) == len(flat), f"a numpy array of shape {tuple(shape)} holding {len(flat)} values")
        return flat.reshape(shape, order=order).copy(order="A")  # a copy: writable, in the order it had

    def clock(self, tree: dict, depth: int) -> Any:
        tz = tree["tz"]
        if tz is not None and (type(tz) not in (list, tuple) or len(tz) != 2 or type(tz[0]) is not int
                               or type(tz[1]) not in (str, type(None))):
            raise self.damaged(f"its time zone is {_short(tz)}")
        tzinfo = tz and dt.timezone(dt.timedelta(microseconds=tz[0]), *([tz[1]] if tz[1] is not None else []))
        *parts, fold = self.ints(tree, 8 if tree[TAG] == "datetime" else 5)
        return (dt.datetime if tree[TAG] == "datetime" else dt.time)(*parts, tzinfo=tzinfo, fold=fold)

    def dataclass(self, tree: dict, depth: int) -> Any:
        cls = self.cls(tree, "dataclass")
        names = [f.name for f in dataclasses.fields(cls)]
        obj = object.__new__(cls)  # no __init__ / __post_init__: the file's values, set as they were
        for name, value in zip(names, self.fields(tree, names, depth)):
            object.__setattr__(obj, name, value)  # frozen ones too
        return obj

    def enum(self, tree: dict, depth: int) -> Any:
        cls, name = self.cls(tree, "enum"), self.get(tree, "name", str)
        self.need(isinstance(member := _own(cls, "_member_map_").get(name), cls), f"{cls.__qualname__} has no "
                  f"member {name!r}")
        return member

    def path(self, tree: dict, depth: int) -> Any:
        cls, text = _PATHS.get(self.get(tree, "class", str)), self.get(tree, "text", str)
        if cls is None:
            raise self.damaged(f"a path of the class {_short(tree['class'])}")
        try:
            return cls(text)
        except NotImplementedError:  # a WindowsPath read on Linux (or back): its pure flavour is what this system has
            return (pathlib.PureWindowsPath if cls is pathlib.WindowsPath else pathlib.PurePosixPath)(text)

    def decimal(self, tree: dict, depth: int) -> Any:
        with decimal.localcontext() as context:
            context.traps[decimal.InvalidOperation] = True  # a malformed text raises, not becomes NaN
            return decimal.Decimal(self.get(tree, "text", str))

    def fraction(self, tree: dict, depth: int) -> Any:
        num, den = self.ints(tree, 2)
        self.need(den > 0 and max(num.bit_length(), den.bit_length()) <= _FRACTION_BITS,
                  f"a Fraction whose denominator is not positive, or of more than {_FRACTION_BITS} bits")
        return fractions.Fraction(num, den)

    def defaultdict(self, tree: dict, depth: int) -> Any:
        if (name := tree["factory"]) is not None and (type(name) is not str or name not in _FACTORIES):
            raise self.damaged(f"a defaultdict whose factory is {_short(name)}")
        return collections.defaultdict(name and _FACTORIES[name], self.pairs(tree, depth))

    def ordered(self, tree: dict, depth: int) -> Any:
        out, attrs = collections.OrderedDict(self.pairs(tree, depth)), self.get(tree, "attrs", dict)
        self.need(all(type(k) is str for k in attrs), "its attributes are not named by str")
        vars(out).update({k: self.dec(v, depth) for k, v in attrs.items()})  # into its __dict__: no descriptor runs
        return out


_D = _Decoder
# kind -> (its fields besides TAG, how it is rebuilt)
_KINDS: dict[str, tuple[set[str], Any]] = {
    "dict": ({"items"}, lambda d, t, n: dict(d.pairs(t, n))),
    "set": ({"items"}, lambda d, t, n: set(d.seq(t, "items", n))),
    "frozenset": ({"items"}, lambda d, t, n: frozenset(d.seq(t, "items", n))),
    "OrderedDict": ({"items", "attrs"}, _D.ordered),
    "Counter": ({"items"}, lambda d, t, n: collections.Counter(dict(d.pairs(t, n)))),  # into an empty one: as is
    "defaultdict": ({"factory", "items"}, _D.defaultdict),
    "slice": ({"parts"}, lambda d, t, n: slice(*d.seq(t, "parts", n, length=3))),
    "dataclass": ({"module", "class", "fields"}, _D.dataclass),
    "namedtuple": ({"module", "class", "fields"},
                   lambda d, t, n: tuple.__new__(cls := d.cls(t, "namedtuple"), d.fields(t, list(cls._fields), n))),
    "enum": ({"module", "class", "name"}, _D.enum),
    "flag": ({"module", "class", "value"}, lambda d, t, n: d.cls(t, "flag")(d.get(t, "value", int))),
    "numpy.scalar": ({"dtype", "data"}, _D.scalar),
    "numpy.array": ({"dtype", "shape", "order", "data"}, _D.array),
    "datetime": ({"parts", "tz"}, _D.clock),
    "time": ({"parts", "tz"}, _D.clock),
    "date": ({"parts"}, lambda d, t, n: dt.date(*d.ints(t, 3))),
    "timedelta": ({"parts"}, lambda d, t, n: dt.timedelta(*d.ints(t, 3))),
    "path": ({"class", "text"}, _D.path),
    "Decimal": ({"text"}, _D.decimal),
    "Fraction": ({"parts"}, _D.fraction),
    "UUID": ({"hex"}, lambda d, t, n: uuid.UUID(hex=d.get(t, "hex", str))),
    "range": ({"parts"}, lambda d, t, n: range(*d.ints(t, 3))),
    "complex": ({"parts"}, lambda d, t, n: complex(*d.ints(t, 2, float))),
    "bytearray": ({"data"}, lambda d, t, n: bytearray(d.raw(t))),
    "bytes": ({"data"}, lambda d, t, n: d.raw(t)),
}


def decode(tree: Any, key: str) -> Any:
    """The value ``encode`` made ``tree`` from; a malformed payload raises ``DamagedValue`` naming ``key``."""
    return _Decoder(_label(key)).dec(tree, 0)


def decoded_extras(stored: Any) -> dict[str, Any]:
    """The extras ``Extras.encoded()`` made ``stored`` from (as the safe reader read it back)."""
    _Decoder("ring.extras").need(type(stored) is dict and all(type(k) is str for k in stored),
                                 f"it is a {type(stored).__name__}, not a dict of names")
    return {key: _Decoder(f"ring.extras[{key!r}]").dec(tree, 0) for key, tree in stored.items()}
