"""Python model classes as streams (#39 item 4): ``icefloe.define(Order, stream=..., table=...)``.

A ``@dataclass`` or pydantic model becomes a stream definition (columns, primary key,
docs) that can be written to ``icefloe.toml`` (:meth:`ModelStream.to_toml`), created or
evolved through the admin API (:meth:`ModelStream.register`), and fed by a typed client
(:meth:`ModelStream.client`). Why in the core: producers import it without the servers;
it needs only msgspec, and httpx/grpc (the ingest client's) once a client is made.

Parts: :mod:`~icefloe.pymodels.fields` (annotation → column type and encoder),
:mod:`~icefloe.pymodels.stream` (``define``, TOML), :mod:`~icefloe.pymodels.register`
(the admin API and the evolution rules), :mod:`~icefloe.pymodels.client` (sending).
"""

from icefloe.pymodels.fields import KEY, Key, Precision
from icefloe.pymodels.stream import ModelStream, define

__all__ = ["KEY", "Key", "ModelStream", "Precision", "define"]
