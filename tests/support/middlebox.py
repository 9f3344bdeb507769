"""A loopback TCP relay that behaves like a NAT or firewall dropping idle flows.

    with IdleDropRelay(("127.0.0.1", server.port), drop_after=1.0) as relay:
        url = f"http://127.0.0.1:{relay.port}/blob.bin"

Bytes pass both ways until the client sends on a connection that has been quiet for `drop_after`
seconds (counted from its opening or its last byte either way). That flow is forgotten, as a
middlebox forgets it: whatever either end sends is swallowed, and neither end is told (no FIN, no
RST) until the relay stops. A client that reuses such a connection waits for an answer that never
comes.
"""

from __future__ import annotations

import socket
import threading
import time


class IdleDropRelay:
    def __init__(self, target: tuple[str, int], drop_after: float) -> None:
        self.target, self.drop_after = target, drop_after
        self.drops: list[str] = []  # each flow forgotten: how long it had been quiet when a request came
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def dropped(self) -> int:
        """Flows forgotten so far."""
        return len(self.drops)

    def __enter__(self) -> "IdleDropRelay":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                return
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            flow = {"last": time.monotonic(), "dead": False}
            for src, dst, way in ((client, upstream, "request"), (upstream, client, "answer")):
                threading.Thread(target=self._pump, args=(src, dst, flow, way), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, flow: dict, way: str) -> None:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                return
            if not data:  # an end closed while the flow was known: pass that on
                if not flow["dead"]:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                return
            with self._lock:
                now = time.monotonic()
                # only a request can find its flow forgotten: an answer is due (a slow server, or
                # a relay thread a loaded machine did not run, is no idle flow)
                if way == "request" and not flow["dead"] and now - flow["last"] > self.drop_after:
                    flow["dead"] = True
                    self.drops.append(f"{now - flow['last']:.2f} s")
                flow["last"] = now
                dead = flow["dead"]
            if not dead:
                try:
                    dst.sendall(data)
                except OSError:
                    return
