"""One Kafka client connection: frames in, answers out in request order.

Why pipelined and bounded: producers keep up to five requests in flight per connection
(``max.in.flight``), and the protocol requires answers in request order. Each Produce runs
as its own task while the next frames are read, and a writer task sends the answers in
order; at most :data:`MAX_IN_FLIGHT` requests are read ahead, after which the connection
simply stops reading (TCP backpressure), so a client cannot make the ingestor hold more
than that many frames of ``kafka_max_request_bytes`` each.

Where Kafka closes the connection, so does this: a frame over the size limit, a frame that
does not parse, an API or version not served (a consumer's Fetch, a group request), a
failed SASL authentication, a refused acks=0 Produce (no answer can carry its error).
Each is logged with the client's id and counted
(``icefloe_ingest_kafka_closed_total{reason}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable
from typing import Protocol

from icefloe.config import Config
from ingestor.kafka import apis
from ingestor.kafka.apis import RequestHeader
from ingestor.kafka.codes import Code, KafkaError
from ingestor.kafka.produce import Producer
from ingestor.kafka.wire import Malformed, Reader


class Front(Protocol):
    """What a connection needs of the listener (:class:`ingestor.kafka.listener.KafkaFront`)."""

    config: Config

    def closed(self, reason: str) -> None: ...

    async def metadata(self, version: int, request: apis.MetadataRequest,
                       token: str | None, client: str | None = None) -> bytes: ...

    async def init_producer_id(self, version: int,
                               request: apis.InitProducerIdRequest) -> bytes: ...

    async def token_valid(self, token: str, client: str | None) -> bool: ...

    async def produce(self, request: apis.ProduceRequest, producer: Producer
                      ) -> tuple[list[tuple[str, list[apis.PartitionResult]]], int]: ...

log = logging.getLogger("icefloe.ingestor.kafka")
MAX_IN_FLIGHT = 16
"""Requests read ahead of their answers on one connection."""
LINGER_S = 1.0
"""How long a refused connection drains its input before it closes (see ``_linger``)."""


class _Close(Exception):
    """Close the connection (after the answers already queued), for ``reason``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Connection:
    """Reads frames, dispatches them, writes answers in order."""

    def __init__(self, front: Front, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, client: str | None) -> None:
        self.front = front
        self.reader = reader
        self.writer = writer
        self.producer = Producer(None, client)
        self.slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.answers: asyncio.Queue[Awaitable[bytes | None] | None] = asyncio.Queue()
        self.raw_sasl = False
        self.handshaken = False
        """After a v0 SaslHandshake: the next frame is the mechanism's bytes, unframed."""
        self.client_id: str | None = None
        self.answers_stopped = False
        """The writer gave up on a failed answer: nothing more is read or answered."""

    async def run(self) -> None:
        sender = asyncio.create_task(self._send(), name="kafka-send")
        refused = False
        try:
            await self._read()
        except _Close as close:
            refused = True
            self.front.closed(close.reason)
            log.warning("Kafka connection from %s (client id %r) closed: %s",
                        self.producer.client or "?", self.client_id, close)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.answers.put_nowait(None)
            with contextlib.suppress(Exception):
                await sender
            self._abandon_answers()
            if refused:  # let the last answer (a SASL refusal) reach the client
                await self._linger()
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    def _abandon_answers(self) -> None:
        """Answers queued behind a failed one are never written: let each finish (a
        Produce still buffers and flushes what it admitted) and consume its outcome."""
        while not self.answers.empty():
            answer = self.answers.get_nowait()
            if isinstance(answer, asyncio.Future):
                answer.add_done_callback(_consume)

    async def _linger(self) -> None:
        """Read and drop what the client still sends, for up to a second, before closing:
        closing a socket with unread input makes the kernel reset the connection, and a
        reset can destroy the refusal just written before the client reads it."""
        deadline = asyncio.get_running_loop().time() + LINGER_S
        with contextlib.suppress(Exception):
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                if not await asyncio.wait_for(self.reader.read(1 << 16), left):
                    return  # the client closed too

    async def _frame(self) -> bytes | None:
        """The next request frame; None when the client closed or went idle."""
        ing = self.front.config.ingestor
        try:
            size_bytes = await asyncio.wait_for(self.reader.readexactly(4), ing.kafka_idle_s)
        except asyncio.IncompleteReadError:
            return None
        except TimeoutError:
            self.front.closed("idle")
            return None
        size = int.from_bytes(size_bytes, "big", signed=True)
        if size < 8 and not (self.raw_sasl and size >= 0):
            raise _Close("malformed", f"a frame of {size} bytes is shorter than a header")
        if size > ing.kafka_max_request_bytes:
            raise _Close("too_large", f"a request of {size} bytes is over "
                         f"kafka_max_request_bytes ({ing.kafka_max_request_bytes}); "
                         "lower the producer's message.max.bytes / max.request.size")
        try:
            return await asyncio.wait_for(self.reader.readexactly(size), ing.body_timeout_s)
        except TimeoutError:
            raise _Close("slow", f"a {size}-byte request did not arrive within "
                         f"{ing.body_timeout_s:g} s") from None

    async def _read(self) -> None:
        while (frame := await self._frame()) is not None:
            if self.raw_sasl:
                self.raw_sasl = False
                await self._queue(self._raw_sasl(frame))
                continue
            try:
                header, body = apis.read_header(frame)
            except Malformed as exc:
                raise _Close("malformed", f"the request header does not parse: {exc}") \
                    from None
            self.client_id = header.client_id
            await self._dispatch(header, body)

    async def _dispatch(self, header: RequestHeader, body: Reader) -> None:
        key, version = header.api_key, header.version
        low, high = apis.SUPPORTED.get(key, (0, -1))
        if key == apis.API_VERSIONS and not low <= version <= high:
            # the one answer the protocol defines for a version too new: v0, with the list
            await self._answer(dataclasses.replace(header, version=0),
                               apis.api_versions_response(0, Code.UNSUPPORTED_VERSION))
            return
        if not low <= version <= high:
            what = "is not served (icefloe serves the produce path only: ApiVersions, " \
                "Metadata, InitProducerId, Produce, SASL; read what was produced from the " \
                "Iceberg table)" if key not in apis.SUPPORTED \
                else f"v{version} is not served (v{low}-v{high} are)"
            raise _Close("unsupported", f"{apis.api_name(key)} {what}")
        try:
            if key == apis.PRODUCE:
                produce = apis.read_produce(body, version)
                if body.remaining():  # a client bug: never guess what the rest meant
                    raise Malformed(f"{body.remaining()} bytes follow the request")
                await self._queue(self._produce(header, produce))
            elif key == apis.API_VERSIONS:
                await self._answer(header, apis.api_versions_response(version))
            elif key == apis.METADATA:
                request = apis.read_metadata(body, version)
                await self._queue(self._framed(header, self.front.metadata(
                    version, request, self.producer.token, self.producer.client)))
            elif key == apis.INIT_PRODUCER_ID:
                init = apis.read_init_producer_id(body, version)
                await self._queue(self._framed(header, self.front.init_producer_id(
                    version, init)))
            elif key == apis.FIND_COORDINATOR:
                await self._answer(header, self._no_coordinator(header, body))
            else:
                await self._sasl(header, body)
        except Malformed as exc:
            raise _Close("malformed", f"{apis.api_name(key)} v{version} does not parse: "
                         f"{exc}") from None

    def _no_coordinator(self, header: RequestHeader, body: Reader) -> bytes:
        """Consumer groups and transactions are not served: say so in a refusal the
        client does not retry (and log it once per request)."""
        key_type, keys = apis.read_find_coordinator(body, header.version)
        group = key_type == 0
        message = "icefloe serves Kafka producers only: " + (
            "consumer groups are not served (read the stream's Iceberg table)" if group else
            "transactions are not served (unset transactional.id; idempotence alone is "
            "exactly-once into Iceberg)")
        log.warning("Kafka client %r asked for the %s coordinator of %s: %s", self.client_id,
                    "group" if group else "transaction", keys, message)
        code = Code.GROUP_AUTHORIZATION_FAILED if group \
            else Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return apis.find_coordinator_response(header.version, keys, code, message)

    async def _sasl(self, header: RequestHeader, body: Reader) -> None:
        if header.api_key == apis.SASL_HANDSHAKE:
            mechanism = apis.read_sasl_handshake(body)
            ok = mechanism == "PLAIN"
            await self._answer(header, apis.sasl_handshake_response(
                0 if ok else Code.UNSUPPORTED_SASL_MECHANISM, ["PLAIN"]))
            if not ok:
                raise _Close("sasl", f"SASL mechanism {mechanism!r} is not served (PLAIN is; "
                             "SCRAM is not, see docs/kafka.md)")
            self.raw_sasl = header.version == 0
            self.handshaken = True
            return
        if not self.handshaken:  # as a broker: SaslAuthenticate only after a handshake
            await self._answer(header, apis.sasl_authenticate_response(
                header.version, Code.ILLEGAL_SASL_STATE, "SaslAuthenticate before "
                "SaslHandshake"))
            raise _Close("sasl", "SaslAuthenticate before SaslHandshake")
        token = apis.read_sasl_authenticate(body, header.version)
        error = await self._authenticate(token)
        await self._answer(header, apis.sasl_authenticate_response(
            header.version, Code.SASL_AUTHENTICATION_FAILED if error else 0, error))
        if error:
            raise _Close("sasl", error)

    async def _raw_sasl(self, token: bytes) -> bytes | None:
        error = await self._authenticate(token)
        if error:
            self.front.closed("sasl")
            raise ConnectionError(error)
        return (0).to_bytes(4, "big")

    async def _authenticate(self, plain: bytes) -> str | None:
        """A SASL/PLAIN message (``authzid NUL user NUL password``): the password is an
        icefloe stream token. None when it is valid, else why not."""
        parts = plain.split(b"\0")
        if len(parts) != 3 or not parts[2]:
            return "a SASL/PLAIN message is authzid NUL username NUL password"
        try:
            token = parts[2].decode()
        except UnicodeDecodeError:
            return "the SASL/PLAIN password (the stream token) is not UTF-8"
        if not await self.front.token_valid(token, self.producer.client):
            return "authentication failed: the password is not a valid icefloe stream " \
                "token (the username is not checked)"
        self.producer.token = token
        return None

    async def _produce(self, header: RequestHeader, request: apis.ProduceRequest
                       ) -> bytes | None:
        try:
            answers, throttle = await self.front.produce(request, self.producer)
        except KafkaError as error:  # the whole request (transactions, acks)
            answers = [(topic.name, [apis.PartitionResult(p.index, int(error.code),
                                                          message=error.message)
                                     for p in topic.partitions]) for topic in request.topics]
            throttle = 0
        if request.acks == 0:  # by protocol: no answer at all
            self._refused_unanswered(answers)
            return None
        return apis.response_frame(header, apis.produce_response(header.version, answers,
                                                                 throttle))

    def _refused_unanswered(self, answers: list[tuple[str, list[apis.PartitionResult]]]
                            ) -> None:
        """An acks=0 Produce has no answer to carry a refusal, so, as Kafka's broker does,
        close the connection (after the answers before it): the producer sees the close,
        refreshes its metadata and logs it, instead of losing records without a trace."""
        for topic, parts in answers:
            for part in parts:
                if part.error:
                    self.front.closed("acks0_refused")
                    log.warning("Kafka connection from %s (client id %r) closed: an acks=0 "
                                "Produce to %s[%d] was refused (%s: %s)",
                                self.producer.client or "?", self.client_id, topic,
                                part.index, Code(part.error).name, part.message)
                    raise ConnectionError("an acks=0 Produce was refused")

    async def _framed(self, header: RequestHeader, body: Awaitable[bytes]) -> bytes:
        return apis.response_frame(header, await body)

    async def _answer(self, header: RequestHeader, body: bytes) -> None:
        future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        future.set_result(apis.response_frame(header, body))
        await self._queue(future)

    async def _queue(self, answer: Awaitable[bytes | None]) -> None:
        try:
            await self.slots.acquire()
        except BaseException:  # cancelled (the connection ends): the answer never starts
            _never_started(answer)
            raise
        if self.answers_stopped:
            # the writer gave up (a failed answer closed the connection) and frees no more
            # slots: stop reading instead of waiting for one forever
            self.slots.release()
            _never_started(answer)
            raise ConnectionError("the connection's answers stopped")
        task = asyncio.ensure_future(answer)
        self.answers.put_nowait(task)

    async def _send(self) -> None:
        """Write the answers in request order; a failed one (a refused v0 SASL exchange, a
        bug) closes the connection, which ends the reading too."""
        try:
            while (answer := await self.answers.get()) is not None:
                try:
                    data = await answer
                except Exception as exc:
                    if not isinstance(exc, ConnectionError):
                        log.exception("Kafka request failed unexpectedly", exc_info=exc)
                    self.writer.close()
                    return
                finally:
                    self.slots.release()
                if data:
                    self.writer.write(data)
                    await self.writer.drain()
        finally:  # however the writing ends (a failed answer, a reset while draining)
            self.answers_stopped = True
            self.slots.release()  # wakes a reader waiting for a slot, to see it (_queue)


def _never_started(answer: Awaitable[bytes | None]) -> None:
    """Close an answer's coroutine that will never run (no 'never awaited' warning)."""
    if asyncio.iscoroutine(answer):
        answer.close()


def _consume(task: asyncio.Future[bytes | None]) -> None:
    """Retrieve an abandoned answer's outcome, so nothing is logged as never retrieved."""
    if not task.cancelled():
        task.exception()
