"""The allow-list entries of addresses and networks with an optional port: parsed, or refused at start-up naming the
variable and the item (docs/design/house.md#settings)."""

import ipaddress

import pytest
from django.core.exceptions import ImproperlyConfigured

from mado.env import NetworkPort, env_float, env_network_ports, env_url


@pytest.mark.parametrize(
    "item, network, port",
    [
        ("10.20.0.0/16", "10.20.0.0/16", None),
        ("10.1.2.3/8", "10.0.0.0/8", None),
        ("::1", "::1/128", None),
        ("2001:db8::/32", "2001:db8::/32", None),
        ("10.0.0.5:8443", "10.0.0.5/32", 8443),
        ("10.0.0.0/8:443", "10.0.0.0/8", 443),
        ("[2001:db8::/32]:8443", "2001:db8::/32", 8443),
        ("[::1]:65535", "::1/128", 65535),
        ("[fec0::/10]", "fec0::/10", None),
    ],
)
def test_an_entry_is_an_address_or_network_on_every_port_or_on_the_one_it_names(monkeypatch, item, network, port):
    monkeypatch.setenv("MADO_TEST_ALLOW", f"{item}, 192.0.2.1")

    assert env_network_ports("MADO_TEST_ALLOW", []) == (
        NetworkPort(ipaddress.ip_network(network), port),
        NetworkPort(ipaddress.ip_network("192.0.2.1/32"), None),
    )


@pytest.mark.parametrize(
    "item, reason",
    [
        ("10.0.0.5:0", "not a number from 1 to 65535"),
        ("10.0.0.0/8:65536", "not a number from 1 to 65535"),
        ("10.0.0.5:", "not a number from 1 to 65535"),
        ("[::1]:https", "not a number from 1 to 65535"),
        ("[::1]8443", "written [address or network]:port"),
        ("[::1", "written [address or network]:port"),
        ("chat.internal:8443", "does not appear to be an IPv4 or IPv6 network"),
        ("10.0.0.5:80:81", "does not appear to be an IPv4 or IPv6 network"),
        ("10.0.0.0/33", "does not appear to be an IPv4 or IPv6 network"),
    ],
)
def test_a_bad_entry_fails_naming_the_variable_and_the_item(monkeypatch, item, reason):
    monkeypatch.setenv("MADO_ALERT_WEBHOOK_ALLOW", f"10.0.0.0/8,{item}")

    with pytest.raises(ImproperlyConfigured, match="MADO_ALERT_WEBHOOK_ALLOW") as refused:
        env_network_ports("MADO_ALERT_WEBHOOK_ALLOW", [])

    assert repr(item) in str(refused.value) and reason in str(refused.value)


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "NaN"])
def test_a_number_setting_that_is_not_finite_stops_start_up_naming_it(monkeypatch, raw):
    monkeypatch.setenv("MADO_TEST_SECONDS", raw)
    with pytest.raises(ImproperlyConfigured, match=f"MADO_TEST_SECONDS='{raw}' is not a finite number"):
        env_float("MADO_TEST_SECONDS", 3.0, minimum=0.1)


@pytest.mark.parametrize("raw", ["minio:9000", "ftp://s3.example.com", "http://", "https://:9000", "http://h:99999"])
def test_a_url_setting_that_is_not_an_http_url_with_a_host_stops_start_up_naming_it(monkeypatch, raw):
    monkeypatch.setenv("MADO_TEST_URL", raw)
    with pytest.raises(ImproperlyConfigured, match=f"MADO_TEST_URL={raw!r}"):
        env_url("MADO_TEST_URL")


@pytest.mark.parametrize(
    "raw, value", [("", None), ("  ", None), ("https://s3.example.com:9000", "https://s3.example.com:9000")]
)
def test_a_url_setting_is_kept_as_given_or_none_when_empty(monkeypatch, raw, value):
    monkeypatch.setenv("MADO_TEST_URL", raw)
    assert env_url("MADO_TEST_URL") == value
