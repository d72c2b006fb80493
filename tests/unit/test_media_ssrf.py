"""SSRF guard: address table, host allow-list, and refusals end to end with nothing fetched."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from ipaddress import IPv4Address, ip_address
from pathlib import Path

import httpx
import pytest

from tests.unit.test_media_server import ImageServer, Route, png_bytes
from trtllm_gateway.config.media import MediaConfig
from trtllm_gateway.multimodal import EgressPolicy, MediaCache, MediaError, load_chat_images
from trtllm_gateway.multimodal.ssrf import (
    IPAddress,
    host_allowed,
    is_blocked_address,
    pinned_request,
)

LOOPBACK = IPv4Address("127.0.0.1")


@pytest.fixture
def server() -> Iterator[ImageServer]:
    with ImageServer() as s:
        s.routes["/img.png"] = Route(body=png_bytes())
        yield s


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as c:
        yield c


def chat(url: str) -> list[dict[str, object]]:
    return [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is it?"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        },
    ]


PARAM = "messages[1].content[1].image_url"


def fake_resolver(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> list[IPAddress]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [ip_address(a) for a in table[host]]

    return resolve


def loopback_is_public(ip: IPAddress) -> bool:
    """Test stand-in for the public internet: 127.0.0.1 (only) passes; all else as in production."""
    return ip != LOOPBACK and is_blocked_address(ip)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.255.255.254", "10.0.0.1", "10.255.255.255", "172.16.0.1",
        "172.31.255.255",
        "192.168.0.1", "100.64.0.1", "100.127.255.254", "169.254.169.254", "169.254.0.1", "0.0.0.0",
        "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255", "192.0.2.1", "198.18.0.1",
        "::1", "::", "fe80::1", "febf::1", "fc00::1", "fd12:3456::1", "ff02::1", "2001:db8::1",
        "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1",
        "2002:7f00:1::", "2002:a9fe:a9fe::1", "2002:c0a8:101::", "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe", "64:ff9b:1::1", "2001::1",
    ],
)  # fmt: skip
def test_blocked_addresses(address: str) -> None:
    assert is_blocked_address(ip_address(address))


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8",
     "2002:808:808::", "64:ff9b::808:808", "100.128.0.1", "172.32.0.1"],
)  # fmt: skip
def test_public_addresses(address: str) -> None:
    assert not is_blocked_address(ip_address(address))


@pytest.mark.parametrize(
    ("host", "allowed", "ok"),
    [
        ("img.example.com", (), True),
        ("example.com", ("example.com",), True),
        ("img.example.com", ("example.com",), True),
        ("IMG.Example.COM.", ("example.com",), True),
        ("badexample.com", ("example.com",), False),
        ("example.com.evil.net", ("example.com",), False),
        ("evil.net", ("example.com", "cdn.net"), False),
    ],
)
def test_host_allow_list(host: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert host_allowed(host, allowed) is ok


REFUSED = [
    "http://127.0.0.1:{port}/img.png",
    "http://localhost:{port}/img.png",
    "http://LOCALHOST:{port}/img.png",
    "http://127.1:{port}/img.png",
    "http://2130706433:{port}/img.png",
    "http://0.0.0.0:{port}/img.png",
    "http://10.0.0.1/img.png",
    "http://172.16.0.1/img.png",
    "http://192.168.1.1/img.png",
    "http://100.64.0.1/img.png",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]:{port}/img.png",
    "http://[fe80::1]/img.png",
    "http://[::ffff:127.0.0.1]:{port}/img.png",
    "http://[::ffff:7f00:1]:{port}/img.png",
    "http://[2002:7f00:1::]:{port}/img.png",
    "http://[64:ff9b::7f00:1]:{port}/img.png",
    "https://127.0.0.1:{port}/img.png",
    "http://user:pw@127.0.0.1:{port}/img.png",
    "http://user@example.com/img.png",
    "gopher://127.0.0.1:{port}/_GET%20/img.png",
    "ftp://127.0.0.1:{port}/img.png",
    "file:///etc/passwd",
    "/etc/passwd",
    "dict://127.0.0.1:{port}/",
    "javascript:alert(1)",
    "http:///img.png",
]


@pytest.mark.parametrize("template", REFUSED)
async def test_refused_with_400_and_nothing_fetched(
    template: str, server: ImageServer, client: httpx.AsyncClient
) -> None:
    settings = MediaConfig(allow_private_media_urls=False)
    with pytest.raises(MediaError) as info:
        await load_chat_images(
            chat(template.format(port=server.port)),
            client=client,
            config=settings,
            cache=MediaCache(10**6),
        )
    assert info.value.status_code == 400
    assert info.value.param == PARAM
    assert info.value.type == "invalid_request_error"
    assert server.requests == []


async def test_allow_private_opts_out(server: ImageServer, client: httpx.AsyncClient) -> None:
    settings = MediaConfig(allow_private_media_urls=True)
    images = await load_chat_images(
        chat(server.url("/img.png")), client=client, config=settings, cache=MediaCache(10**6)
    )
    assert len(images) == 1
    assert [seen.path for seen in server.requests] == ["/img.png"]


async def test_allow_private_still_refuses_bad_schemes_and_userinfo(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    settings = MediaConfig(allow_private_media_urls=True)
    for url in (
        f"ftp://127.0.0.1:{server.port}/img.png",
        f"http://u:p@127.0.0.1:{server.port}/img.png",
    ):
        with pytest.raises(MediaError) as info:
            await load_chat_images(
                chat(url), client=client, config=settings, cache=MediaCache(10**6)
            )
        assert info.value.status_code == 400
    assert server.requests == []


@pytest.mark.parametrize(
    "target",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.7:{port}/img.png",
        "http://127.0.0.2:{port}/img.png",
        "http://[::1]:{port}/img.png",
        "http://localhost:{port}/img.png",  # resolves to ::1 as well: every address must pass
        "http://internal.example.com:{port}/img.png",
        "gopher://img.example.com:{port}/img.png",
        "http://user:pw@img.example.com:{port}/img.png",
    ],
)
async def test_redirect_to_private_refused_at_the_hop(
    target: str, server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/redirect"] = Route(
        status=302, headers={"Location": target.format(port=server.port)}
    )
    table = {
        "img.example.com": ["127.0.0.1"],
        "internal.example.com": ["10.1.2.3"],
        "localhost": ["127.0.0.1", "::1"],
    }
    policy = EgressPolicy(resolve=fake_resolver(table), is_blocked=loopback_is_public)
    with pytest.raises(MediaError) as info:
        await load_chat_images(
            chat(server.url("/redirect", host="img.example.com")),
            client=client,
            config=MediaConfig(),
            cache=MediaCache(10**6),
            policy=policy,
        )
    assert info.value.status_code == 400
    assert info.value.param == PARAM
    assert [seen.path for seen in server.requests] == ["/redirect"]


async def test_redirect_to_public_followed_with_pinning(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    server.routes["/redirect"] = Route(status=301, headers={"Location": "/img.png"})
    policy = EgressPolicy(
        resolve=fake_resolver({"img.example.com": ["127.0.0.1"]}), is_blocked=loopback_is_public
    )
    images = await load_chat_images(
        chat(server.url("/redirect", host="img.example.com")),
        client=client,
        config=MediaConfig(),
        cache=MediaCache(10**6),
        policy=policy,
    )
    assert len(images) == 1
    assert [seen.path for seen in server.requests] == ["/redirect", "/img.png"]
    # Connected to the checked address, but spoke to the host the URL named.
    assert {seen.headers["host"] for seen in server.requests} == {f"img.example.com:{server.port}"}


async def test_every_resolved_address_must_be_public(
    server: ImageServer, client: httpx.AsyncClient
) -> None:
    policy = EgressPolicy(resolve=fake_resolver({"mixed.example.com": ["127.0.0.1", "10.0.0.1"]}),
                          is_blocked=loopback_is_public)  # fmt: skip
    with pytest.raises(MediaError) as info:
        await load_chat_images(
            chat(server.url("/img.png", host="mixed.example.com")),
            client=client,
            config=MediaConfig(),
            cache=MediaCache(10**6),
            policy=policy,
        )
    assert info.value.status_code == 400
    assert server.requests == []


async def test_unresolvable_host_is_400(client: httpx.AsyncClient) -> None:
    policy = EgressPolicy(resolve=fake_resolver({}))
    with pytest.raises(MediaError) as info:
        await load_chat_images(
            chat("http://nowhere.invalid/img.png"),
            client=client,
            config=MediaConfig(),
            cache=MediaCache(0),
            policy=policy,
        )
    assert info.value.status_code == 400


async def test_allowed_media_domains(server: ImageServer, client: httpx.AsyncClient) -> None:
    settings = MediaConfig(allow_private_media_urls=True, allowed_media_domains=["example.com"])
    resolve = fake_resolver({"img.example.com": ["127.0.0.1"], "example.org": ["127.0.0.1"]})
    policy = EgressPolicy(allowed_domains=("example.com",), allow_private=True, resolve=resolve)
    ok = await load_chat_images(
        chat(server.url("/img.png", host="img.example.com")), client=client, config=settings,
        cache=MediaCache(0), policy=policy,
    )  # fmt: skip
    assert len(ok) == 1
    for host in ("example.org", "127.0.0.1"):
        with pytest.raises(MediaError) as info:
            await load_chat_images(
                chat(server.url("/img.png", host=host)),
                client=client,
                config=settings,
                cache=MediaCache(0),
            )
        assert info.value.status_code == 400
        assert info.value.code == "image_url_not_allowed"
    assert len(server.requests) == 1


async def test_pinned_https_request_shape() -> None:
    """IP-literal URL, original Host header, TLS SNI for the name; client defaults stay home."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=png_bytes(), headers={"Content-Type": "image/png"})

    transport = httpx.MockTransport(handler)
    policy = EgressPolicy(resolve=fake_resolver({"cdn.example.com": ["93.184.216.34"]}))
    async with httpx.AsyncClient(
        transport=transport,
        headers={"Authorization": "Bearer sibling-secret"},
        cookies={"session": "x"},
    ) as client:
        images = await load_chat_images(
            chat("https://cdn.example.com:8443/a.png?x=1"), client=client, config=MediaConfig(),
            cache=MediaCache(0), policy=policy,
        )  # fmt: skip
    assert len(images) == 1
    (request,) = seen
    assert str(request.url) == "https://93.184.216.34:8443/a.png?x=1"
    assert request.headers["host"] == "cdn.example.com:8443"
    assert request.extensions["sni_hostname"] == "cdn.example.com"
    assert "authorization" not in request.headers
    assert "cookie" not in request.headers


