"""The script's own values in a checkpoint (``ring.extras``), in a form the safe reader takes back.

Why: checkpoints are read only with ``torch.load(weights_only=True)`` (files.py), whose allowlist has no numpy,
datetime, Path, dataclass or Enum: ``torch.save`` wrote ``ring.extras["best"] = np.float64(1.5)`` without complaint,
and then *no* checkpoint could be read. 13 of 26 common types did that (np.float64, np.int64, ndarray, datetime, Path,
dataclasses, Enum, defaultdict, Fraction, Decimal, UUID, slice, range).

``encode`` keeps a plain core as it is (None, bool, int, float, str, bytes, tensors, torch dtype/device/Size, lists,
tuples, dicts with str/int keys) and makes every other type it knows a tagged dict ``{TAG: kind, ...}``. Measured on
torch 2.13, weights_only also reads set, OrderedDict, Counter, complex and any hashable key, but not frozenset nor b""
(pickle protocol 2 writes it as a call of ``bytes``); all are tagged, so a file leans on no torch version's allowlist.
A user's dict holding TAG (or a key not str/int) is the ``dict`` kind: it comes back as it was. ``decode`` runs no
code of the file's choosing: a class a payload names is looked up in modules already in ``sys.modules`` (nothing is
imported) through their ``__dict__`` (no module ``__getattr__``), must be a dataclass, Enum or namedtuple class, and
is rebuilt without its ``__init__``/``__post_init__``; a malformed payload is a ``DamagedValue``. Shared references
come back as copies; a dataclass keeps its fields. ``Extras`` (``ring.extras``) refuses a value where it is assigned.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import fractions
import math
import pathlib
import re
import sys
import uuid
from types import ModuleType
from typing import Any

import torch

from ..errors import RingtrainError

TAG = "__ringtrain_value__"
MAX_DEPTH = 100  # deeper is a mistake, or a cycle (a hostile file can make one: weights_only builds them)
MAX_NODES = 1_000_000  # shared references make a DAG of a few objects that is 2**40 nodes as a tree
_PLAIN = (bool, int, float, str, bytes, torch.dtype, torch.device, torch.Size, torch.Tensor, torch.nn.Parameter)
_DTYPE = re.compile(r"[<>|=]?[biufc][0-9]{1,2}\Z")  # '<f8' '|b1' '<c16': numbers only (no 'O', 'U', 'M8', fields)
_FRACTION_BITS = 1 << 18  # the gcd of a Fraction's reading is quadratic: 2**18 bits take 60 ms, 2**22 bits 15 s
_FACTORIES = {f.__name__: f for f in (int, float, str, list, dict, set, tuple, bool)}
_PATHS = {c.__name__: c for c in (pathlib.Path, pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePath,
                                   pathlib.PurePosixPath, pathlib.PureWindowsPath)}
_MISSING = object()
_MODULE_DICT = ModuleType.__dict__["__dict__"].__get__  # a module's own dict, whatever its class says
_CLASS_DICT = type.__dict__["__dict__"].__get__
_MRO = type.__dict__["__mro__"].__get__
_STORE = ("store numbers, strings, lists, tuples and dicts of them in ring.extras (numpy values, datetimes, paths, "
          "dataclasses, namedtuples and enums work too); an object with a state of its own gets state_dict()/"
          "load_state_dict() and is handed to the ring instead (ring.save(path, name=obj) saves its state_dict()).")
_WHY = "a checkpoint cannot hold it (written, it would make torch.load(weights_only=True) refuse the whole file)"


class DamagedValue(RingtrainError):
    """A stored value whose tagged payload is not what ``encode`` writes (a damaged or crafted file)."""


def encode(value: Any, key: str) -> Any:
    """``value`` as a tree ``torch.load(weights_only=True)`` reads back. ``key`` names it in errors: its key in
    ``ring.extras``, or a whole label (text starting with ``ring.``, e.g. ``"ring.keep(ema)"``, is used as it is)."""
    return _Encoder(_label(key)).enc(value, 0)


def decode(tree: Any, key: str) -> Any:
    """The value ``encode`` made ``tree`` from; a malformed payload raises ``DamagedValue`` naming ``key``."""
    return _Decoder(_label(key)).dec(tree, 0)


def _label(key: Any) -> str:
    return key if isinstance(key, str) and key.startswith("ring.") else f"ring.extras[{key!r}]"


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # an int past sys.get_int_max_str_digits(), a user __repr__ that raises
        text = f"<a {type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _own(cls: type, name: str) -> Any:
    """``cls.name`` as its classes' dicts hold it: no descriptor, metaclass or ``__getattr__`` runs."""
    for klass in _MRO(cls):
        if name in (found := _CLASS_DICT(klass)):
            return found[name]
    return _MISSING


