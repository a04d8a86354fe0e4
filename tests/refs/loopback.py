"""A hub endpoint on 127.0.0.1 that answers nothing and counts who knocked: tests of the
offline rules point ``HF_ENDPOINT`` at it and assert that no connection was attempted (a
duration bound would fail on a loaded machine; an address outside 127.0.0.0/8 is never a
target of this suite)."""

import contextlib
import socket
import threading


@contextlib.contextmanager
def silent_endpoint():
    """``(url, hits)``: ``hits`` grows by one per connection made to ``url`` (each closed at
    once)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    hits, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except (socket.timeout, OSError):
                continue
            hits.append(1)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}", hits
    finally:
        stop.set()
        thread.join(timeout=2)
        srv.close()
