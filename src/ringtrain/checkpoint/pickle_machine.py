"""A pickle machine that changes nothing but what it makes: metadata.py's reader of DCP's ``.metadata``.

Pickle's own machine gives every object it is handed to its opcodes: BUILD with slot state ``setattr``s on a
class (``PosixPath.__fspath__ = 0``, for the whole process), with a dict state it updates a function's or an enum
member's ``__dict__``, APPEND and SETITEM call what the object has. This one runs the opcodes of protocols 2-5
(those DCP's pickles use; the rest are refused) over a table it is given:

* a global resolves by exact (module, name) to what the table says: a ``Maker`` (a vetted constructor, never the
  class or function itself), or a value that is immutable (torch's dtypes); no module is allowed whole;
* REDUCE calls only a ``Maker``'s ``make``, which checks its arguments; NEWOBJ makes an empty instance of one of
  the table's dataclasses (its defaults set), which one BUILD fills, field by field, each checked by its ``Spec``;
* APPEND(S), SETITEM(S), ADDITEMS and BUILD change only a container this machine made, and only before it is placed
  in another (so nothing outside the result ever changes, the result has no cycle, and a depth once counted
  stays true);
* bounded: ``MAX_DEPTH`` of nesting, ``MAX_STACK`` items on the stack, at most ``MAX_SHARED_HASH`` keys of one
  dict or set sharing a hash (ints and tuples collide at will: a flood is quadratic to insert), ints of 16 bytes.

Anything else is ``Refused``, with what and at which byte.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import struct
from typing import Any, Callable, Mapping

MAX_DEPTH = 32  # DCP's own nest 7 deep (Metadata, dict, TensorStorageMetadata, list, chunk, Size, its args)
MAX_STACK = 1 << 16  # items on the stack (DCP's pickles: a few thousand, SETITEMS batches of 1,000 pairs)
MAX_SHARED_HASH = 16  # keys of one dict or set with the same hash


class Refused(Exception):
    """Why the pickle is not one this machine builds."""


class Maker:
    """What a global of the table resolves to, instead of the class or function: ``make(*args)`` for REDUCE
    (``kind``: "leaf", "fixed" (an immutable container) or "open" (one the pickle fills next; ``make=None``: a set
    or, "fixed", a frozenset)), with ``of_ints`` for its commonest call (one tuple of ints); or ``cls``, a dataclass
    NEWOBJ makes an empty instance of."""

    __slots__ = ("label", "make", "kind", "cls", "of_ints")

    def __init__(self, label: str, make: Callable[..., Any] | None = None, kind: str = "leaf",
                 cls: type | None = None, of_ints: Callable[[tuple], Any] | None = None):
        self.label, self.make, self.kind, self.cls, self.of_ints = label, make, kind, cls, of_ints


Check = Callable[["Machine", Any], bool]  # a field's value, for the machine (its ``unbuilt``): as it should be?


@dataclasses.dataclass(frozen=True)
class Spec:
    """One dataclass NEWOBJ may make: each field's check, how a tuple state reads (``from_tuple``: its fields), and
    what the built object as a whole must satisfy (``finish`` raises ``Refused``)."""

    cls: type
    fields: dict[str, Check]
    from_tuple: Callable[[tuple], dict[str, Any]] | None = None
    finish: Callable[[Any], None] | None = None

    @functools.cached_property
    def defaults(self) -> list[tuple[str, Any, Any]]:
        return [(f.name, f.default, f.default_factory) for f in dataclasses.fields(self.cls)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]

    @functools.cached_property
    def required(self) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(self.cls)) - {name for name, _, _ in self.defaults}


def what(value: Any) -> str:
    """``value`` in a few words, for a refusal."""
    if type(value) is Maker:
        return f"the global {value.label}"
    text = repr(value) if isinstance(value, (int, float, str, bytes, type(None))) else f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def unpickle(data: bytes, names: Mapping[tuple[str, str], Any], specs: Mapping[type, Spec]) -> tuple[Any, Machine]:
    """``data``'s result, and the machine that made it (``unbuilt``: what no BUILD completed)."""
    machine = Machine(data, names, specs)
    # The result has no cycle (refused), so refcounting frees all of it; the collector's passes over the growing
    # graph would cost more than the read itself (DCP's .metadata of 16,000 shards: 0.9 s with them, 0.6 s without).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return machine.run(), machine
    finally:
        if collecting:
            gc.enable()


