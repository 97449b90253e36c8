from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ONLINE: _ClassVar[Priority]
    BATCH: _ClassVar[Priority]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUCCESS: _ClassVar[Status]
    FAIL: _ClassVar[Status]
    TIMEOUT: _ClassVar[Status]

class TicketState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PENDING: _ClassVar[TicketState]
    DONE: _ClassVar[TicketState]
    UNKNOWN: _ClassVar[TicketState]
ONLINE: Priority
BATCH: Priority
SUCCESS: Status
FAIL: Status
TIMEOUT: Status
PENDING: TicketState
DONE: TicketState
UNKNOWN: TicketState

class ReachCall(_message.Message):
    __slots__ = ("request_id", "capability", "action", "payload", "session_id", "tenant", "idempotency_key", "deadline_ms", "intent", "priority", "scope_tags", "media")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SCOPE_TAGS_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    capability: str
    action: str
    payload: bytes
    session_id: str
    tenant: str
    idempotency_key: str
    deadline_ms: int
    intent: str
    priority: Priority
    scope_tags: _containers.RepeatedScalarFieldContainer[str]
    media: _containers.RepeatedCompositeFieldContainer[Media]
    def __init__(self, request_id: _Optional[str] = ..., capability: _Optional[str] = ..., action: _Optional[str] = ..., payload: _Optional[bytes] = ..., session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., deadline_ms: _Optional[int] = ..., intent: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., scope_tags: _Optional[_Iterable[str]] = ..., media: _Optional[_Iterable[_Union[Media, _Mapping]]] = ...) -> None: ...

class Media(_message.Message):
    __slots__ = ("media_type", "data", "url", "name")
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    media_type: str
    data: bytes
    url: str
    name: str
    def __init__(self, media_type: _Optional[str] = ..., data: _Optional[bytes] = ..., url: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("type", "message", "retry_after")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    retry_after: float
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ..., retry_after: _Optional[float] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("request_id", "status", "data", "error", "agent", "instance", "attempts", "cost_ms", "context_restore", "degraded", "media")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    COST_MS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_RESTORE_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status: Status
    data: bytes
    error: Error
    agent: str
    instance: str
    attempts: int
    cost_ms: float
    context_restore: bool
    degraded: bool
    media: _containers.RepeatedCompositeFieldContainer[Media]
    def __init__(self, request_id: _Optional[str] = ..., status: _Optional[_Union[Status, str]] = ..., data: _Optional[bytes] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., agent: _Optional[str] = ..., instance: _Optional[str] = ..., attempts: _Optional[int] = ..., cost_ms: _Optional[float] = ..., context_restore: _Optional[bool] = ..., degraded: _Optional[bool] = ..., media: _Optional[_Iterable[_Union[Media, _Mapping]]] = ...) -> None: ...

class Backpressure(_message.Message):
    __slots__ = ("retry_after", "reason", "queue_depth", "queue_capacity")
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    retry_after: float
    reason: str
    queue_depth: int
    queue_capacity: int
    def __init__(self, retry_after: _Optional[float] = ..., reason: _Optional[str] = ..., queue_depth: _Optional[int] = ..., queue_capacity: _Optional[int] = ...) -> None: ...

class CallReply(_message.Message):
    __slots__ = ("result", "backpressure")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    BACKPRESSURE_FIELD_NUMBER: _ClassVar[int]
    result: Result
    backpressure: Backpressure
    def __init__(self, result: _Optional[_Union[Result, _Mapping]] = ..., backpressure: _Optional[_Union[Backpressure, _Mapping]] = ...) -> None: ...

class MediaStart(_message.Message):
    __slots__ = ("media_type", "name", "size", "url")
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    media_type: str
    name: str
    size: int
    url: str
    def __init__(self, media_type: _Optional[str] = ..., name: _Optional[str] = ..., size: _Optional[int] = ..., url: _Optional[str] = ...) -> None: ...

class StreamReply(_message.Message):
    __slots__ = ("data", "end", "error", "backpressure", "media_start", "media_chunk", "media_end")
    DATA_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BACKPRESSURE_FIELD_NUMBER: _ClassVar[int]
    MEDIA_START_FIELD_NUMBER: _ClassVar[int]
    MEDIA_CHUNK_FIELD_NUMBER: _ClassVar[int]
    MEDIA_END_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    end: bool
    error: Error
    backpressure: Backpressure
    media_start: MediaStart
    media_chunk: bytes
    media_end: bool
    def __init__(self, data: _Optional[bytes] = ..., end: _Optional[bool] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., backpressure: _Optional[_Union[Backpressure, _Mapping]] = ..., media_start: _Optional[_Union[MediaStart, _Mapping]] = ..., media_chunk: _Optional[bytes] = ..., media_end: _Optional[bool] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("call", "callback")
    CALL_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_FIELD_NUMBER: _ClassVar[int]
    call: ReachCall
    callback: str
    def __init__(self, call: _Optional[_Union[ReachCall, _Mapping]] = ..., callback: _Optional[str] = ...) -> None: ...

class Ticket(_message.Message):
    __slots__ = ("ticket", "node")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ticket: str
    node: str
    def __init__(self, ticket: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("ticket", "backpressure")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    BACKPRESSURE_FIELD_NUMBER: _ClassVar[int]
    ticket: Ticket
    backpressure: Backpressure
    def __init__(self, ticket: _Optional[_Union[Ticket, _Mapping]] = ..., backpressure: _Optional[_Union[Backpressure, _Mapping]] = ...) -> None: ...

class ResultRequest(_message.Message):
    __slots__ = ("ticket", "wait_ms")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    ticket: str
    wait_ms: int
    def __init__(self, ticket: _Optional[str] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class ResultReply(_message.Message):
    __slots__ = ("state", "result")
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    state: TicketState
    result: Result
    def __init__(self, state: _Optional[_Union[TicketState, str]] = ..., result: _Optional[_Union[Result, _Mapping]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("ticket", "result")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ticket: str
    result: Result
    def __init__(self, ticket: _Optional[str] = ..., result: _Optional[_Union[Result, _Mapping]] = ...) -> None: ...

class DeliveryAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
