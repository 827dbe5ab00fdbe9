"""The stream registry: sources, sinks and their history, versioned in the object store."""

from icefloe.registry.model import Conditions, Registry, Sink, Source, Toggle
from icefloe.registry.store import DEFAULT_KEY, RegistryStore, drift

__all__ = ["DEFAULT_KEY", "Conditions", "Registry", "RegistryStore", "Sink", "Source",
           "Toggle", "drift"]
