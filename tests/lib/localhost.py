"""Helpers shared by the Python test and benchmark scripts that start psflow tasks on 127.0.0.1.

Scripts outside tests/ reach it with sys.path.insert(0, <repo>/tests/lib). Standard library only
(runs under Debian's /usr/bin/python3 without the psflow package).
"""
import socket


def free_ports(n):
    """n distinct TCP ports free on 127.0.0.1 right now (all bound at once, so no repeats)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
