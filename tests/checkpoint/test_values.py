"""values.py: every value ring.extras takes comes back through the real safe reader (files.atomic_save, then
files.read with weights_only=True) equal and of the same type; what it cannot take is refused where it is assigned,
naming the key, the path and the type; a hostile payload is a DamagedValue that imports and calls nothing."""

from __future__ import annotations

import collections
import copy
import dataclasses
import datetime as dt
import decimal
import enum
import fractions
import io
import json
import math
import os
import pathlib
import pickle
import struct
import sys
import time
import types
import typing
import uuid
import zoneinfo

import numpy as np
import pytest
import torch

from ringtrain.checkpoint import files, values
from ringtrain.checkpoint.value_reader import decode, decoded_extras
from ringtrain.checkpoint.values import TAG, DamagedValue, Extras, encode
from ringtrain.errors import RingtrainError


# The script's own classes: at a module's top level, as decode finds them again (in sys.modules, never imported).
class Color(enum.Enum):
    RED = "red"
    GREEN = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 10


class Perm(enum.Flag):
    R = 4
    W = 2
    X = 1


class Bits(enum.IntFlag):
    A = 1
    B = 8


class Mode(enum.StrEnum):
    TRAIN = "train"


Point = collections.namedtuple("Point", "x y")


class Pair(typing.NamedTuple):
    left: typing.Any
    right: int = 0


INITS: list[str] = []  # __init__/__post_init__ calls: decode makes none


@dataclasses.dataclass
class Config:
    name: str
    layers: list
    lr: float = 0.1
    extra: dict = dataclasses.field(default_factory=dict)
    derived: int = dataclasses.field(init=False, default=0)

    def __post_init__(self):
        INITS.append("post_init")
        self.derived = len(self.layers)


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: typing.Any
    b: typing.Any = None


@dataclasses.dataclass(slots=True)
class Slotted:
    a: int
    b: typing.Any


@dataclasses.dataclass
class Holder:
    arr: typing.Any
    path: typing.Any
    when: typing.Any = None


class Plain:  # a user class that is not a dataclass/namedtuple/Enum
    def __init__(self):
        self.x = 1


def through_file(value, tmp_path, key="v"):
    """``value`` as a checkpoint carries it: encoded, written by atomic_save, read by the safe reader, decoded."""
    path = tmp_path / "ckpt.pt"
    files.atomic_save({"extras": {key: encode(value, key)}}, path)
    return decode(files.read(path)["extras"][key], key)


