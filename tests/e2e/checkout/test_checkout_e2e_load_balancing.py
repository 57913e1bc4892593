"""Load balancing that works: a client channel spreads calls over every replica its
target names (round_robin), so added replicas get load; two booking processes both serve."""
from __future__ import annotations

import os

from booking.grpc_api import CALLERS
from cuty.booking.v1 import booking_pb2 as bpb, booking_pb2_grpc
from cutylib.pgcluster import free_port
from cutylib.testing.procs import ServiceProcess, base_env
from cutylib.testing.trust import acting_channel, user


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_two_booking_replicas_both_serve(tmp_path, booking_dsn):
    procs = []
    try:
        for i in range(2):
            port = free_port()
            env = base_env(CUTY_BOOKING_DATABASE_URL=booking_dsn, CUTY_BOOKING_GRPC_PORT=port,
                           CUTY_SWEEP_INTERVAL_SECONDS=3600, CUTY_LOG_LEVEL="WARNING")
            procs.append(ServiceProcess("booking", env, tmp_path / f"booking-{i}.log", grpc_port=port).start())
        for p in procs:
            await p.wait_healthy(60)
        # One target naming both replicas, as DNS of a headless Service would.
        target = "ipv4:" + ",".join(f"127.0.0.1:{p.grpc_port}" for p in procs)
        async with acting_channel(target, "booking", CALLERS) as ch:
            stub = booking_pb2_grpc.BookingServiceStub(ch)
            admin = user("lb-admin", "admin")
            salon = await stub.CreateSalon(bpb.CreateSalonRequest(name="LB", time_zone="UTC"), metadata=admin)
            before = [cpu_seconds(p.proc.pid) for p in procs]
            for i in range(300):
                await stub.CreateResource(bpb.CreateResourceRequest(salon_id=salon.id, name=f"chair {i}"),
                                          metadata=admin)
            used = [cpu_seconds(p.proc.pid) - b for p, b in zip(procs, before)]
        share = min(used) / sum(used)
        print(f"CPU seconds per replica over 300 calls: {used} (smaller share {share:.2f})")
        assert share > 0.25, used  # round robin: both replicas did a real part of the work
    finally:
        for p in procs:
            p.stop()
