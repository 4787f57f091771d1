"""A crowd of strangers on node 0's link, run as its own process (`python link_strangers.py PORT COUNT
SECONDS [flood]`): COUNT connections from many loopback addresses, each sending a byte every half second
and never a hello, for SECONDS. With `flood`, also a connection flood from one more address for those
SECONDS: a new connection as fast as node 0 takes them, and a byte on every one still open each time,
so node 0 evicts that address's oldest waiting connection in the very `select()` batch in which it is
readable (the race that once killed node 0's gate within a second). Prints one line, "holding", once
the crowd is open, and at the end a JSON line with how many connections were opened and how many of
them node 0 closed. Its own descriptor limit is raised for them (the test process's stays as it is)."""

from __future__ import annotations

import json
import resource
import socket
import sys
import time

FLOODER = "127.0.0.250"
FLOOD_BURST, FLOOD_PAUSE_S = 8, 0.05
"""The flood: up to 160 new connections a second, in bursts (a busier flood only starves a CPU-bound
test machine, where the job's own processes must still make their deadlines)."""


def _send_all(socks: list[socket.socket]) -> int:
    """A byte on each; those node 0 closed are dropped from `socks` and counted."""
    closed = 0
    for sock in list(socks):
        try:
            sock.send(b"{")
        except OSError:
            socks.remove(sock)
            sock.close()
            closed += 1
    return closed


def main() -> None:
    port, count, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    flood = sys.argv[4:5] == ["flood"]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 100)), hard))
    strangers = []
    for i in range(count):
        source = f"127.0.{1 + i % 4}.{2 + i % 200}"
        try:
            strangers.append(
                socket.create_connection(("127.0.0.1", port), timeout=5.0, source_address=(source, 0))
            )
        except OSError:
            continue  # node 0's backlog was full for a moment: a refused stranger is fine
    print("holding", len(strangers), flush=True)
    closed = flooded = 0
    flooders: list[socket.socket] = []
    end = time.monotonic() + seconds
    trickle = 0.0
    while time.monotonic() < end and (strangers or flood):
        if time.monotonic() >= trickle:
            closed += _send_all(strangers)
            trickle = time.monotonic() + 0.5
        if not flood:
            time.sleep(max(0.0, trickle - time.monotonic()))
            continue
        for _ in range(FLOOD_BURST):
            try:
                flooders.append(
                    socket.create_connection(("127.0.0.1", port), timeout=5.0, source_address=(FLOODER, 0))
                )
                flooded += 1
            except OSError:
                break  # node 0's backlog is full for a moment
            closed += _send_all(flooders)
        time.sleep(FLOOD_PAUSE_S)
    for sock in strangers + flooders:
        sock.close()
    print(json.dumps({"opened": count + flooded, "closed_by_node_0": closed}), flush=True)


if __name__ == "__main__":
    main()
