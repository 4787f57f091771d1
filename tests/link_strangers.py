"""A crowd of strangers on node 0's link, run as its own process (`python link_strangers.py PORT COUNT
SECONDS`): COUNT connections from many loopback addresses, each sending a byte every half second and
never a hello, for SECONDS. Prints one line, "holding", once they are all open, and at the end a JSON
line with how many connections node 0 closed. Its own descriptor limit is raised for them (the test
process's stays as it is)."""

from __future__ import annotations

import json
import resource
import socket
import sys
import time


def main() -> None:
    port, count, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
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
    closed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and strangers:
        for sock in list(strangers):
            try:
                sock.send(b"{")
            except OSError:
                strangers.remove(sock)
                sock.close()
                closed += 1
        time.sleep(0.5)
    for sock in strangers:
        sock.close()
    print(json.dumps({"opened": count, "closed_by_node_0": closed}), flush=True)


if __name__ == "__main__":
    main()
