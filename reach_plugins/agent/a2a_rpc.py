"""The A2A server's JSON-RPC 2.0 envelope, read strictly, and its error answers with ``google.rpc.ErrorInfo``.

A request is an object with ``"jsonrpc": "2.0"``, a string ``method``, an
``id`` that is a string, an integer or null, and ``params`` an object when
given; anything else is ``-32600`` (answered with the request's ``id`` when
that id itself is valid). Every A2A error (-32001..-32009) carries in
``error.data`` an ``ErrorInfo`` naming its reason in the ``a2a-protocol.org``
domain, as the A2A spec's section 5.4 asks; the HTTP+JSON binding answers the
same errors with their HTTP status (:attr:`RpcError.http_status`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from reach_plugins.errors import ReachError, UnsupportedMediaType

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = -32700, -32600, -32601, -32602, -32603
TASK_NOT_FOUND, NOT_CANCELABLE, PUSH_NOT_SUPPORTED, UNSUPPORTED = -32001, -32002, -32003, -32004
CONTENT_TYPE, INVALID_AGENT_RESPONSE, EXTENDED_CARD, EXTENSION_REQUIRED, VERSION = (
    -32005,
    -32006,
    -32007,
    -32008,
    -32009,
)
ERROR_DOMAIN: Final = "a2a-protocol.org"
ERROR_INFO: Final = "type.googleapis.com/google.rpc.ErrorInfo"

_KINDS: dict[int, tuple[str | None, int, str]] = {
    PARSE_ERROR: (None, 400, "INVALID_ARGUMENT"),
    INVALID_REQUEST: (None, 400, "INVALID_ARGUMENT"),
    METHOD_NOT_FOUND: (None, 404, "NOT_FOUND"),
    INVALID_PARAMS: (None, 400, "INVALID_ARGUMENT"),
    INTERNAL: (None, 500, "INTERNAL"),
    TASK_NOT_FOUND: ("TASK_NOT_FOUND", 404, "NOT_FOUND"),
    NOT_CANCELABLE: ("TASK_NOT_CANCELABLE", 409, "FAILED_PRECONDITION"),
    PUSH_NOT_SUPPORTED: ("PUSH_NOTIFICATION_NOT_SUPPORTED", 400, "UNIMPLEMENTED"),
    UNSUPPORTED: ("UNSUPPORTED_OPERATION", 400, "UNIMPLEMENTED"),
    CONTENT_TYPE: ("CONTENT_TYPE_NOT_SUPPORTED", 415, "INVALID_ARGUMENT"),
    INVALID_AGENT_RESPONSE: ("INVALID_AGENT_RESPONSE", 502, "INTERNAL"),
    EXTENDED_CARD: ("EXTENDED_AGENT_CARD_NOT_CONFIGURED", 400, "FAILED_PRECONDITION"),
    EXTENSION_REQUIRED: ("EXTENSION_SUPPORT_REQUIRED", 400, "FAILED_PRECONDITION"),
    VERSION: ("VERSION_NOT_SUPPORTED", 400, "UNIMPLEMENTED"),
}
"""Each code's ErrorInfo reason (A2A errors only), HTTP status and ``google.rpc.Code`` name (spec 5.4)."""


class RpcError(Exception):
    """An A2A error answer: its JSON-RPC code, what to fix, and what ErrorInfo and HTTP status it maps to."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return _KINDS.get(self.code, _KINDS[INTERNAL])[1]

    @property
    def status_name(self) -> str:
        return _KINDS.get(self.code, _KINDS[INTERNAL])[2]

    def details(self) -> list[dict[str, Any]]:
        """``[ErrorInfo]`` for an A2A error, ``[]`` for a plain JSON-RPC one."""
        reason = _KINDS.get(self.code, _KINDS[INTERNAL])[0]
        if reason is None:
            return []
        return [{"@type": ERROR_INFO, "reason": reason, "domain": ERROR_DOMAIN, "metadata": {}}]

    def error(self) -> dict[str, Any]:
        """The JSON-RPC ``error`` member."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        details = self.details()
        if details:
            error["data"] = details
        return error


@dataclass(frozen=True, slots=True)
class Call:
    """One JSON-RPC request that passed the envelope's checks."""

    id: str | int | None
    method: str
    params: Mapping[str, Any]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def proto_names(params: Mapping[str, Any]) -> dict[str, Any]:
    """Params with ProtoJSON's other spelling read too: ``history_length`` is ``historyLength`` (ProtoJSON
    parsers accept a field's proto name as well), at the top and in ``message`` / ``configuration``."""
    named = {_camel(key): value for key, value in params.items()}
    for inner in ("message", "configuration"):
        if isinstance(named.get(inner), Mapping):
            named[inner] = {_camel(key): value for key, value in named[inner].items()}
    return named


def _valid_id(value: Any) -> bool:
    return value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def request_id(body: Any) -> str | int | None:
    """The id to answer a refused request with: its own when valid, else null (JSON-RPC 2.0, section 5)."""
    if isinstance(body, Mapping) and _valid_id(body.get("id")):
        found: str | int | None = body.get("id")
        return found
    return None


def read_call(body: Any) -> Call:
    """The request in ``body``; :class:`RpcError` (-32600) naming the first rule of JSON-RPC 2.0 it breaks."""
    if not isinstance(body, Mapping):
        raise RpcError(INVALID_REQUEST, "a JSON-RPC request must be a JSON object (batches are not served)")
    if body.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'a JSON-RPC request must carry "jsonrpc": "2.0"')
    if "id" in body and not _valid_id(body["id"]):
        raise RpcError(INVALID_REQUEST, "the request id must be a string, an integer or null")
    method = body.get("method")
    if not isinstance(method, str) or not method:
        raise RpcError(INVALID_REQUEST, "the request must name its method (a string)")
    params = body.get("params", {})
    if not isinstance(params, Mapping):
        raise RpcError(INVALID_PARAMS, "params must be a JSON object")
    return Call(body.get("id"), method, proto_names(params))


def layer_error(exc: ReachError, stage: str) -> RpcError:
    """A refusal of the server layer as an A2A error: a body not declared JSON is ContentTypeNotSupported
    (-32005), one that does not parse -32700, any other (auth, size, time) -32600."""
    if isinstance(exc, UnsupportedMediaType):
        return RpcError(CONTENT_TYPE, exc.message)
    return RpcError(PARSE_ERROR if stage == "parse" else INVALID_REQUEST, exc.message)


def answer(rpc_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": result}


def failure(rpc_id: Any, exc: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "error": exc.error()}
