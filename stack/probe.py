#!/usr/bin/env python3
"""Readiness probes for the local stack, standard library only (no client to install).

  probe.py kafka HOST:PORT      a Metadata request answered with at least one broker
  probe.py cql HOST:PORT        SELECT release_version FROM system.local answered
  probe.py dcs HOST:PORT        the node sees PROBE_DCS (2) datacenters: its own and its peers'
  probe.py nodes HOST:PORT      the node sees PROBE_NODES (3) nodes: itself and its peers
                                (kafka: PROBE_BROKERS, default 1, brokers in metadata)
  probe.py port HOST:PORT       exit 0 if something listens there

Prints one line on success; exits non-zero otherwise. Used by stack.sh.
"""
import os
import socket
import struct
import sys


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return buf


def _connect(addr, timeout=3.0):
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def kafka(addr):
    # Metadata v1 with a null topic array (all topics): the broker lists itself only once it
    # has joined the cluster metadata, which is what "ready" means to a client.
    client = b"likes-probe"
    body = struct.pack(">hhih", 3, 1, 1, len(client)) + client + struct.pack(">i", -1)
    with _connect(addr) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exact(s, 4))
        resp = _recv_exact(s, size)
    (_corr, nbrokers) = struct.unpack(">ii", resp[:8])
    want = int(os.environ.get("PROBE_BROKERS", "1"))
    if nbrokers < want:
        raise RuntimeError(f"{nbrokers} broker(s) registered, not yet {want}")
    return f"kafka {addr}: {nbrokers} broker(s) in metadata"


def _cql_frame(opcode, body, stream=1):
    return struct.pack(">BBhBi", 0x04, 0, stream, opcode, len(body)) + body


def _cql_read(s):
    _ver, _flags, _stream, opcode, length = struct.unpack(">BBhBi", _recv_exact(s, 9))
    return opcode, _recv_exact(s, length)


def _cql_string(b):
    return struct.pack(">H", len(b)) + b


def _cql_column(addr, query):
    """The values of a one-text-column query, over the bare native protocol (v4)."""
    with _connect(addr) as s:
        startup = struct.pack(">H", 1) + _cql_string(b"CQL_VERSION") + _cql_string(b"3.0.0")
        s.sendall(_cql_frame(0x01, startup))
        opcode, body = _cql_read(s)
        if opcode != 0x02:
            raise RuntimeError(f"STARTUP answered opcode {opcode:#x}: {body[6:].decode(errors='replace')}")
        q = query.encode()
        s.sendall(_cql_frame(0x07, struct.pack(">i", len(q)) + q + struct.pack(">HB", 0x0001, 0)))
        opcode, body = _cql_read(s)
        if opcode != 0x08:
            raise RuntimeError(f"QUERY answered opcode {opcode:#x}: {body[6:].decode(errors='replace')}")
    # RESULT Rows: kind, flags, column count, global table spec (keyspace, table), columns...
    kind, flags, ncols = struct.unpack(">iii", body[:12])
    if kind != 2 or ncols != 1:
        raise RuntimeError("unexpected result shape")
    off = 12
    if flags & 0x0001:
        for _ in range(2):
            (n,) = struct.unpack(">H", body[off:off + 2])
            off += 2 + n
    (n,) = struct.unpack(">H", body[off:off + 2])  # column name
    off += 2 + n + 2  # + type option id (varchar)
    (nrows,) = struct.unpack(">i", body[off:off + 4])
    off += 4
    values = []
    for _ in range(nrows):
        (n,) = struct.unpack(">i", body[off:off + 4])
        values.append(body[off + 4:off + 4 + n].decode() if n >= 0 else None)
        off += 4 + max(n, 0)
    return values


def cql(addr):
    versions = _cql_column(addr, "SELECT release_version FROM system.local")
    if not versions:
        raise RuntimeError("system.local is empty")
    return f"cassandra {addr}: release_version {versions[0]}"


def dcs(addr):
    """The datacenters the node at addr sees up in its ring: its own and its peers'."""
    seen = _cql_column(addr, "SELECT data_center FROM system.local")
    seen += _cql_column(addr, "SELECT data_center FROM system.peers_v2")
    want = int(os.environ.get("PROBE_DCS", "2"))
    if len(set(seen)) < want:
        raise RuntimeError(f"sees datacenters {sorted(set(seen))}, not yet {want}")
    return f"cassandra {addr}: datacenters {', '.join(sorted(set(seen)))}"


def nodes(addr):
    """The nodes the node at addr knows: itself and its peers."""
    # Text columns only: the bare parser below reads no other type.
    seen = _cql_column(addr, "SELECT data_center FROM system.local")
    seen += _cql_column(addr, "SELECT data_center FROM system.peers_v2")
    want = int(os.environ.get("PROBE_NODES", "3"))
    if len(seen) < want:
        raise RuntimeError(f"knows {len(seen)} node(s), not yet {want}")
    return f"cassandra {addr}: {len(seen)} nodes in the ring"


def port(addr):
    with _connect(addr, timeout=1.0):
        return f"{addr}: in use"


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("kafka", "cql", "dcs", "nodes", "port"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        print(globals()[sys.argv[1]](sys.argv[2]))
        return 0
    except Exception as e:  # any failure means "not ready"; the reason goes to stderr
        print(f"{sys.argv[1]} {sys.argv[2]}: not ready: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
