"""The port a run's Prefect server gets, and the health check that waits for it.

The port is found free seconds before the server binds it, while Ray starts beside it and opens
ports of its own; so it comes from a range Ray never picks from, and a health check that meets
some other server on the port (Ray's gRPC answered one once) says "not yet" instead of raising.
"""

from __future__ import annotations

import socket
import threading

from flows.services.prefect_server import SERVER_PORTS, free_port, healthy


def test_free_ports_avoid_rays_worker_ports_and_the_ephemeral_range():
    ephemeral_low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(port in SERVER_PORTS and not 10002 <= port <= 19999 and port < ephemeral_low for port in ports), ports


def test_a_non_http_answer_is_not_healthy():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def answer_in_binary():
            connection, _ = listener.accept()
            with connection:
                connection.recv(1024)
                connection.sendall(
                    b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\x00\x03\x7f\xff\xff\xff\x00\x04\x00\x3f\x00\x01"
                )

        thread = threading.Thread(target=answer_in_binary, daemon=True)
        thread.start()
        assert healthy(f"http://127.0.0.1:{listener.getsockname()[1]}/api") is False
        thread.join(timeout=5)
