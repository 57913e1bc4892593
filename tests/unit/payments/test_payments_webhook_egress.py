"""Where merchant webhooks may connect (payments/outbound/egress.py): only public addresses, judged
on the address connected to; port 443 in production; the loopback allowance is a development
setting production refuses; and failures are logged as coarse classes, never socket messages."""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl

import aiohttp
import pytest

from payments.outbound.egress import (Egress, ForbiddenAddress, GuardedResolver, error_class, guarded_socket,
                                      refusal, refused_name)

REFUSED = ["127.0.0.1", "127.0.0.2", "127.255.255.254", "0.0.0.0", "0.1.2.3", "::", "::1", "::ffff:127.0.0.1",
           "::ffff:10.0.0.1", "::ffff:169.254.169.254", "64:ff9b::7f00:1", "2002:7f00:1::", "10.0.0.1",
           "10.255.255.255", "172.16.0.1", "172.31.255.255", "192.168.0.1", "192.168.255.255", "169.254.169.254",
           "169.254.0.1", "100.64.0.1", "100.127.255.255", "fe80::1", "febf::1", "fc00::1", "fd12:3456::1",
           "224.0.0.1", "239.255.255.250", "ff02::1", "240.0.0.1", "255.255.255.255", "192.0.2.1", "198.18.0.1",
           "2001:db8::1"]
ALLOWED = ["93.184.216.34", "8.8.8.8", "1.1.1.1", "172.32.0.1", "100.128.0.1", "2606:4700:4700::1111",
           "::ffff:93.184.216.34"]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused(address):
    ip = ipaddress.ip_address(address)
    assert refusal(ip) is not None, address
    with pytest.raises(ForbiddenAddress):
        Egress().check_address(ip, 443)


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_are_allowed(address):
    assert refusal(ipaddress.ip_address(address)) is None
    Egress().check_address(ipaddress.ip_address(address), 443)


@pytest.mark.parametrize("name", ["localhost", "localhost.", "LOCALHOST.", "api.localhost", "api.localhost.",
                                  "ip6-localhost"])
def test_names_of_this_machine_are_refused_before_any_lookup(name):
    assert refused_name(name)
    with pytest.raises(ForbiddenAddress):
        Egress().check_name(name)


def test_ordinary_names_are_left_to_the_address_check():
    assert not refused_name("hooks.example.com") and not refused_name("localhost.example.com")


def test_production_allows_port_443_only_and_refuses_the_private_allowance(monkeypatch):
    prod = Egress.from_env("production")
    prod.check_address(ipaddress.ip_address("93.184.216.34"), 443)
    for port in (80, 8443, 22):
        with pytest.raises(ForbiddenAddress):
            prod.check_address(ipaddress.ip_address("93.184.216.34"), port)
    monkeypatch.setenv("CUTY_WEBHOOK_ALLOW_PRIVATE", "1")
    with pytest.raises(SystemExit, match="CUTY_WEBHOOK_ALLOW_PRIVATE"):
        Egress.from_env("production")
    with pytest.raises(SystemExit):
        Egress.from_env("production", allow_private=True)
    dev = Egress.from_env("development")
    assert dev.allow_private and dev.ports is None
    dev.check_address(ipaddress.ip_address("127.0.0.1"), 8080)
    monkeypatch.delenv("CUTY_WEBHOOK_ALLOW_PRIVATE")
    assert not Egress.from_env("development").allow_private  # not by default, not even in development


class FakeResolver(aiohttp.abc.AbstractResolver):
    def __init__(self, answers: dict[str, list[str]]):
        self.answers = answers

    async def resolve(self, host, port=0, family=socket.AF_INET):
        return [{"hostname": host, "host": a, "port": port, "family": family, "proto": 0, "flags": 0}
                for a in self.answers[host]]

    async def close(self):
        pass


async def test_a_name_with_any_private_address_is_refused_and_a_public_one_is_returned_as_checked():
    resolver = GuardedResolver(Egress(), FakeResolver({"public.test": ["93.184.216.34"],
                                                       "rebound.test": ["93.184.216.34", "10.0.0.7"],
                                                       "metadata.test": ["169.254.169.254"]}))
    got = await resolver.resolve("public.test", 443)
    assert [a["host"] for a in got] == ["93.184.216.34"]  # what the connector connects to: pinned
    for name in ("rebound.test", "metadata.test", "localhost."):
        with pytest.raises(ForbiddenAddress):
            await resolver.resolve(name, 443)


def test_the_socket_factory_checks_the_exact_address_connected_to():
    create = guarded_socket(Egress(ports=frozenset({443})))
    for sockaddr, family in ((("127.0.0.1", 443), socket.AF_INET), (("::ffff:127.0.0.1", 443, 0, 0), socket.AF_INET6),
                             (("93.184.216.34", 80), socket.AF_INET)):
        with pytest.raises(ForbiddenAddress):
            create((family, socket.SOCK_STREAM, 6, "", sockaddr))
    sock = create((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 443)))
    sock.close()


def _connector_error(os_error: OSError, cls=aiohttp.ClientConnectorError):
    key = type("Key", (), {"ssl": True, "host": "h", "port": 443})()
    return cls(key, os_error)


def test_errors_become_coarse_classes():
    assert error_class(asyncio.TimeoutError()) == "timeout"
    assert error_class(aiohttp.ServerTimeoutError("read")) == "timeout"
    assert error_class(_connector_error(ConnectionRefusedError(111, "Connection refused to 10.1.2.3"))) \
        == "connection_refused"
    assert error_class(_connector_error(socket.gaierror(-2, "Name or service not known"),
                                        aiohttp.ClientConnectorDNSError)) == "dns"
    assert error_class(_connector_error(ForbiddenAddress("address not public (loopback)"),
                                        aiohttp.ClientConnectorDNSError)) == "forbidden_address"
    assert error_class(_connector_error(ForbiddenAddress("port not allowed"))) == "forbidden_address"
    assert error_class(_connector_error(ssl.SSLError(1, "bad"), aiohttp.ClientConnectorSSLError)) == "tls"
    assert error_class(_connector_error(OSError(113, "No route to host 10.9.9.9"))) == "connection_failed"
    assert error_class(aiohttp.ServerDisconnectedError()) == "connection_lost"
    assert error_class(RuntimeError("boom")) == "error"


def test_the_webhook_contract_lists_every_event_type_the_service_sends():
    """A subscription to an event the service emits must pass the contract's `in` rule: the
    annotation and the service's list are one list (a new event type is added to both)."""
    from cuty.payments.v1 import webhooks_pb2
    from cutylib import validation
    from payments.outbound.service import EVENT_TYPES

    request = webhooks_pb2.CreateWebhookEndpointRequest(url="https://merchant.example/hooks", events=list(EVENT_TYPES))
    assert validation.violations(request) == []
    request.events[:] = ["payment.unknown"]
    assert [path for path, _ in validation.violations(request)] == ["events[0]"]
