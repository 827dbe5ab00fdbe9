"""Write tokens: how they are generated, hashed for the config, and verified.

Why salted, slow hashes: the config file travels (ConfigMaps, CI variables, backups), so it
must not hold anything a reader could replay. It holds ``scrypt`` hashes with a random salt;
a leaked file then costs an attacker a memory-hard search per token (and nothing at all for
the 256-bit tokens ``icefloe token new`` makes). ``pbkdf2-sha256`` hashes are verified
too, for operators whose tooling (FIPS builds, password managers) only makes those.

Formats (base64 without padding)::

    scrypt$ln=14,r=8,p=1$<salt>$<hash>          N = 2**ln, memory 128·r·N bytes
    pbkdf2-sha256$<iterations>$<salt>$<hash>

Verifying costs ~70 ms for the default scrypt parameters, which is why the ingestor caches
the outcome per distinct token (:mod:`ingestor.auth`) and never hashes on its event loop.
Nothing in this module ever puts a token, or any part of one, into an error message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass

TOKEN_PREFIX = "ifl_"
"""Generated tokens start with this, so secret scanners and people can recognise them."""
TOKEN_BYTES = 32
SALT_BYTES = 16
HASH_BYTES = 32
SCRYPT_LOG2_N = 14
SCRYPT_R = 8
SCRYPT_P = 1
_MAX_SCRYPT_MEMORY = 256 * 1024 * 1024
_PBKDF2_ITERATIONS = (10_000, 10_000_000)
_MAX_TOKEN_BYTES = 4096


class TokenHashError(ValueError):
    """A config entry is not a token hash icefloe can verify; the message says why."""


def new_token() -> str:
    """A fresh write token: ``ifl_`` and 43 URL-safe characters (256 random bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise TokenHashError(f"the {what} is not base64") from None


@dataclass(frozen=True, slots=True)
class TokenHash:
    """One parsed hash line; :meth:`verify` checks a presented token against it."""

    algorithm: str
    salt: bytes
    digest: bytes
    log2_n: int = 0
    r: int = 0
    p: int = 0
    iterations: int = 0

    def derive(self, token: str) -> bytes:
        """The hash of ``token`` under this entry's salt and parameters (slow on purpose)."""
        data = token.encode("utf-8", "surrogatepass")
        if self.algorithm == "scrypt":
            return hashlib.scrypt(data, salt=self.salt, n=1 << self.log2_n, r=self.r,
                                  p=self.p, dklen=len(self.digest),
                                  maxmem=_MAX_SCRYPT_MEMORY + 1024 * 1024)
        return hashlib.pbkdf2_hmac("sha256", data, self.salt, self.iterations,
                                   dklen=len(self.digest))

    def verify(self, token: str) -> bool:
        """True if ``token`` hashes to this entry (constant-time comparison)."""
        if not token or len(token) > _MAX_TOKEN_BYTES:
            return False
        return hmac.compare_digest(self.derive(token), self.digest)


def hash_token(token: str, *, log2_n: int = SCRYPT_LOG2_N) -> str:
    """The config line for ``token``: ``scrypt$ln=14,r=8,p=1$<salt>$<hash>``.

    Raises:
        ValueError: the token is empty, too long, or has surrounding whitespace (it would
            never match what an ``Authorization`` header carries).
    """
    check_token_text(token)
    entry = TokenHash("scrypt", secrets.token_bytes(SALT_BYTES), b"\0" * HASH_BYTES,
                      log2_n=log2_n, r=SCRYPT_R, p=SCRYPT_P)
    digest = entry.derive(token)
    return f"scrypt$ln={log2_n},r={SCRYPT_R},p={SCRYPT_P}${_b64(entry.salt)}${_b64(digest)}"


def check_token_text(token: str) -> None:
    """Refuse tokens that could never be presented as ``Authorization: Bearer <token>``."""
    if not token:
        raise ValueError("the token is empty")
    if token != token.strip() or any(c.isspace() for c in token):
        raise ValueError("the token contains whitespace")
    if len(token.encode("utf-8", "surrogatepass")) > _MAX_TOKEN_BYTES:
        raise ValueError(f"the token is longer than {_MAX_TOKEN_BYTES} bytes")
    if not token.isprintable() or not token.isascii():
        raise ValueError("the token must be printable ASCII (it travels in an HTTP header)")


def looks_hashed(text: str) -> bool:
    """Whether ``text`` claims to be a hash line (the caller still parses it)."""
    return text.startswith(("scrypt$", "pbkdf2-sha256$"))


def parse_hash(text: str) -> TokenHash:
    """Parse a hash line.

    Raises:
        TokenHashError: not a supported hash line, or its parameters are out of bounds;
            the message never repeats the text (it may be a token pasted by mistake).
    """
    parts = text.split("$")
    if parts[0] == "scrypt" and len(parts) == 4:
        return _parse_scrypt(parts[1], parts[2], parts[3])
    if parts[0] == "pbkdf2-sha256" and len(parts) == 4:
        return _parse_pbkdf2(parts[1], parts[2], parts[3])
    raise TokenHashError("not a token hash (expected 'scrypt$ln=..,r=..,p=..$<salt>$<hash>' "
                         "or 'pbkdf2-sha256$<iterations>$<salt>$<hash>')")


def _parse_scrypt(params: str, salt: str, digest: str) -> TokenHash:
    try:
        values = dict(item.split("=", 1) for item in params.split(","))
        log2_n, r, p = int(values["ln"]), int(values["r"]), int(values["p"])
    except (KeyError, ValueError):
        raise TokenHashError("scrypt parameters must read 'ln=<int>,r=<int>,p=<int>'") \
            from None
    if not (10 <= log2_n <= 20 and 1 <= r <= 32 and 1 <= p <= 16):
        raise TokenHashError("scrypt parameters out of range (ln 10-20, r 1-32, p 1-16)")
    if 128 * r * (1 << log2_n) > _MAX_SCRYPT_MEMORY:
        raise TokenHashError("scrypt parameters need more than 256 MiB per verification")
    return TokenHash("scrypt", _salt(salt), _digest(digest), log2_n=log2_n, r=r, p=p)


def _parse_pbkdf2(iterations: str, salt: str, digest: str) -> TokenHash:
    try:
        count = int(iterations)
    except ValueError:
        raise TokenHashError("pbkdf2-sha256 iterations must be an integer") from None
    low, high = _PBKDF2_ITERATIONS
    if not low <= count <= high:
        raise TokenHashError(f"pbkdf2-sha256 iterations must be {low:,}-{high:,}")
    return TokenHash("pbkdf2-sha256", _salt(salt), _digest(digest), iterations=count)


def _salt(text: str) -> bytes:
    salt = _unb64(text, "salt")
    if len(salt) < 8:
        raise TokenHashError("the salt is shorter than 8 bytes")
    return salt


def _digest(text: str) -> bytes:
    digest = _unb64(text, "hash")
    if not 16 <= len(digest) <= 64:
        raise TokenHashError("the hash must be 16-64 bytes")
    return digest