def test_pinned_request_ipv6() -> None:
    request = pinned_request(
        httpx.URL("http://v6.example.com/a.png"), ip_address("2606:4700::1"), {}, httpx.Timeout(1.0)
    )
    assert request.url.host == "2606:4700::1"
    assert request.headers["host"] == "v6.example.com"
    assert "sni_hostname" not in request.extensions


async def test_local_file_outside_allowed_path_refused(
    tmp_path: Path, client: httpx.AsyncClient
) -> None:
    allowed = tmp_path / "media"
    allowed.mkdir()
    secret = tmp_path / "secret.png"
    secret.write_bytes(png_bytes())
    settings = MediaConfig(allowed_local_media_path=allowed)
    for url in (
        f"file://{secret}",
        str(secret),
        "../secret.png",
        f"file://{allowed}/../secret.png",
    ):
        with pytest.raises(MediaError) as info:
            await load_chat_images(chat(url), client=client, config=settings, cache=MediaCache(0))
        assert info.value.status_code == 400, url


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
async def test_https_pinned_connection_verifies_the_name(tmp_path: Path) -> None:
    """Real TLS on loopback: connect to the checked IP, but SNI and cert check use the hostname."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    openssl = [
        *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
        *("-subj", "/CN=img.test", "-addext", "subjectAltName=DNS:img.test"),
        *("-keyout", str(key), "-out", str(cert)),
    ]
    await asyncio.to_thread(subprocess.run, openssl, check=True, capture_output=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    sni_seen: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: sni_seen.append(name)  # type: ignore[assignment,func-returns-value]
    client_ctx = ssl.create_default_context(cafile=str(cert))
    resolve = fake_resolver({"img.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    with ImageServer(ssl_context=server_ctx) as server:
        server.routes["/img.png"] = Route(body=png_bytes())
        async with httpx.AsyncClient(verify=client_ctx, trust_env=False) as client:
            policy = EgressPolicy(allow_private=True, resolve=resolve)
            url = f"https://img.test:{server.port}/img.png"
            images = await load_chat_images(
                chat(url), client=client, config=MediaConfig(), cache=MediaCache(0), policy=policy
            )
            assert len(images) == 1
            assert sni_seen == ["img.test"]
            # The certificate does not name other.test: the pinned connection must refuse it.
            other = f"https://other.test:{server.port}/img.png"
            with pytest.raises(MediaError) as info:
                await load_chat_images(
                    chat(other),
                    client=client,
                    config=MediaConfig(),
                    cache=MediaCache(0),
                    policy=policy,
                )
            assert info.value.status_code == 502
