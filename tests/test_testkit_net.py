"""dwsearch_testkit.net.free_port: never the same port twice in a row of calls, though the
OS may offer a port just released again at once (two servers of one test then named the
same address)."""

import socket

from dwsearch_testkit.net import free_port


def test_ports_handed_out_are_distinct_and_free():
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:  # and each is free to bind
        s.bind(("127.0.0.1", ports[-1]))
