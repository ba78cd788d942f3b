"""A TCP proxy that plays a network between the device and the cloud: delay, jitter, loss, bandwidth, partition.

Tests and benchmarks put it in the path of a gRPC channel (`CloudClient(proxy.address)`) to get network faults
without root: `tc netem` needs a kernel module and privileges that CI runners and this project's machines do not
have, and network namespaces need root. Everything here runs in user space on loopback.

    with NetworkProxy("127.0.0.1:50051", "poor", seed=0) as proxy:
        client = CloudClient(proxy.address)
        ...
        proxy.set_profile("partition")   # the link goes dark mid-run (bytes are held, nothing arrives)
        proxy.set_profile("wifi")        # and comes back: held bytes flow again
        proxy.reset_connections()        # every open connection dies with a TCP RST

What is emulated, per connection and direction, on the byte stream the application sees:

- Delay: each segment (a read is cut into segments of at most `SEGMENT_BYTES`, a TCP MSS) arrives half an RTT
  after it was sent, plus or minus up to `jitter_ms`. Segments never overtake each other (TCP is in order).
- Bandwidth: segments leave one after another at `bandwidth_kbps`, so a large message takes its size / rate.
- Loss: TCP never shows loss to applications, only delay, so a lost segment is not dropped: it is delivered
  after a retransmission timeout (RTO: the larger of 200 ms, Linux's minimum, and RTT + 4 x jitter), and a
  retransmission can be lost again with the same probability, doubling the RTO each time (exponential
  backoff). Everything behind a lost segment waits for it (head-of-line blocking). Losses of segments sent
  together overlap rather than add up, as selective acknowledgements let TCP repair them in one round.
- Partition: nothing is delivered while the profile is partitioned; bytes are held and delivered when the
  profile changes (a TCP connection survives a short outage by retransmitting). New connections are accepted
  but hear nothing, like a connection whose peer went silent after the handshake.
- Reset: `reset_connections()` aborts every open connection with an RST on both sides, as when a NAT or a
  load balancer forgets a flow; the next connection attempt works again.

Not emulated: duplicated or reordered segments, which TCP hides from applications, and slow start.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Self

SEGMENT_BYTES = 1448  # TCP MSS on a 1500-byte Ethernet MTU: the unit that is delayed and lost
MIN_RTO_S = 0.2  # Linux's minimum retransmission timeout
MAX_RTO_S = 10.0  # cap on one backed-off retransmission wait
READ_BYTES = 64 * 1024  # largest read from a socket


@dataclass(frozen=True)
class NetworkProfile:
    """One network condition; the presets are in PROFILES."""

    name: str  # shown in reports
    rtt_ms: float = 0.0  # round-trip time: each direction delays by half of it
    jitter_ms: float = 0.0  # each segment's one-way delay varies uniformly within +- this (order is kept)
    loss: float = 0.0  # probability that one transmission of a segment is lost (see the module doc)
    bandwidth_kbps: float | None = None  # per direction and connection; None: unlimited
    partitioned: bool = False  # nothing gets through; bytes are held until the profile changes

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), not {self.loss}")
        if self.rtt_ms < 0 or self.jitter_ms < 0 or (self.bandwidth_kbps is not None and self.bandwidth_kbps <= 0):
            raise ValueError("rtt_ms and jitter_ms must be >= 0 and bandwidth_kbps > 0")

    @property
    def rto_s(self) -> float:
        """The first retransmission timeout of a lost segment."""
        return max(MIN_RTO_S, (self.rtt_ms + 4 * self.jitter_ms) / 1000.0)


PROFILES: dict[str, NetworkProfile] = {
    p.name: p
    for p in (
        NetworkProfile("ideal"),  # loopback as it is
        NetworkProfile("wifi", rtt_ms=10, jitter_ms=3, bandwidth_kbps=50_000),  # home Wi-Fi to a nearby region
        NetworkProfile("5g", rtt_ms=40, jitter_ms=10, bandwidth_kbps=20_000),  # 5G non-standalone, uplink
        NetworkProfile("poor", rtt_ms=150, jitter_ms=40, loss=0.01, bandwidth_kbps=1_000),  # weak cellular
        NetworkProfile("loss30", rtt_ms=40, jitter_ms=10, loss=0.30),  # the 30% packet loss
        NetworkProfile("partition", partitioned=True),  # link gone
    )
}


def profile_named(profile: NetworkProfile | str) -> NetworkProfile:
    """A preset by name (or the profile itself); ValueError lists the presets."""
    if isinstance(profile, NetworkProfile):
        return profile
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown network profile {profile!r}; presets: {', '.join(PROFILES)}") from None


@dataclass
class ProxyStats:
    """What went through; read it after a run (counters are updated on the proxy's thread)."""

    connections: int = 0  # accepted from clients
    bytes_up: int = 0  # client -> upstream
    bytes_down: int = 0  # upstream -> client
    segments: int = 0  # segments forwarded, both directions
    segments_lost: int = 0  # transmissions lost (a segment lost twice counts twice)
    resets: int = 0  # connections aborted by reset_connections()


@dataclass
class _Direction:
    """Timing state of one direction of one connection."""

    link_free_at: float = 0.0  # when the sender's link finishes its current segment (bandwidth)
    last_delivery: float = 0.0  # delivery time of the previous segment (order)


@dataclass(eq=False)  # identity-hashed: kept in a set
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tasks: list[asyncio.Task] = field(default_factory=list)


class NetworkProxy:
    """Forwards TCP from `address` to `upstream` through a NetworkProfile, on its own thread and event loop."""

    def __init__(self, upstream: str, profile: NetworkProfile | str = "ideal", host: str = "127.0.0.1",
                 port: int = 0, seed: int | None = None):
        # upstream: "host:port" of the real server. host/port: where the proxy listens (0: any free port).
        # seed: makes jitter and loss reproducible (given the same reads).
        self.upstream_host, _, upstream_port = upstream.rpartition(":")
        self.upstream_port = int(upstream_port)
        self.host = host
        self._port = port
        self._profile = profile_named(profile)
        self._rng = random.Random(seed)
        self.stats = ProxyStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pasu-netproxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task] = set()  # one per accepted client, until its connection ends

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._port

    @property
    def address(self) -> str:
        """"host:port" to connect to instead of the upstream."""
        return f"{self.host}:{self.port}"

    @property
    def profile(self) -> NetworkProfile:
        return self._profile

    def set_profile(self, profile: NetworkProfile | str) -> None:
        """Switch conditions now: segments read from here on use the new profile; a partition holds at once."""
        self._profile = profile_named(profile)  # one reference swap: safe from any thread

    def start(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        """Close the listener and every connection, then the thread."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def reset_connections(self) -> int:
        """Abort every open connection with a TCP RST on both sides; returns how many there were."""
        return asyncio.run_coroutine_threadsafe(self._reset_all(), self._loop).result(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- on the proxy's loop ---

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        # Cancelling a handler cancels its pipes and closes both its sockets (its `finally`s); one still connecting
        # upstream ends too, and none is left pending when the loop stops.
        for handler in list(self._handlers):
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _reset_all(self) -> int:
        connections = list(self._connections)
        for conn in connections:
            for task in conn.tasks:
                task.cancel()
            _abort(conn.client)
            _abort(conn.upstream)
        self._connections.clear()
        self.stats.resets += len(connections)
        return len(connections)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        handler = asyncio.current_task()
        self._handlers.add(handler)
        try:
            await self._forward(client_reader, client_writer)
        except asyncio.CancelledError:
            # only stop() cancels a handler, and the task ends here: Python 3.11's stream callback would otherwise
            # log each cancelled connection as "Exception in callback" with a traceback
            pass
        finally:
            self._handlers.discard(handler)
            _close(client_writer)

    async def _forward(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        """Connect upstream and pipe both ways until either side ends."""
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            _abort(client_writer)  # upstream down: the client sees a refused/reset connection, as without us
            return
        for writer in (client_writer, up_writer):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # we do the delaying
        conn = _Connection(client_writer, up_writer)
        self._connections.add(conn)
        conn.tasks = [
            asyncio.create_task(self._pipe(client_reader, up_writer, upstream=True)),
            asyncio.create_task(self._pipe(up_reader, client_writer, upstream=False)),
        ]
        try:
            await asyncio.gather(*conn.tasks, return_exceptions=True)
        finally:
            self._connections.discard(conn)
            _close(up_writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool) -> None:
        """Read, schedule each segment's delivery, deliver in order; ends (and ends its peer) at EOF or error."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        deliver = asyncio.create_task(self._deliver(queue, writer))
        state = _Direction()
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(READ_BYTES):
                for start in range(0, len(data), SEGMENT_BYTES):
                    segment = data[start : start + SEGMENT_BYTES]
                    queue.put_nowait((self._delivery_time(state, len(segment), loop.time()), segment))
                if upstream:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
            queue.put_nowait(None)
            await deliver
        except (ConnectionError, OSError):
            pass
        finally:
            deliver.cancel()
            _close(writer)

    def _delivery_time(self, state: _Direction, size: int, now: float) -> float:
        p = self._profile
        self.stats.segments += 1
        sent = now
        if p.bandwidth_kbps is not None:
            state.link_free_at = max(state.link_free_at, now) + size * 8 / (p.bandwidth_kbps * 1000.0)
            sent = state.link_free_at
        delay = p.rtt_ms / 2000.0 + self._rng.uniform(-p.jitter_ms, p.jitter_ms) / 1000.0
        rto = p.rto_s
        while p.loss and self._rng.random() < p.loss:
            self.stats.segments_lost += 1
            delay += rto
            rto = min(rto * 2, MAX_RTO_S)
        state.last_delivery = max(state.last_delivery, sent + max(delay, 0.0))
        return state.last_delivery

    async def _deliver(self, queue: asyncio.Queue[tuple[float, bytes] | None], writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while (item := await queue.get()) is not None:
            at, segment = item
            if (wait := at - loop.time()) > 0:
                await asyncio.sleep(wait)
            while self._profile.partitioned:
                await asyncio.sleep(0.01)
            writer.write(segment)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


def _close(writer: asyncio.StreamWriter) -> None:
    if not writer.is_closing():
        writer.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0) instead of a FIN: the peer gets ECONNRESET, not a clean end."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
