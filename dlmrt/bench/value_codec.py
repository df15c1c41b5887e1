"""Values as data: the only thing a HumanEval candidate process sends to its judge.

Standard library only (the sandbox wrapper loads this file by path inside the sandbox). One value
is one JSON document; JSON's own types carry None, bool, int, float (NaN and infinities as
Python's json writes them), str and list; a JSON object is always a tagged container:
{"tuple": [...]}, {"set": [...]}, {"frozenset": [...]}, {"dict": [[key, value], ...]},
{"bytes": "hex"}. Types are checked exactly (`type(v) is int`, never isinstance): an object of any
other class, a subclass included, cannot be encoded, so an object whose `__eq__` is always true
never reaches a comparison. Decoding builds plain built-in values only (no pickle, no classes)
and refuses documents over MAX_BYTES, nested deeper than MAX_DEPTH, or with a set, frozenset or
dict in which more than MAX_SHARED_HASH distinct members (keys) share one hash: such crafted
collisions (e.g. the ints k * (2**61 - 1)) make building it quadratic, hours of the judge's time
at the size limit, and decoding runs outside the judge's deadline. Decoding time stays about
linear in the document's size.
"""

from __future__ import annotations

import json

MAX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 200
MAX_SHARED_HASH = 64  # no plain data comes near it: distinct values rarely share a hash
SCALARS = (type(None), bool, int, float, str)
TAGS = {"tuple": tuple, "set": set, "frozenset": frozenset}


class CodecError(ValueError):
    """A value that is not plain data, or a document that is not one of ours."""


def _pack(v: object, depth: int) -> object:
    if depth > MAX_DEPTH:
        raise CodecError(f"value nested deeper than {MAX_DEPTH}")
    t = type(v)
    if t in SCALARS:
        return v
    if t is list:
        return [_pack(x, depth + 1) for x in v]  # type: ignore[union-attr]
    for tag, cls in TAGS.items():
        if t is cls:
            return {tag: [_pack(x, depth + 1) for x in v]}  # type: ignore[union-attr]
    if t is dict:
        return {"dict": [[_pack(k, depth + 1), _pack(x, depth + 1)] for k, x in v.items()]}  # type: ignore[union-attr]
    if t is bytes:
        return {"bytes": v.hex()}  # type: ignore[union-attr]
    raise CodecError(
        f"a {t.__name__} is not plain data (None, bool, int, float, str, bytes, "
        "list, tuple, set, frozenset, dict)"
    )


def encode(v: object) -> str:
    """One line of JSON for `v`; CodecError for anything but plain built-in data."""
    return json.dumps(_pack(v, 0), separators=(",", ":"))


def _unpack(x: object, depth: int) -> object:
    if depth > MAX_DEPTH:
        raise CodecError(f"document nested deeper than {MAX_DEPTH}")
    if type(x) in SCALARS:
        return x
    if type(x) is list:
        return [_unpack(y, depth + 1) for y in x]
    if type(x) is not dict or len(x) != 1:
        raise CodecError("not a value document")
    ((tag, body),) = x.items()
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise CodecError(f"tag {tag!r} without a list")
    items = [_unpack(y, depth + 1) for y in body]
    if tag in TAGS:
        if tag != "tuple":
            _check_hashes(items, tag)
        return TAGS[tag](items)
    if tag == "dict" and all(type(p) is list and len(p) == 2 for p in items):
        _check_hashes([k for k, _ in items], tag)
        return {k: v for k, v in items}
    raise CodecError(f"unknown tag {tag!r}")


def _check_hashes(members: list[object], tag: str) -> None:
    """CodecError when more than MAX_SHARED_HASH distinct `members` share one hash (each member
    is compared with at most that many others here; building the container then costs as much)."""
    by_hash: dict[int, list[object]] = {}  # hash values are their own distinct hashes
    for x in members:
        group = by_hash.setdefault(hash(x), [])
        if x not in group:  # equal members (1, 1.0, True) are one member of the set
            group.append(x)
            if len(group) > MAX_SHARED_HASH:
                raise CodecError(
                    f"a {tag} with over {MAX_SHARED_HASH} distinct members sharing one hash"
                )


def decode(text: str | bytes) -> object:
    """The value of one document written by `encode`."""
    if len(text) > MAX_BYTES:
        raise CodecError(f"document over {MAX_BYTES} bytes")
    try:
        return _unpack(json.loads(text), 0)
    except CodecError:  # a ValueError too: the unpacker's own, already named
        raise
    except (
        RecursionError,
        ValueError,
        TypeError,
    ) as e:  # JSON errors and over-long ints: ValueError
        raise CodecError(f"not a value document: {type(e).__name__}") from None
