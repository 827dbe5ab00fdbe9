"""A read-only pyiceberg FileIO for local files, with nothing to import but the stdlib.

Why: pyiceberg's own FileIO for ``file://`` is its pyarrow one, whose module imports
``pyarrow.dataset`` and with it pandas (~0.7 s of a cold process). ``icefloe query`` only
reads table metadata and manifests through a FileIO (DuckDB reads the data files), so for
a local warehouse this one does. Paths mean what they mean to pyiceberg's pyarrow FileIO:
``file://host/p`` is ``host/p``, a bare path is made absolute, nothing is unquoted.
"""

from __future__ import annotations

import os
from typing import IO

from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile

from pipeline.read.paths import local_path

__all__ = ["LocalInputFile", "LocalReadFileIO", "local_path"]


class LocalInputFile(InputFile):
    """One local file, opened for reading."""

    def __init__(self, location: str, path: str) -> None:
        super().__init__(location)
        self._path = path

    def __len__(self) -> int:
        return os.path.getsize(self._path)

    def exists(self) -> bool:
        return os.path.isfile(self._path)

    def open(self, seekable: bool = True) -> InputStream:
        handle: IO[bytes] = open(self._path, "rb")  # noqa: SIM115 - the caller closes it
        return handle


class LocalReadFileIO(FileIO):
    """Reads local files; refuses to write or delete (queries never do)."""

    def new_input(self, location: str) -> InputFile:
        path = local_path(location)
        if path is None:
            raise ValueError(f"{location}: not a local file (LocalReadFileIO reads only those)")
        return LocalInputFile(location, path)

    def new_output(self, location: str) -> OutputFile:
        raise PermissionError(f"{location}: icefloe query's file IO is read-only")

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise PermissionError(f"{location}: icefloe query's file IO is read-only")
