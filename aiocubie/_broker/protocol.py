"""The broker's wire format: length-prefixed JSON messages, checked field by field.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON holding one object with
an ``op``. Every message a peer sends is checked here (:func:`check`) before anything acts on it;
a message that fails is a :class:`ProtocolError` and ends that connection. No I/O (the channel
does it); no pickle.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Final

from .._errors import AiocubieError, shown

__all__ = ["HEADER", "MAX_FRAME", "VERSION", "ProtocolError", "check", "decode", "encode"]

#: The protocol's version: a hello of another version is refused (and says which it speaks).
VERSION: Final = 1
#: The largest frame either side accepts, in bytes (a status of many clients fits).
MAX_FRAME: Final = 1 << 20
#: A frame's header: the length of its body.
HEADER: Final = struct.Struct(">I")
_JSON = json.JSONEncoder(separators=(",", ":"))  # made once: json.dumps makes one per call given separators

#: Each op a peer may send: its fields and their types (ints are never bools).
SCHEMAS: Final[dict[str, dict[str, type]]] = {
    # client -> broker
    "hello": {"v": int, "role": str, "pid": int, "name": str, "hold": int},
    "lease": {"id": int, "min": int, "want": int, "wait": bool, "priority": int},
    "cancel": {"id": int},
    "return": {"bytes": int},
    "status": {},
    # broker -> client
    "welcome": {"v": int, "budget": int, "slab": int, "device": int},
    "refused": {"v": int, "reason": str},
    "granted": {"id": int, "bytes": int},
    "denied": {"id": int, "reason": str},
    "pressure": {"on": bool},
    "reclaim": {},
    "report": {"status": dict},
}
_ROLES = ("client", "status")


class ProtocolError(AiocubieError):
    """A peer sent a frame or message outside the protocol (the connection is closed)."""


def encode(message: dict[str, Any]) -> bytes:
    """``message`` as one frame: its length, then its JSON."""
    body = _JSON.encode(message).encode()
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    """The message in a frame's ``body``, checked (see :func:`check`)."""
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    return check(message)


def check(message: object) -> dict[str, Any]:
    """``message`` if it is an object of a known op with each field of its type; else :class:`ProtocolError`.

    Examples
    --------
    >>> check({"op": "cancel", "id": 3})
    {'op': 'cancel', 'id': 3}
    >>> check({"op": "cancel", "id": True})
    Traceback (most recent call last):
    ...
    aiocubie._broker.protocol.ProtocolError: field 'id' of 'cancel' must be int, got bool
    """
    if not isinstance(message, dict):
        raise ProtocolError(f"a message is a JSON object, got {type(message).__name__}")
    op = message.get("op")
    schema = SCHEMAS.get(op) if isinstance(op, str) else None
    if schema is None:
        raise ProtocolError(f"unknown op {str(op)[:40]!r}")
    for field, kind in schema.items():
        value = message.get(field)
        if type(value) is not kind:  # exact: a bool is no int here
            raise ProtocolError(f"field {field!r} of {op!r} must be {kind.__name__}, got {type(value).__name__}")
        if isinstance(value, int) and not isinstance(value, bool):
            low, high = (-(1 << 31), 1 << 31) if field == "priority" else (0, 1 << 62)
            if not low <= value < high:
                raise ProtocolError(f"field {field!r} of {op!r} is out of range: {shown(value)}")
    if op == "hello" and message["role"] not in _ROLES:
        raise ProtocolError(f"role must be one of {_ROLES}, got {message['role'][:20]!r}")
    if op == "lease" and message["min"] > message["want"]:
        raise ProtocolError(f"lease asks for min {message['min']} over want {message['want']}")
    return message
