"""cutylib.pgcluster.free_port: the ports test stacks give their services. Below the kernel's
ephemeral range (where outgoing connections take their source ports, so none of them can take the
port before the service binds it), free to bind, and never handed out twice by one process."""
import socket

from cutylib.pgcluster import _ephemeral_range, free_port


def test_ports_are_below_the_ephemeral_range_bindable_and_never_repeated():
    low, high = _ephemeral_range()
    assert 1024 <= low <= high
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == 200
    assert all(p < low for p in ports)
    for p in ports[:20]:
        with socket.socket() as s:
            s.bind(("0.0.0.0", p))  # nothing holds it


def test_a_port_something_listens_on_is_never_handed_out(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        taken = busy.getsockname()[1]
        busy.listen()
        # The only candidate offered first is the busy port, then a free one.
        offered = iter([taken, taken, 10001, 10002, 10003])
        monkeypatch.setattr("cutylib.pgcluster.random.randint", lambda a, b: next(offered))
        monkeypatch.setattr("cutylib.pgcluster._HANDED_OUT", set())
        assert free_port() in (10001, 10002, 10003)