MISSING = object()
INTS, TEXTS = {int}, {str}


class Machine:
    """Runs one pickle (protocols 2-5) over ``data``, with ``names`` for its globals (a ``Maker``, or a value
    that is immutable) and ``specs`` for the classes NEWOBJ makes; ``run()`` is its result."""

    def __init__(self, data: bytes, names: Mapping[tuple[str, str], Any], specs: Mapping[type, Spec]):
        self.data, self.names, self.specs = data, names, specs
        self.depth: dict[int, int] = {}  # id -> nesting depth, of every container this read made
        self.open: set[int] = set()  # ids of the containers that may still be filled: not yet placed in another
        self.unbuilt: set[int] = set()  # ids of the instances whose required fields no BUILD has set yet
        self.keep: list[Any] = []  # every container made, alive to the end: no id is reused meanwhile
        self.hashes: dict[tuple[int, int], int] = {}  # (container, hash) -> keys of it (not text) with that hash

    def made(self, obj: Any, depth: int, fill: bool) -> Any:
        """``obj``, a container of ``depth``, made by this read (``fill``: one the pickle fills next)."""
        if depth > MAX_DEPTH:
            raise Refused(f"nested deeper than {MAX_DEPTH}")
        self.depth[id(obj)] = depth
        self.keep.append(obj)
        if fill:
            self.open.add(id(obj))
        return obj

    def placed(self, items: Any) -> int:
        """``items`` placed in a container (never to change again): 1 + their deepest."""
        deepest, depth, open_ = 0, self.depth, self.open
        for x in items:
            d = depth.get(id(x), 0)
            if d > deepest:
                deepest = d
            open_.discard(id(x))
        return deepest + 1

    def filling(self, target: Any, kinds: tuple[type, ...], op: str) -> None:
        if type(target) not in kinds or id(target) not in self.open:
            found = "one already placed in another" if type(target) in kinds else what(target)
            raise Refused(f"{op} on {found}: a pickle may fill only a {'/'.join(k.__name__ for k in kinds)} "
                          "it just made")

    def grow(self, target: Any, depth: int) -> None:
        if depth > self.depth[id(target)]:
            if depth > MAX_DEPTH:
                raise Refused(f"nested deeper than {MAX_DEPTH}")
            self.depth[id(target)] = depth

    def keys(self, target: Any, keys: Any) -> None:
        """No flood of keys sharing a hash in ``target`` (None: a set made at once, counted alone). Text is not
        counted: its hashes are keyed per process, and a collision of all 64 bits is out of reach."""
        hashes = self.hashes if target is not None else {}
        for k in keys:
            if type(k) is not str:
                slot = (id(target), hash(k))
                n = hashes[slot] = hashes.get(slot, 0) + 1
                if n > MAX_SHARED_HASH:
                    raise Refused(f"more than {MAX_SHARED_HASH} keys of one dict or set share a hash (a flood)")

    def reduce(self, maker: Any, args: Any) -> Any:
        if type(maker) is not Maker or maker.cls is not None or type(args) is not tuple:
            raise Refused(f"REDUCE of {what(maker)}: only the table's makers are called")
        if maker.make is None:  # set, frozenset: of one sequence of hashable items, or of nothing
            if len(args) > 1 or args and type(args[0]) not in (list, tuple):
                raise Refused(f"{maker.label} of {', '.join(map(what, args))}")
            items = args[0] if args else ()
            self.keys(None, items)
            made, depth = (set if maker.kind == "open" else frozenset)(items), self.placed(items)
        else:
            made, depth = maker.make(*args), self.placed(args)
        return made if maker.kind == "leaf" else self.made(made, depth, maker.kind == "open")

    def new(self, maker: Any, args: Any, kwargs: Any = None) -> Any:
        if type(maker) is not Maker or maker.cls is None or type(args) is not tuple or args \
                or kwargs is not None and (type(kwargs) is not dict or kwargs):
            raise Refused(f"NEWOBJ of {what(maker)} with {what(args)}: only the table's dataclasses, with no "
                          "arguments")
        spec = self.specs[maker.cls]
        obj = object.__new__(spec.cls)
        for name, default, factory in spec.defaults:
            object.__setattr__(obj, name, factory() if default is dataclasses.MISSING else default)
        if spec.required:
            self.unbuilt.add(id(obj))
        return self.made(obj, 1, True)

    def build(self, obj: Any, state: Any) -> None:
        spec = self.specs.get(type(obj))
        if spec is None or id(obj) not in self.open:  # a class, a function, an enum member, a path...; or built
            found = what(obj) if spec is None else f"a {spec.cls.__name__} already built or placed"
            raise Refused(f"BUILD on {found}: a pickle may set the fields only of an object it just made")
        if type(state) is tuple and spec.from_tuple is not None:
            fields = spec.from_tuple(state)
        elif type(state) is dict:
            fields = state
        else:
            raise Refused(f"BUILD of a {spec.cls.__name__} with {what(state)}, not its fields")
        for name, value in fields.items():
            check = spec.fields.get(name) if type(name) is str else None
            if check is None:
                raise Refused(f"{spec.cls.__name__} has no field {what(name)}")
            if not check(self, value):
                raise Refused(f"{spec.cls.__name__}.{name} is {what(value)}")
            object.__setattr__(obj, name, value)
        if spec.required - fields.keys():
            raise Refused(f"a {spec.cls.__name__} without {', '.join(sorted(spec.required - fields.keys()))}")
        self.grow(obj, self.placed(fields.values()))
        self.open.discard(id(obj))
        self.open.discard(id(state))
        self.unbuilt.discard(id(obj))
        if spec.finish is not None:
            spec.finish(obj)

    def run(self) -> Any:
        """The pickle's result. The hot opcodes first, their bookkeeping inline (``made``/``placed``'s)."""
        data, names, depth, open_, keep = self.data, self.names, self.depth, self.open, self.keep.append
        end = len(data)
        stack: list[Any] = []
        marks: list[int] = []
        memo: list[Any] = []
        push, remember, get, discard = stack.append, memo.append, depth.get, open_.discard
        u32, u16, i32, f64 = (struct.Struct(f).unpack_from for f in ("<I", "<H", "<i", ">d"))
        i = at = 0
        op = -1
        try:
            while True:
                at = i
                op = data[i]
                i += 1
                if op == 0x94:  # MEMOIZE
                    remember(stack[-1])
                elif op == 0x6A:  # LONG_BINGET
                    push(memo[u32(data, i)[0]])
                    i += 4
                elif op == 0x68:  # BINGET
                    push(memo[data[i]])
                    i += 1
                elif op == 0x4B:  # BININT1
                    push(data[i])
                    i += 1
                elif op == 0x28:  # MARK
                    if len(marks) >= MAX_DEPTH:
                        raise Refused(f"marks nested deeper than {MAX_DEPTH}")
                    marks.append(len(stack))
                elif op == 0x29:  # EMPTY_TUPLE
                    push(())
                elif op == 0x81:  # NEWOBJ
                    args = stack.pop()
                    stack[-1] = self.new(stack[-1], args)
                elif op == 0x62:  # BUILD
                    state = stack.pop()
                    self.build(stack[-1], state)
                elif op == 0x75 or op == 0x73:  # SETITEMS, SETITEM
                    k = marks.pop() if op == 0x75 else len(stack) - 2
                    if k < 1 or (len(stack) - k) % 2:
                        raise Refused("SETITEMS of an odd number of items, or of no dict")
                    items = stack[k:]
                    del stack[k:]
                    target = stack[-1]
                    if type(target) not in (dict, collections.OrderedDict) or id(target) not in open_:
                        self.filling(target, (dict, collections.OrderedDict), "SETITEM")
                    deepest = 0
                    for x in items:
                        if x is target:
                            raise Refused("a dict placed in itself")
                        d = get(id(x), 0)
                        if d > deepest:
                            deepest = d
                        discard(id(x))
                    if deepest >= depth[id(target)]:
                        self.grow(target, deepest + 1)
                    keys = items[0::2]
                    if not set(map(type, keys)) <= TEXTS:
                        self.keys(target, keys)
                    for key, value in zip(keys, items[1::2]):
                        target[key] = value
                elif op == 0x7D or op == 0x5D or op == 0x8F:  # EMPTY_DICT, EMPTY_LIST, EMPTY_SET
                    made = {} if op == 0x7D else [] if op == 0x5D else set()
                    depth[id(made)] = 1
                    keep(made)
                    open_.add(id(made))
                    push(made)
                elif op == 0x52:  # REDUCE
                    args = stack.pop()
                    maker = stack[-1]
                    if type(maker) is Maker and maker.of_ints is not None and type(args) is tuple \
                            and len(args) == 1 and type(args[0]) is tuple and set(map(type, args[0])) <= INTS:
                        made = maker.of_ints(args[0])  # torch.Size((3, 4)), the commonest
                        depth[id(made)] = 2
                        keep(made)
                        stack[-1] = made
                    else:
                        stack[-1] = self.reduce(maker, args)
                elif op == 0x85 or op == 0x86:  # TUPLE1, TUPLE2
                    b = stack.pop()
                    d = get(id(b), 0)
                    discard(id(b))
                    if op == 0x85:
                        made = (b,)
                    else:
                        a = stack.pop()
                        d = max(d, get(id(a), 0))
                        discard(id(a))
                        made = (a, b)
                    if d >= MAX_DEPTH:
                        raise Refused(f"nested deeper than {MAX_DEPTH}")
                    depth[id(made)] = d + 1
                    keep(made)
                    push(made)
                elif op == 0x4D:  # BININT2
                    push(u16(data, i)[0])
                    i += 2
                elif op == 0x8C:  # SHORT_BINUNICODE
                    n = data[i]
                    i += 1 + n
                    if i > end:
                        raise Refused("it ends inside a string")
                    push(data[i - n:i].decode("utf-8", "surrogatepass"))
                elif op == 0x4A:  # BININT
                    push(i32(data, i)[0])
                    i += 4
                elif op == 0x89 or op == 0x88 or op == 0x4E:  # NEWFALSE, NEWTRUE, NONE
                    push(None if op == 0x4E else op == 0x88)
                elif op == 0x74 or op == 0x87 or op == 0x91:  # TUPLE, TUPLE3, FROZENSET
                    k = marks.pop() if op != 0x87 else len(stack) - 3
                    items = stack[k:]
                    if k < 0:
                        raise Refused("TUPLE3 of items the stack does not hold")
                    del stack[k:]
                    if op == 0x91:
                        self.keys(None, items)
                    push(self.made(tuple(items) if op != 0x91 else frozenset(items), self.placed(items), False))
                elif op == 0x61 or op == 0x65 or op == 0x90:  # APPEND, APPENDS, ADDITEMS
                    k = len(stack) - 1 if op == 0x61 else marks.pop()
                    items = stack[k:]
                    del stack[k:]
                    target = stack[-1]
                    self.filling(target, (set,) if op == 0x90 else (list,), "ADDITEMS" if op == 0x90 else "APPEND")
                    if any(x is target for x in items):
                        raise Refused("a container placed in itself")
                    if op == 0x90:
                        self.keys(target, items)
                    self.grow(target, self.placed(items))
                    (target.update if op == 0x90 else target.extend)(items)
                elif op == 0x47:  # BINFLOAT
                    push(f64(data, i)[0])
                    i += 8
                elif op == 0x8A:  # LONG1
                    n = data[i]
                    if n > 16 or i + 1 + n > end:
                        raise Refused(f"an int of {n} bytes (DCP's fit in 16)")
                    push(int.from_bytes(data[i + 1:i + 1 + n], "little", signed=True))
                    i += 1 + n
                elif op in (0x58, 0x8D, 0x43, 0x42, 0x8E):  # BINUNICODE(8), SHORT_BINBYTES, BINBYTES(8)
                    w = 1 if op == 0x43 else 8 if op in (0x8D, 0x8E) else 4
                    n = int.from_bytes(data[i:i + w], "little")
                    i += w + n
                    if i > end:
                        raise Refused("it ends inside a string")
                    raw = data[i - n:i]
                    push(raw.decode("utf-8", "surrogatepass") if op in (0x58, 0x8D) else raw)
                elif op == 0x93 or op == 0x63:  # STACK_GLOBAL, GLOBAL
                    if op == 0x93:
                        name = stack.pop()
                        module = stack.pop()
                    else:
                        nl = data.index(b"\n", i)
                        nl2 = data.index(b"\n", nl + 1)
                        module, name = data[i:nl].decode("utf-8"), data[nl + 1:nl2].decode("utf-8")
                        i = nl2 + 1
                    texts = type(module) is str and type(name) is str
                    found = names.get((module, name), MISSING) if texts else MISSING
                    if found is MISSING:
                        label = f"{module}.{name}"[:120] if texts else f"{what(module)}.{what(name)}"
                        raise Refused(f"{label} is not part of a checkpoint's metadata")
                    push(found)
                elif op == 0x71 or op == 0x72:  # BINPUT, LONG_BINPUT: protocol 2-3's MEMOIZE, numbered
                    n = data[i] if op == 0x71 else u32(data, i)[0]
                    if n > len(memo):
                        raise Refused(f"memo {n} stored before memo {len(memo)}")
                    if n == len(memo):
                        remember(stack[-1])
                    else:
                        memo[n] = stack[-1]
                    i += 1 if op == 0x71 else 4
                elif op == 0x30:  # POP
                    if not stack or marks and marks[-1] == len(stack):
                        raise Refused("POP of nothing")
                    stack.pop()
                elif op == 0x31:  # POP_MARK
                    del stack[marks.pop():]
                elif op == 0x92:  # NEWOBJ_EX
                    kwargs = stack.pop()
                    args = stack.pop()
                    stack[-1] = self.new(stack[-1], args, kwargs)
                elif op == 0x95:  # FRAME: a length, of no consequence once the whole file is read
                    i += 8
                elif op == 0x80:  # PROTO
                    if not 2 <= data[i] <= 5:
                        raise Refused(f"pickle protocol {data[i]} (DCP writes 2 to 5)")
                    i += 1
                elif op == 0x2E:  # STOP
                    if len(stack) != 1 or marks or i != end:
                        raise Refused("its end leaves more than one object, or bytes after it")
                    return stack[0]
                else:
                    raise Refused(f"opcode {bytes([op])!r}, which DCP's metadata does not use")
                if len(stack) > MAX_STACK:
                    raise Refused(f"more than {MAX_STACK} items on the stack")
        except Refused as e:
            raise Refused(f"{e}, at byte {at}") from None
        except IndexError:
            raise Refused(f"it ends, or its stack or memo runs out, at byte {at} (opcode {bytes([op])!r})") from None
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, UnicodeDecodeError,
                struct.error) as e:
            raise Refused(f"{type(e).__name__} at byte {at} (opcode {bytes([op])!r}): {e}") from None