def _lookup(module: str, qualname: str) -> Any:
    """What ``module.qualname`` names, found without importing or calling anything: _MISSING where a name is not
    there, None where the way goes through what is not a class (``os.path.join``)."""
    mod = sys.modules.get(module)
    if mod is None or not issubclass(type(mod), ModuleType):
        return _MISSING
    first, *rest = qualname.split(".")
    obj = _MODULE_DICT(mod).get(first, _MISSING)
    for part in rest:
        if obj is _MISSING or not issubclass(type(obj), type):
            return obj if obj is _MISSING else None
        obj = _CLASS_DICT(obj).get(part, _MISSING)
    return obj


def _kind_of_class(cls: Any) -> str | None:
    if not issubclass(type(cls), type):
        return None
    if issubclass(cls, enum.Enum):
        return "flag" if issubclass(cls, enum.Flag) else "enum"
    if isinstance(_own(cls, "__dataclass_fields__"), dict):
        return "dataclass"
    fields = _own(cls, "_fields")
    if issubclass(cls, tuple) and type(fields) is tuple and all(type(f) is str for f in fields):
        return "namedtuple"
    return None


def _tensor(data: bytes | bytearray) -> torch.Tensor:
    """Raw bytes as a uint8 tensor: pickle protocol 2 (torch.save's) writes bytes as latin-1 text, up to twice the
    size, and b"" as a call weights_only refuses; a tensor's storage is written as it is."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


class _Encoder:
    def __init__(self, label: str, check: bool = False):
        self.label, self.check, self.nodes = label, check, 0  # check: only validate (no array bytes are copied)
        self.steps: list[tuple[str, Any]] = []  # where in the value we are, formatted only for an error
        self.active: set[int] = set()  # the containers on the way down: one met again is a cycle

    def refuse(self, what: str, hint: str = _STORE, why: str = _WHY) -> RingtrainError:
        text = {"[]": "[{}]", ".": ".{}", "key": " (its key {})", "item": " (an item of it)"}
        where = "".join(text[kind].format(_short(x) if kind in ("[]", "key") else x) for kind, x in self.steps)
        where = where if len(where) < 300 else f"{where[:200]}...{where[-60:]}"
        return RingtrainError(f"{self.label}{where} is {what}: {why}", hint)

    def at(self, kind: str, step: Any, value: Any, depth: int) -> Any:
        self.steps.append((kind, step))
        out = self.enc(value, depth + 1)
        self.steps.pop()
        return out

    def enc(self, value: Any, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            what = f"nested more than {MAX_DEPTH} deep" if depth > MAX_DEPTH else f"past its {MAX_NODES:,}th value"
            raise self.refuse(what, "store a long series as a tensor or array; nest less.", "more than a value keeps")
        t = type(value)
        if value is None or t in _PLAIN:
            return {TAG: "bytes", "data": _tensor(b"")} if t is bytes and not value else value
        if isinstance(value, torch.Tensor):
            raise self.refuse(f"a tensor subclass ({t.__module__}.{t.__qualname__})", "store value.as_subclass("
                              "torch.Tensor) (a plain tensor).")
        np = sys.modules.get("numpy")  # a numpy value exists only once numpy is imported: nothing to import here
        if np is not None and isinstance(value, (np.generic, np.ndarray)):
            return self.numpy(np, value)
        if t in _LEAVES:
            return {TAG: _LEAVES[t][0], **_LEAVES[t][1](self, value)}
        if isinstance(value, type):
            raise self.refuse(f"the class {value.__module__}.{value.__qualname__} itself, not an instance of it",
                              "store its name (a str) and look the class up when the run resumes.")
        if isinstance(value, enum.Enum):
            if not isinstance(value, enum.Flag):
                return {TAG: "enum", **self.findable(t), "name": value.name}
            if type(value.value) is not int:
                raise self.refuse(f"the Flag member {value!r}, whose value is not an int", "give the Flag int values.")
            return {TAG: "flag", **self.findable(t), "value": value.value}
        if id(value) in self.active:
            raise self.refuse(f"a {t.__name__} that holds itself (a cycle)", "store a structure without cycles.")
        self.active.add(id(value))
        try:
            return self.container(value, t, depth)
        finally:
            self.active.discard(id(value))

    def container(self, value: Any, t: type, depth: int) -> Any:
        if t is list or t is tuple:
            return t(self.at("[]", i, v, depth) for i, v in enumerate(value))
        if t is dict and TAG not in value and all(type(k) in (str, int) for k in value):
            return {k: self.at("[]", k, v, depth) for k, v in value.items()}
        if t in (dict, collections.Counter):
            return {TAG: t.__name__, "items": self.items(value, depth)}
        if t in (set, frozenset):
            return {TAG: t.__name__, "items": [self.at("item", None, v, depth) for v in value]}
        if t is collections.OrderedDict:  # a state dict's _metadata (the modules' versions) is an attribute: kept
            attrs = {k: self.at(".", k, v, depth) for k, v in vars(value).items()}
            return {TAG: "OrderedDict", "items": self.items(value, depth), "attrs": attrs}
        if t is collections.defaultdict:
            factory = value.default_factory
            if factory is not None and _FACTORIES.get(getattr(factory, "__name__", None)) is not factory:
                raise self.refuse(f"a defaultdict whose default_factory is {_short(factory)}",
                                  f"use default_factory None or one of {', '.join(_FACTORIES)}; or store dict(value).")
            return {TAG: "defaultdict", "factory": factory and factory.__name__, "items": self.items(value, depth)}
        if t is slice:
            parts = [self.at(".", n, getattr(value, n), depth) for n in ("start", "stop", "step")]
            return {TAG: "slice", "parts": parts}
        kind = _kind_of_class(t) if dataclasses.is_dataclass(value) or isinstance(value, tuple) else None
        if kind == "namedtuple":
            fields = {n: self.at(".", n, v, depth) for n, v in zip(t._fields, value)}
            return {TAG: "namedtuple", **self.findable(t), "fields": fields}
        if kind != "dataclass":
            raise self.refuse(f"a {t.__module__}.{t.__qualname__}")
        names = [f.name for f in dataclasses.fields(value)]
        try:
            object.__new__(t)  # what decode does: a class whose base needs its own __new__ could not come back
        except TypeError:
            raise self.refuse(f"the dataclass {t.__qualname__}, which cannot be rebuilt without its __init__",
                              "store dataclasses.asdict(value) instead.") from None
        if unset := [n for n in names if not hasattr(value, n)]:
            raise self.refuse(f"a {t.__qualname__} whose field {unset[0]} is not set", "set every field.")
        fields = {n: self.at(".", n, getattr(value, n), depth) for n in names}
        return {TAG: "dataclass", **self.findable(t), "fields": fields}

    def items(self, value: dict, depth: int) -> list:
        return [[self.at("key", k, k, depth), self.at("[]", k, v, depth)] for k, v in value.items()]

    def findable(self, cls: type) -> dict[str, str]:
        """Module and qualified name of ``cls``, by which decode must find it again (so: at a module's top level)."""
        module, name = cls.__module__, cls.__qualname__
        if type(module) is not str or _lookup(module, name) is not cls:
            raise self.refuse(f"a {name} (of {module}), a class a checkpoint could not find again by its name (one "
                              "defined inside a function, or redefined)",
                              "define the class at the top level of a module (the training script's own is fine).")
        return {"module": module, "class": name}

    def numpy(self, np: ModuleType, value: Any) -> Any:
        dtype, name = value.dtype, type(value).__name__
        if not _DTYPE.match(dtype.str) or dtype.kind not in "biufc":
            raise self.refuse(f"a numpy {name} of dtype {dtype}", "store numbers, or value.tolist() for strings and "
                              "objects (a numpy array of objects could run code when read).")
        if isinstance(value, np.generic):
            return {TAG: "numpy.scalar", "dtype": dtype.str, "data": value.tobytes()}
        if type(value) is not np.ndarray:
            raise self.refuse(f"a {type(value).__module__}.{name} (an ndarray subclass)", "store np.asarray(value).")
        order = "F" if value.flags.f_contiguous and not value.flags.c_contiguous else "C"
        data = _tensor(b"" if self.check else value.tobytes(order=order))
        return {TAG: "numpy.array", "dtype": dtype.str, "shape": list(value.shape), "order": order, "data": data}

    def clock(self, v: Any) -> dict:
        """A datetime's or time's fields; its time zone a fixed offset (timezone(offset[, name]), as it pickles)."""
        if v.tzinfo is not None and type(v.tzinfo) is not dt.timezone:
            raise self.refuse(f"a {type(v).__name__} in the time zone {v.tzinfo!r}", "store it in UTC (value."
                              "astimezone(datetime.timezone.utc)) or another fixed offset; or store value.isoformat().")
        offset, *name = v.tzinfo.__getinitargs__() if v.tzinfo else (None,)
        tz = None if offset is None else [offset // dt.timedelta(microseconds=1), name[0] if name else None]
        date = [v.year, v.month, v.day] if type(v) is dt.datetime else []
        return {"parts": date + [v.hour, v.minute, v.second, v.microsecond, v.fold], "tz": tz}

    def fraction(self, v: fractions.Fraction) -> dict:
        if max(v.numerator.bit_length(), v.denominator.bit_length()) > _FRACTION_BITS:
            raise self.refuse(f"a Fraction of more than {_FRACTION_BITS} bits", "store its numerator and "
                              "denominator.", "more than a value keeps")
        return {"parts": [v.numerator, v.denominator]}


# type -> (kind, its fields) for the types whose values hold no other values
_LEAVES: dict[type, tuple[str, Any]] = {
    dt.datetime: ("datetime", _Encoder.clock), dt.time: ("time", _Encoder.clock),
    dt.date: ("date", lambda e, v: {"parts": [v.year, v.month, v.day]}),
    dt.timedelta: ("timedelta", lambda e, v: {"parts": [v.days, v.seconds, v.microseconds]}),
    decimal.Decimal: ("Decimal", lambda e, v: {"text": str(v)}),
    fractions.Fraction: ("Fraction", _Encoder.fraction),
    uuid.UUID: ("UUID", lambda e, v: {"hex": v.hex}),
    range: ("range", lambda e, v: {"parts": [v.start, v.stop, v.step]}),
    complex: ("complex", lambda e, v: {"parts": [v.real, v.imag]}),
    bytearray: ("bytearray", lambda e, v: {"data": _tensor(v)}),
    **{c: ("path", lambda e, v: {"class": type(v).__name__, "text": str(v)}) for c in _PATHS.values()},
}


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


def _admit(key: Any, value: Any) -> None:
    """Refuse, where it is assigned, a ``ring.extras`` entry a checkpoint could not hold or read back."""
    if type(key) is not str:
        raise RingtrainError(f"ring.extras[{_short(key)}]: ring.extras is keyed by names (str), not by a "
                             f"{type(key).__name__}", f"use a str key, e.g. ring.extras[{str(key)!r}].")
    _Encoder(f"ring.extras[{key!r}]", check=True).enc(value, 0)


class Extras(dict):
    """``ring.extras``: a dict whose every value is checked where it is assigned (``encode`` would take it), so a
    value that would make the checkpoints unreadable never gets in; ``encoded()`` is what a checkpoint stores."""

    def __init__(self, /, *args: Any, **kwargs: Any):
        super().__init__()
        self.update(*args, **kwargs)

    def __setitem__(self, key: str, value: Any) -> None:
        _admit(key, value)
        super().__setitem__(key, value)

    def update(self, /, *args: Any, **kwargs: Any) -> None:
        new = dict(*args, **kwargs)
        for key, value in new.items():  # all or nothing: one bad value leaves the extras as they were
            _admit(key, value)
        super().update(new)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def __ior__(self, other: Any) -> Extras:
        self.update(other)
        return self

    def copy(self) -> Extras:
        return type(self)(self)

    def __reduce__(self) -> tuple:
        return type(self), (dict(self),)

    def encoded(self) -> dict[str, Any]:
        """Every value encoded for a checkpoint; one changed since its assignment into what a checkpoint cannot hold
        (a list appended with a lambda) raises here, naming it."""
        return {key: _Encoder(f"ring.extras[{key!r}]").enc(value, 0) for key, value in self.items()}

    @classmethod
    def decoded(cls, stored: Any) -> Extras:
        """The extras ``encoded()`` made ``stored`` from (as the safe reader read it back)."""
        _Decoder("ring.extras").need(type(stored) is dict and all(type(k) is str for k in stored),
                                     f"it is a {type(stored).__name__}, not a dict of names")
        out = cls()
        dict.update(out, {key: _Decoder(f"ring.extras[{key!r}]").dec(tree, 0) for key, tree in stored.items()})
        return out
