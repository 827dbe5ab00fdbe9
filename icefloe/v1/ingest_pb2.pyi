from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Event(_message.Message):
    __slots__ = ("json", "event_id", "data")
    JSON_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    json: bytes
    event_id: str
    data: bytes
    def __init__(self, json: _Optional[bytes] = ..., event_id: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("stream", "events", "request_id")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    stream: str
    events: _containers.RepeatedCompositeFieldContainer[Event]
    request_id: str
    def __init__(self, stream: _Optional[str] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("accepted", "request_id", "error", "dead_lettered")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    request_id: str
    error: _status_pb2.Status
    dead_lettered: int
    def __init__(self, accepted: _Optional[int] = ..., request_id: _Optional[str] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., dead_lettered: _Optional[int] = ...) -> None: ...
