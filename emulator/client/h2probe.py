"""`cmemu-probe HOST:PORT`: a gRPC health check (grpc.health.v1.Health/Check) in the standard
library alone, for container healthchecks.

Why not `cmemu probe`: a healthcheck runs every interval in every container, and `cmemu probe`
imports grpcio and the emulator (about 0.65 s of CPU): 627 containers would spend cores on it.
This module imports only socket and struct, and speaks the little of HTTP/2 one unary call
needs: the preface, SETTINGS (and their ACK), one HEADERS frame of literal fields (HPACK without
indexing or Huffman coding, which every decoder accepts), one DATA frame, then it reads frames
until the reply's DATA (the HealthCheckResponse) or the end of the stream. It speaks plaintext
only; a TLS deployment probes with `cmemu probe --cacert`.

Exit codes are grpc_health_probe's and `cmemu probe`'s: 0 SERVING, 4 not SERVING (or the call
failed: an unknown service is NOT_FOUND), 3 unreachable.
"""

from __future__ import annotations

import socket
import struct
import sys

SERVING, NOT_SERVING_EXIT, UNREACHABLE_EXIT = 0, 4, 3
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
STREAM = 1
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
MAX_FRAMES = 64  # a unary reply is a handful of frames; more means something else answers


class ProbeError(Exception):
    """The call did not complete: a reset, a GOAWAY, a stream that ended without a reply."""


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _length(n: int, prefix_bits: int = 7) -> bytes:
    """An HPACK integer with a `prefix_bits` prefix (the H bit, Huffman, left 0)."""
    top = (1 << prefix_bits) - 1
    if n < top:
        return bytes([n])
    out, n = bytearray([top]), n - top
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A literal header field without indexing, new name (RFC 7541 6.2.2)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + _length(len(n)) + n + _length(len(v)) + v


def request(authority: str, service: str, path: str = "/grpc.health.v1.Health/Check") -> bytes:
    """Everything the client sends: preface, SETTINGS, HEADERS, DATA (END_STREAM)."""
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    block = b"".join(_literal(k, v) for k, v in fields)
    name = service.encode()
    message = (b"\x0a" + _length(len(name)) + name) if name else b""  # field 1, a string
    grpc_frame = b"\x00" + struct.pack(">I", len(message)) + message
    return (
        PREFACE
        + frame(SETTINGS, 0, 0)
        + frame(HEADERS, END_HEADERS, STREAM, block)
        + frame(DATA, END_STREAM, STREAM, grpc_frame)
    )


def _read_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ProbeError("the server closed the connection")
        out += chunk
    return bytes(out)


def status_of(message: bytes) -> int:
    """The `status` (field 1, a varint) of a HealthCheckResponse; 0 (UNKNOWN) when absent."""
    i = 0
    while i < len(message):
        key = message[i]
        i += 1
        if key != 0x08:
            raise ProbeError(f"unexpected field 0x{key:02x} in the reply")
        value = shift = 0
        while True:
            b = message[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        return value
    return 0


def split_address(address: str) -> tuple[str, int]:
    """HOST:PORT (or [V6]:PORT) as a host and a port; ValueError for anything else."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class Reply:
    """The client's side of the one call, frame by frame (both the blocking probe and the
    asyncio one of emulator/client/h2async.py feed it): what to answer, and the status once
    the reply's message is whole."""

    def __init__(self) -> None:
        self.body = b""

    def on_frame(self, head: bytes, payload: bytes) -> tuple[bytes, int | None]:
        """(bytes to send back, the served status or None until the reply is whole); raises
        ProbeError when the call failed."""
        kind, flags, stream = head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        if kind == SETTINGS and not flags & ACK:
            return frame(SETTINGS, ACK, 0), None
        if kind == PING and not flags & ACK:
            return frame(PING, ACK, 0, payload), None
        if kind == GOAWAY:
            raise ProbeError("the server sent GOAWAY")
        if kind == RST_STREAM and stream == STREAM:
            raise ProbeError("the server reset the call")
        if kind == DATA and stream == STREAM:
            self.body += payload
            body = self.body
            if len(body) >= 5 and len(body) >= 5 + int.from_bytes(body[1:5], "big"):
                return b"", status_of(body[5 : 5 + int.from_bytes(body[1:5], "big")])
        if stream == STREAM and flags & END_STREAM:
            # trailers only: the call failed (e.g. NOT_FOUND for an unknown service)
            raise ProbeError("the call ended without a reply (a gRPC error status)")
        return b"", None


def length_of(head: bytes) -> int:
    """The payload length of a frame from its 9-byte head."""
    return int.from_bytes(head[:3], "big")


def check(address: str, service: str = "", timeout_s: float = 2.0) -> int:
    """The served status (1 SERVING, 2 NOT_SERVING, ...) of `service` at HOST:PORT. OSError
    when unreachable, ProbeError when the call fails."""
    with socket.create_connection(split_address(address), timeout=timeout_s) as sock:
        sock.sendall(request(address, service))
        reply = Reply()
        for _ in range(MAX_FRAMES):
            head = _read_exact(sock, 9)
            answer, status = reply.on_frame(head, _read_exact(sock, length_of(head)))
            if answer:
                sock.sendall(answer)
            if status is not None:
                return status
        raise ProbeError(f"no reply within {MAX_FRAMES} frames")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or len(args) > 2:
        print("usage: cmemu-probe HOST:PORT [SERVICE]  (exit 0 SERVING, 4 not, 3 unreachable)")
        return 0 if args and args[0] in ("-h", "--help") else 2
    address, service = args[0], args[1] if len(args) > 1 else ""
    try:
        status = check(address, service)
    except (OSError, ValueError) as exc:
        print(f"{address}: unreachable: {exc}", file=sys.stderr)
        return UNREACHABLE_EXIT
    except ProbeError as exc:
        print(f"{address}: {exc}", file=sys.stderr)
        return NOT_SERVING_EXIT
    print(STATUS_NAMES.get(status, str(status)))
    return SERVING if status == 1 else NOT_SERVING_EXIT


if __name__ == "__main__":
    sys.exit(main())
