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
