"""Who may speak on the supervisors' link (supervisor/peers.py): a secret per launch, proven by
challenge-response, and every later message authenticated. Standard library only.

Why: node 0's supervisor listens on every interface, and everything a hello used to carry is public (the
job id is in `squeue`, the generation is a counter, the hub port is in the lease). Anyone who could reach
the port could join as node k before the real one, drop the connection (every survivor stops, 77), or
say goodbye with a code that ends the job.

The secret: 32 random bytes node 0 draws for each launch and writes to the run directory's
`node-link.key` (mode 0600, replaced atomically, never through a symlink) once it holds the run
directory lease and before its first attempt; the other nodes read it when the lease names this launch.
All nodes of a job share the run directory already (checkpoints, the lease) -- under SLURM, every node of
the allocation -- so no new channel is needed; who cannot read the job owner's 0600 file cannot speak.
A key file that others could read or that is not the job owner's is refused (exit 3): its secret is not
one. The file names its job and launch: a node never uses the key of another launch.

The handshake, one line each (after the challenge every line is `HEX_MAC SP JSON`, and the MAC is
checked before a byte of the JSON is parsed):
  node 0 -> node k   {"type": "challenge", "nonce": Nh}            fresh random per connection
  node k -> node 0   HMAC(K, "hello" Nh body)  body: hello with node, nnodes, job, generation, host, Nm
  node 0 -> node k   sealed welcome (or sealed reject)              proves node 0 holds K too
then every message in both directions is sealed: HMAC under a key of this connection and direction,
derived from K and both nonces, over a sequence number and the body; a message out of sequence, under the
other direction's key or another connection's fails. The secret itself never goes on the wire; a
recorded hello is worthless on any other connection (another Nh).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from truestep.core.errors import RefusedError
from truestep.core.fsio import atomic_write, open_regular
from truestep.core.names import LINK_KEY_FILE

KEY_BYTES = 32
NONCE_BYTES = 16
KEY_FILE_LIMIT = 4096
MAC_HEX = 2 * hashlib.sha256().digest_size


class LinkAuthError(ValueError):
    """A line that is not authenticated, out of sequence, or not a well-formed message."""


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def key_path(run_dir: Path) -> Path:
    return run_dir / LINK_KEY_FILE


def write_key(run_dir: Path, job: str, generation: str, key: bytes) -> None:
    """Node 0: publish this launch's secret for the job's other nodes (0600, atomic, no symlink)."""
    record = {"job": job, "generation": generation, "key": key.hex()}
    atomic_write(key_path(run_dir), json.dumps(record).encode(), mode=0o600)


def read_key(run_dir: Path, job: str, generation: str) -> bytes | None:
    """The secret node 0 published for this launch of this job; None while there is none (not written
    yet, or still the last launch's). RefusedError when the file is not a secret: readable by others,
    not the job owner's, not a regular file, or malformed."""
    path = key_path(run_dir)
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise RefusedError(f"the node link key {path} cannot be used: {err}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise RefusedError(
                f"the node link key {path} is not a secret (owner uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):o}; it must be this user's and 0600): refusing to trust a link "
                "others may speak on"
            )
        data = f.read(KEY_FILE_LIMIT + 1)
    try:
        record = json.loads(data) if len(data) <= KEY_FILE_LIMIT else None
        key = bytes.fromhex(record["key"]) if isinstance(record, dict) else b""
    except (ValueError, KeyError, TypeError, RecursionError):
        key = b""
    if len(key) != KEY_BYTES:
        raise RefusedError(f"the node link key {path} is malformed: not written by truestep launch")
    if (record.get("job"), record.get("generation")) != (job, generation):
        return None  # another launch's: node 0 of this one has not published yet
    return key


def remove_key(run_dir: Path, key: bytes) -> None:
    """Node 0 at its end: remove the key file if it still holds this launch's secret."""
    path = key_path(run_dir)
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            record = json.loads(f.read(KEY_FILE_LIMIT + 1))
        if isinstance(record, dict) and record.get("key") == key.hex():
            path.unlink()
    except (OSError, ValueError, RecursionError):
        return  # gone, replaced by a newer launch's, or not ours: leave it


def _mac(key: bytes, *parts: bytes) -> str:
    return hmac.new(key, b"\0".join(parts), hashlib.sha256).hexdigest()


def _split(line: bytes) -> tuple[str, bytes]:
    mac, sep, body = line.partition(b" ")
    if not sep or len(mac) != MAC_HEX:
        raise LinkAuthError("not an authenticated line")
    return mac.decode("ascii", "replace"), body


def _parse(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as err:  # RecursionError: deeply nested (only after the MAC)
        raise LinkAuthError(f"not JSON: {type(err).__name__}") from None
    if not isinstance(message, dict):
        raise LinkAuthError("not a JSON object")
    return message


def challenge_line(nonce: str) -> bytes:
    return (json.dumps({"type": "challenge", "nonce": nonce}) + "\n").encode()


def read_challenge(line: bytes) -> str:
    """The hub's nonce from its (unauthenticated) challenge line."""
    message = _parse(line)
    nonce = message.get("nonce")
    if message.get("type") != "challenge" or not isinstance(nonce, str) or len(nonce) != 2 * NONCE_BYTES:
        raise LinkAuthError("not a challenge")
    return nonce


def hello_line(key: bytes, challenge: str, hello: dict[str, Any]) -> bytes:
    body = json.dumps(hello).encode()
    return _mac(key, b"hello", challenge.encode(), body).encode() + b" " + body + b"\n"


def open_hello(key: bytes, challenge: str, line: bytes) -> dict[str, Any]:
    """The hello on `line` if it proves `key` for this connection's `challenge`; LinkAuthError if not."""
    mac, body = _split(line)
    if not hmac.compare_digest(mac, _mac(key, b"hello", challenge.encode(), body)):
        raise LinkAuthError("the hello does not prove this launch's key")
    hello = _parse(body)
    if not isinstance(hello.get("nonce"), str) or len(hello["nonce"]) != 2 * NONCE_BYTES:
        raise LinkAuthError("a hello without its nonce")
    return hello


class Channel:
    """The authenticated messages of one connection, one side's view: `seal` what it sends, `open` what it
    receives; each direction has its own key (derived from K and both nonces) and sequence."""

    def __init__(self, key: bytes, hub_nonce: str, member_nonce: str, is_hub: bool) -> None:
        session = hmac.new(key, b"session\0" + hub_nonce.encode() + b"\0" + member_nonce.encode(), "sha256")
        to_member = hmac.new(session.digest(), b"hub->member", "sha256").digest()
        to_hub = hmac.new(session.digest(), b"member->hub", "sha256").digest()
        self._send_key, self._receive_key = (to_member, to_hub) if is_hub else (to_hub, to_member)
        self._sent = 0
        self._received = 0

    def seal(self, message: dict[str, Any]) -> bytes:
        """Not thread-safe: the caller serialises sends (peers.py: the connection's send lock)."""
        body = json.dumps(message).encode()
        mac = _mac(self._send_key, str(self._sent).encode(), body)
        self._sent += 1
        return mac.encode() + b" " + body + b"\n"

    def open(self, line: bytes) -> dict[str, Any]:
        mac, body = _split(line)
        if not hmac.compare_digest(mac, _mac(self._receive_key, str(self._received).encode(), body)):
            raise LinkAuthError(
                f"message {self._received} is not authenticated (forged, replayed or reordered)"
            )
        self._received += 1
        return _parse(body)