def same(a, b) -> bool:
    """Equal and of the same type all the way down; numbers bit for bit (NaN equals NaN, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        return (a.dtype == b.dtype and a.shape == b.shape and a.tobytes(order="A") == b.tobytes(order="A")
                and (not isinstance(a, np.ndarray) or a.flags.f_contiguous == b.flags.f_contiguous))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict):  # the same keys (of the same types) in the same order, attributes, default factory
        return (list(a) == list(b) and all(type(k) is type(j) for k, j in zip(a, b))
                and all(same(a[k], b[k]) for k in a) and getattr(a, "__dict__", {}) == getattr(b, "__dict__", {})
                and getattr(a, "default_factory", None) is getattr(b, "default_factory", None))
    if isinstance(a, enum.Enum):
        return a is b
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, slice):
        return same((a.start, a.stop, a.step), (b.start, b.stop, b.step))
    if isinstance(a, (dt.datetime, dt.time)):
        return a == b and a.tzinfo == b.tzinfo and a.fold == b.fold and str(a.tzinfo) == str(b.tzinfo)
    return a == b


def _scalars():
    for t in (np.float16, np.float32, np.float64, np.longdouble):
        info = np.finfo(t)
        for v in (1.5, -0.0, math.nan, math.inf, -math.inf, info.max, info.tiny, info.eps):
            yield t(v)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64):
        yield from (t(np.iinfo(t).min), t(np.iinfo(t).max), t(7))
    yield from (np.bool_(True), np.bool_(False), np.complex64(1 - 2j), np.complex128(complex(math.nan, -0.0)),
                np.clongdouble(3 + 4j))


def _arrays():
    yield np.arange(12.0).reshape(3, 4)
    yield np.array(2.5)  # 0-d
    yield np.zeros((0, 3), dtype=np.int16)
    yield np.arange(24, dtype=np.int64).reshape(2, 3, 4)[:, ::2, 1:]  # not contiguous
    yield np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    yield np.arange(6, dtype=np.uint8).reshape(2, 3).T
    yield np.array([True, False])
    yield np.array([1 + 2j, math.nan], dtype=np.complex64)
    yield np.array([math.nan, math.inf, -0.0], dtype=np.float16)
    yield np.arange(3, dtype=">i4")  # big-endian: the same dtype back
    for t in (np.int8, np.uint16, np.uint32, np.uint64, np.longdouble):
        yield np.arange(5, dtype=t)


CASES = [
    *_scalars(), *_arrays(),
    dt.datetime(2024, 2, 29, 13, 5, 7, 123456),
    dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    dt.datetime(2024, 1, 1, 1, 2, 3, 999999, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
    dt.datetime(1999, 12, 31, tzinfo=dt.timezone(-dt.timedelta(hours=3, microseconds=5), "BRT")),
    dt.datetime(2021, 11, 7, 1, 30, fold=1),
    dt.date(1, 1, 1), dt.time(23, 59, 59, 1), dt.time(1, tzinfo=dt.timezone.utc),
    dt.timedelta(days=-3, seconds=5, microseconds=7), dt.timedelta.max,
    pathlib.Path("runs/a b/ckpt.pt"), pathlib.Path("/abs//x"), pathlib.PurePosixPath("p/q"),
    pathlib.PureWindowsPath(r"C:\runs\x.pt"), pathlib.PurePath("rel"),
    Config("net", [1, 2.5, "x"], extra={"k": (1, 2)}), Frozen(np.float32(1.25), Frozen(1)), Slotted(1, [None]),
    Color.RED, Color.GREEN, Level.HIGH, Perm.R, Perm.R | Perm.X, Perm(0), Bits.A | Bits.B, Mode.TRAIN,
    Point(1, [2]), Pair("a", 3),
    decimal.Decimal("3.14159265358979323846264338327950288"), decimal.Decimal("-0"), decimal.Decimal("NaN"),
    decimal.Decimal("-Infinity"), decimal.Decimal("1E+999999"),
    fractions.Fraction(-22, 7), fractions.Fraction(10**40 + 1, 3),
    uuid.UUID("12345678-1234-5678-1234-567812345678"), uuid.uuid4(),
    slice(None, 10, 2), slice(1.5, "x", [1]), range(0), range(-5, 10**30, 7),
    complex(1, -0.0), complex(math.nan, math.inf),
    {1, "a", (2, 3)}, set(), frozenset({1, frozenset({2})}),
    collections.OrderedDict([("b", 1), ("a", [2])]), collections.Counter("abracadabra"),
    collections.defaultdict(list, {"a": [1]}), collections.defaultdict(None, {1: 2}),
    collections.defaultdict(int), bytearray(b"\x00\xff"),
    None, True, 0, -(2**200), 1.5, math.nan, -0.0, "text", "", b"\x00bytes", b"", bytearray(), (), [], {},
    (1, (2, [3, {"a": (4,)}])), {"a": {"b": [None, True]}, 7: "int key"}, {(1, 2): "tuple key", None: 0, 2.5: 1},
    {True: "bool key", "x": 1}, torch.arange(4.0), torch.zeros(2, 2, dtype=torch.bfloat16), torch.float16,
    torch.Size([2, 3]), torch.device("cpu"),
]


@pytest.mark.parametrize("value", CASES, ids=lambda v: f"{type(v).__name__}:{_id(v)}")
def test_round_trips_through_the_safe_reader(value, tmp_path):
    back = through_file(value, tmp_path)
    assert same(back, value), (value, back)


def _id(value):
    return repr(value)[:40].replace(" ", "")


def test_state_dict_in_an_ordered_dict_keeps_its_metadata(tmp_path):
    state = torch.nn.Linear(2, 3).state_dict()
    back = through_file(state, tmp_path)
    assert type(back) is collections.OrderedDict and back._metadata == state._metadata
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_decode_rebuilds_a_dataclass_without_running_its_init(tmp_path):
    value = Config("net", [1, 2, 3])
    value.derived = 99  # what it was, not what __post_init__ would make
    INITS.clear()
    back = through_file(value, tmp_path)
    assert INITS == [] and back.derived == 99 and back == value


# The 13 of 26 common types that made every checkpoint unreadable before values.py.
BACKGROUND = [np.float64(1.5), np.int64(-3), np.arange(6.0).reshape(2, 3), dt.datetime(2024, 5, 1, 12, 0, 0, 7),
              pathlib.Path("out/ckpt.pt"), Frozen(1, "b"), Color.RED, collections.defaultdict(list, {"a": [1]}),
              fractions.Fraction(1, 3), decimal.Decimal("0.1"), uuid.UUID(int=7), slice(1, 9, 2), range(3, 30, 3)]


@pytest.mark.parametrize("value", BACKGROUND, ids=lambda v: type(v).__name__)
def test_the_types_that_made_checkpoints_unreadable(value, tmp_path):
    raw = tmp_path / "raw.pt"
    files.atomic_save({"best": value}, raw)
    with pytest.raises(files.DamagedCheckpoint):  # the bug: written without complaint, never read back
        files.read(raw)
    assert same(through_file(value, tmp_path), value)


def test_nested_anywhere(tmp_path):
    value = {"runs": [Holder(np.ones((2, 3), dtype=np.float32), pathlib.Path("a/b"), dt.date(2024, 1, 2)),
                      (Point(np.int8(1), {Color.RED: Perm.W}), {frozenset({uuid.UUID(int=1)}): range(2)})],
             "deep": [[[[{"x": decimal.Decimal("1.10")}]]]]}
    back = through_file(value, tmp_path)
    assert same(back, value)
    assert same(back["runs"][0].arr, value["runs"][0].arr) and type(back["runs"][0].path) is pathlib.PosixPath


def test_a_user_dict_holding_the_tag_round_trips_unchanged(tmp_path):
    lookalike = {TAG: "numpy.scalar", "dtype": "<f8", "data": struct.pack("<d", 1.5)}
    hostile_lookalike = {TAG: "dataclass", "module": "os", "class": "system", "fields": {}}
    value = {"a": lookalike, "b": [hostile_lookalike], "c": {TAG: {TAG: 1}}}
    back = through_file(value, tmp_path)
    assert back == value and type(back["a"]) is dict and type(back["a"]["data"]) is bytes


def test_what_is_stored_is_only_the_plain_core():
    def plain(tree):
        if isinstance(tree, dict):
            assert type(tree) is dict and all(type(k) in (str, int) for k in tree)
            return all(plain(v) for v in tree.values())
        if isinstance(tree, (list, tuple)):
            assert type(tree) in (list, tuple, torch.Size)
            return all(plain(v) for v in tree)
        return tree is None or type(tree) in (bool, int, float, str, torch.Tensor, torch.dtype, torch.device) or (
            type(tree) is bytes and tree != b"")  # b"" pickles (protocol 2) as a call weights_only refuses
    for value in [*CASES, b"", [b""], np.zeros(0), bytearray()]:
        assert plain(encode(value, "v")), value


def test_a_windows_path_read_on_linux_comes_back_as_its_pure_flavour():
    back = decode({TAG: "path", "class": "WindowsPath", "text": r"C:\x\y.pt"}, "p")
    assert type(back) is pathlib.PureWindowsPath and str(back) == r"C:\x\y.pt"


# -- refusals: key, path, type and a hint ---------------------------------------------------------------------------

@dataclasses.dataclass
class Layered:
    layers: list


def _refusal(value, key="config") -> RingtrainError:
    with pytest.raises(RingtrainError) as info:
        encode(value, key)
    assert not isinstance(info.value, DamagedValue)
    assert info.value.hint and "HINT: " in str(info.value)
    return info.value


def test_refusal_names_the_key_the_path_and_the_type():
    error = _refusal(Layered([1, 2, lambda x: x]))
    assert "ring.extras['config'].layers[2] is a builtins.function" in error.message
    assert "state_dict()" in error.hint and "numbers, strings, lists" in error.hint
    error = _refusal({"a": [{"b": (1, object())}]}, "k")
    assert "ring.extras['k']['a'][0]['b'][1] is a builtins.object" in error.message


@pytest.mark.parametrize("value, found", [
    (lambda: 0, "builtins.function"),
    (object(), "builtins.object"),
    (os, "builtins.module"),
    (Plain, "the class"),
    (Plain(), "Plain"),
    (np.array([1, "a"], dtype=object), "dtype object"),
    (np.array(["ab"]), "dtype <U2"),
    (np.zeros(2, dtype=[("a", "i4")]), "numpy ndarray of dtype"),
    (np.datetime64("2024-01-01"), "numpy datetime64"),
    (np.ma.masked_array([1, 2]), "ndarray subclass"),
    (np.str_("x"), "numpy str_"),
    (collections.defaultdict(lambda: 0), "default_factory"),
    (dt.datetime(2024, 1, 1, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")), "time zone"),
    (torch.zeros(2).as_subclass(type("T", (torch.Tensor,), {})), "tensor subclass"),
    (types.SimpleNamespace(a=1), "SimpleNamespace"),
    ({"k": {Plain(): 1}}, "(its key"),
])
def test_refused(value, found):
    assert found in _refusal(value).message


def test_an_open_file_is_refused(tmp_path):
    with open(tmp_path / "f", "w") as f:
        assert "TextIOWrapper" in _refusal({"log": f}).message


def test_a_class_decode_could_not_find_again_is_refused():
    @dataclasses.dataclass
    class Local:
        a: int
    assert "inside a function" in _refusal(Local(1)).message
    assert "top level" in _refusal(Local(1)).hint


def test_cycles_depth_and_size_are_bounded():
    cyclic: list = [1]
    cyclic.append(cyclic)
    assert "a cycle" in _refusal({"a": cyclic}).message
    deep: list = []
    for _ in range(values.MAX_DEPTH + 5):
        deep = [deep]
    assert "nested more than" in _refusal(deep).message
    shared: list = [0]
    for _ in range(40):  # 2**40 nodes as a tree, a few dozen objects: refused quickly, not walked
        shared = [shared, shared]
    start = time.perf_counter()
    assert "th value" in _refusal(shared).message
    assert time.perf_counter() - start < 30
    assert encode([[1], [1]], "ok") == [[1], [1]]  # a value seen twice that is not a cycle is fine


# -- Extras: refused at the assignment ------------------------------------------------------------------------------

def test_extras_refuses_at_every_way_in():
    extras = Extras(best=1.0)
    bad = {"f": lambda: 0}
    for assign in (lambda: extras.__setitem__("f", bad["f"]), lambda: extras.update(bad),
                   lambda: extras.update(ok=1, **bad), lambda: extras.update([("f", bad["f"])]),
                   lambda: extras.setdefault("f", bad["f"]), lambda: extras.__ior__(bad), lambda: Extras(bad),
                   lambda: Extras.fromkeys(["f"], bad["f"])):
        with pytest.raises(RingtrainError, match=r"ring.extras\['f'\] is a builtins.function"):
            assign()
    assert extras == {"best": 1.0}  # all or nothing: "ok" did not get in either
    with pytest.raises(RingtrainError, match="keyed by names"):
        extras[3] = 1
    with pytest.raises(RingtrainError, match="keyed by names"):
        extras.update({np.str_("a"): 1})  # a str subclass key would not read back either
    extras |= {"a": np.float64(2)}
    extras.setdefault("b", [1])
    assert extras.setdefault("b", None) == [1]


def test_extras_feels_like_a_dict():
    extras = Extras({"best": 0.5, "cfg": {"lr": 1e-3, "layers": [1, 2]}})
    assert extras == {"best": 0.5, "cfg": {"lr": 1e-3, "layers": [1, 2]}} and isinstance(extras, dict)
    assert json.loads(json.dumps(extras)) == extras and dict(extras) == extras and type(dict(extras)) is dict
    for twin in (copy.copy(extras), copy.deepcopy(extras), pickle.loads(pickle.dumps(extras)), extras.copy()):
        assert type(twin) is Extras and twin == extras
    assert copy.deepcopy(extras)["cfg"] is not extras["cfg"]
    assert (extras | {"x": 1})["x"] == 1 and repr(Extras(a=1)) == "{'a': 1}"


def test_encoded_refuses_a_value_changed_after_assignment():
    extras = Extras(history=[1.0, 2.0])
    extras["history"].append(lambda: 0)
    with pytest.raises(RingtrainError, match=r"ring.extras\['history'\]\[2\] is a builtins.function"):
        extras.encoded()


def test_extras_round_trip_through_a_checkpoint(tmp_path):
    extras = Extras(best=np.float64(0.25), when=dt.datetime(2024, 1, 1), cfg=Config("n", [1]), out=pathlib.Path("o"))
    files.atomic_save({"extras": extras.encoded()}, tmp_path / "c.pt")
    back = decoded_extras(files.read(tmp_path / "c.pt")["extras"])
    assert same(dict(back), dict(extras))
    with pytest.raises(DamagedValue):
        decoded_extras([1])


# -- hostile payloads: DamagedValue, nothing imported, nothing called --------------------------------------------------

def _damaged(tree, match="damaged"):
    with pytest.raises(DamagedValue, match=match) as info:
        decode(tree, "evil")
    assert "ring.extras['evil']" in info.value.message and info.value.hint
    return info.value


@pytest.mark.parametrize("kind", ["dataclass", "namedtuple", "enum", "flag"])
@pytest.mark.parametrize("module, name", [("os", "system"), ("builtins", "eval"), ("subprocess", "Popen"),
                                          ("builtins", "object"), ("collections", "OrderedDict"), ("os", "path.join")])
def test_a_payload_naming_what_is_no_such_class_is_refused(kind, module, name, monkeypatch):
    import subprocess
    called = []
    monkeypatch.setattr(os, "system", lambda *a: called.append(a))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: called.append(a))
    field = {"dataclass": {"fields": {"args": ["echo hi"]}}, "namedtuple": {"fields": {"args": "echo hi"}},
             "enum": {"name": "x"}, "flag": {"value": 1}}[kind]
    _damaged({TAG: kind, "module": module, "class": name, **field}, "nothing was called")
    assert called == []


def test_a_missing_class_names_it_and_imports_nothing():
    for module in ("antigravity", "this", "ringtrain_no_such_module"):  # importing the first two has effects
        assert module not in sys.modules
        with pytest.raises(RingtrainError) as info:
            decode({TAG: "dataclass", "module": module, "class": "Config", "fields": {}}, "cfg")
        assert module not in sys.modules
        assert f"ring.extras['cfg']" in info.value.message and f"{module}.Config" in info.value.message
        assert "before ring.setup" in info.value.hint
    with pytest.raises(RingtrainError, match="NotDefinedYet"):
        decode({TAG: "enum", "module": __name__, "class": "NotDefinedYet", "name": "A"}, "c")


def test_lookup_runs_no_module_getattr(monkeypatch):
    asked = []
    lazy = types.ModuleType("ringtrain_lazy_test")
    lazy.__getattr__ = lambda name: asked.append(name) or Config  # PEP 562: would import on demand
    monkeypatch.setitem(sys.modules, "ringtrain_lazy_test", lazy)
    with pytest.raises(RingtrainError, match="not defined or imported"):
        decode({TAG: "dataclass", "module": "ringtrain_lazy_test", "class": "Config", "fields": {}}, "x")
    assert asked == []


def _np(**changes):
    tree = {TAG: "numpy.array", "dtype": "<f8", "shape": [2], "order": "C", "data": bytes(16)}
    return {**tree, **changes}


@pytest.mark.parametrize("tree", [
    {TAG: "no such kind"}, {TAG: 3}, {TAG: "range", "parts": [0, 1, 1], "extra": 1}, {TAG: "range"},
    _np(dtype="|O"), _np(dtype="<U2"), _np(dtype="V8"), _np(dtype=b"<f8"), _np(data="x" * 16), _np(shape=[-2, -1]),
    _np(shape=[3]), _np(shape=[2**40, 2**40]), _np(shape=[0, 2**62], data=b""), _np(order="K"), _np(shape=[True, 2]),
    _np(shape=[1] * 70, data=bytes(8)),
    {TAG: "numpy.scalar", "dtype": "<f8", "data": b"\x00"}, {TAG: "numpy.scalar", "dtype": "f1", "data": b"\x00"},
    {TAG: "datetime", "parts": [2024, 13, 1, 0, 0, 0, 0, 0], "tz": None},
    {TAG: "datetime", "parts": [2024, 1, 1, 0, 0, 0, 0, 0], "tz": [10**15, None]},
    {TAG: "datetime", "parts": [2024, 1, 1, 0, 0, 0, 0, 0], "tz": "UTC"},
    {TAG: "datetime", "parts": ["2024", 1, 1, 0, 0, 0, 0, 0], "tz": None},
    {TAG: "date", "parts": [2024, 1]}, {TAG: "time", "parts": [25, 0, 0, 0, 0], "tz": None},
    {TAG: "timedelta", "parts": [10**12, 0, 0]}, {TAG: "range", "parts": [0, 10, 0]},
    {TAG: "range", "parts": [0, 1.5, 1]}, {TAG: "Fraction", "parts": [1, 0]}, {TAG: "Fraction", "parts": [1, -2]},
    {TAG: "Decimal", "text": "abc"}, {TAG: "Decimal", "text": 1}, {TAG: "UUID", "hex": "zz"},
    {TAG: "complex", "parts": ["1", 0.0]}, {TAG: "path", "class": "Popen", "text": "x"},
    {TAG: "path", "class": "Path", "text": b"x"}, {TAG: "set", "items": [[1]]}, {TAG: "set", "items": "ab"},
    {TAG: "dict", "items": [[1, 2, 3]]}, {TAG: "dict", "items": [[[1], 2]]}, {TAG: "dict", "items": {"a": 1}},
    {TAG: "defaultdict", "factory": "system", "items": []}, {TAG: "defaultdict", "factory": ["int"], "items": []},
    {TAG: "OrderedDict", "items": [], "attrs": {1: 2}}, {TAG: "Counter", "items": [["a"]]},
    {TAG: "slice", "parts": [1, 2]}, {TAG: "bytearray", "data": "x"},
    {TAG: "enum", "module": __name__, "class": "Color", "name": "BLUE"},
    {TAG: "enum", "module": __name__, "class": "Color", "name": "_member_map_"},
    {TAG: "enum", "module": __name__, "class": "Color", "name": 2},
    {TAG: "flag", "module": __name__, "class": "Perm", "value": "4"},
    {TAG: "enum", "module": __name__, "class": "Config", "name": "lr"},
    {TAG: "dataclass", "module": __name__, "class": "Config", "fields": {"name": "n"}},
    {TAG: "dataclass", "module": __name__, "class": "Frozen", "fields": [1, 2]},
    {TAG: "dataclass", "module": __name__, "class": "Color", "fields": {}},
    {TAG: "dataclass", "module": 1, "class": "Config", "fields": {}},
    {TAG: "namedtuple", "module": __name__, "class": "Point", "fields": {"x": 1}},
    {TAG: "namedtuple", "module": "builtins", "class": "tuple", "fields": {}},
], ids=lambda t: _id(t))
def test_malformed_payloads_are_damaged(tree):
    assert isinstance(_damaged(tree), DamagedValue)
    nested = _damaged({"ok": [1, {"nested": tree}]})  # found wherever it is
    assert "ring.extras['evil']" in nested.message


def test_hostile_shapes_of_a_file_are_bounded(tmp_path):
    cyclic: list = []
    cyclic.append(cyclic)
    shared: list = [0]
    for _ in range(40):
        shared = [shared, shared]
    for tree in (cyclic, shared):
        buffer = io.BytesIO()
        torch.save({"v": tree}, buffer)
        buffer.seek(0)
        read = torch.load(buffer, weights_only=True)["v"]  # the safe reader makes both
        start = time.perf_counter()
        _damaged(read, "more than")
        assert time.perf_counter() - start < 30


def test_a_label_other_than_an_extras_key():
    with pytest.raises(RingtrainError, match=r"ring.keep\(ema\)\['a'\] is a builtins.function"):
        encode({"a": lambda: 0}, "ring.keep(ema)")
    with pytest.raises(DamagedValue, match=r"ring.keep\(ema\) in the checkpoint"):
        decode({TAG: "x"}, "ring.keep(ema)")


def test_a_fraction_too_long_to_read_back_quickly_is_refused_both_ways():
    huge = fractions.Fraction(2 ** (values._FRACTION_BITS + 1) + 1, 2)
    assert "more than" in _refusal(huge).message
    _damaged({TAG: "Fraction", "parts": [huge.numerator, 2]}, "bits")


def test_decoding_makes_no_message_it_does_not_need(tmp_path):
    big = {"arrays": [np.zeros((512, 512)) for _ in range(8)], "cfg": [Config("c", list(range(1000)))] * 50}
    start = time.perf_counter()
    back = through_file(big, tmp_path)
    assert same(back, big) and time.perf_counter() - start < 20


def test_numbers_too_long_to_print_still_give_the_error():
    _damaged({TAG: 10**5000})
    _damaged({TAG: "UUID", "hex": 10**5000})
    _damaged({TAG: "date", "parts": [10**5000, 1, 1]})
    assert "ring.extras['config'][<a int>] is a builtins.function" in _refusal({10**5000: lambda: 0}).message
