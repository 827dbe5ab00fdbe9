"""CRC32C, the checksum S3 verifies on upload and icefloe records per batch file.

Why CRC32C: S3 accepts it as ``x-amz-checksum-crc32c`` and checks it server side, and the
``google-crc32c`` C extension computes it at several GB/s, so checksumming every batch costs
nothing next to zstd.
"""

from __future__ import annotations

import base64

import google_crc32c


def crc32c(data: bytes) -> int:
    """CRC32C of ``data`` as an unsigned 32-bit int."""
    return int(google_crc32c.value(data))


def crc32c_b64(data: bytes) -> str:
    """CRC32C in the base64 big-endian form S3's ``ChecksumCRC32C`` expects."""
    return base64.b64encode(crc32c(data).to_bytes(4, "big")).decode("ascii")
