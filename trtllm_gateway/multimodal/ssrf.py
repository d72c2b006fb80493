"""Egress policy for image URLs: scheme, userinfo, domain allow-list, address checks, pinning.

The rule is "check what you connect to": every address a host resolves to must be public, and the
request then goes to one of those checked addresses (IP literal in the URL, original Host header,
TLS SNI via httpx's sni_hostname extension), so a second DNS lookup cannot rebind it.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

import httpx

from trtllm_gateway.multimodal.errors import MediaRejectedError, MediaUpstreamError

IPAddress = IPv4Address | IPv6Address
Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
"""resolve(host, port) -> addresses; the seam tests use to map a name to loopback."""

ALLOWED_SCHEMES = frozenset({"http", "https"})

# Explicit lists, so the verdict does not depend on the Python patch release's is_private table.
_BLOCKED_V4 = tuple(
    IPv4Network(n)
    for n in (
        "0.0.0.0/8",  # "this network", unspecified
        "10.0.0.0/8",
        "100.64.0.0/10",  # CGNAT
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, cloud metadata (169.254.169.254)
        "172.16.0.0/12",
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # TEST-NET-1
        "192.88.99.0/24",  # 6to4 relay anycast
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # TEST-NET-2
        "203.0.113.0/24",  # TEST-NET-3
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, broadcast
    )
)
_BLOCKED_V6 = tuple(
    IPv6Network(n)
    for n in (
        "::/96",  # unspecified, loopback, deprecated IPv4-compatible
        "64:ff9b:1::/48",  # NAT64 local use
        "100::/64",  # discard
        "2001::/23",  # IETF special purpose, Teredo included
        "2001:db8::/32",  # documentation
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
)
_NAT64 = IPv6Network("64:ff9b::/96")


def normalize_address(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (::ffff:a.b.c.d) is the IPv4 address it carries."""
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def embedded_ipv4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address a 6to4 or NAT64 (well-known prefix) address tunnels to, if any."""
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return IPv4Address(ip.packed[-4:])
    return None


def is_blocked_address(ip: IPAddress) -> bool:
    """True for anything but a public unicast address, including embedded private IPv4."""
    ip = normalize_address(ip)
    if isinstance(ip, IPv4Address):
        return any(ip in net for net in _BLOCKED_V4) or not ip.is_global
    if any(ip in net for net in _BLOCKED_V6):
        return True
    inner = embedded_ipv4(ip)
    if inner is not None:
        return is_blocked_address(inner)
    return not ip.is_global or ip.is_multicast or ip.is_site_local


async def system_resolve(host: str, port: int) -> list[IPAddress]:
    """getaddrinfo in the loop's executor, off the event loop; order kept, duplicates dropped."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[IPAddress, None] = {}
    for info in infos:
        seen[ip_address(str(info[4][0]).partition("%")[0])] = None
    return list(seen)


def host_allowed(host: str, allowed_domains: Sequence[str]) -> bool:
    """Empty allow-list: any host. Otherwise the exact host or one of its subdomains."""
    if not allowed_domains:
        return True
    host = host.rstrip(".").lower()
    for domain in allowed_domains:
        domain = domain.strip().rstrip(".").lower()
        if domain and (host == domain or host.endswith("." + domain)):
            return True
    return False


def _literal(host: str) -> IPAddress | None:
    try:
        return ip_address(host)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """What the fetcher may connect to. Built by egress_policy; tests swap resolve/is_blocked."""

    allowed_domains: tuple[str, ...] = ()
    allow_private: bool = False
    resolve: Resolver = system_resolve
    is_blocked: Callable[[IPAddress], bool] = is_blocked_address

    def check_url(self, url: httpx.URL) -> None:
        """Static checks, before any DNS: scheme, host present, no userinfo, allow-list."""
        if url.scheme not in ALLOWED_SCHEMES:
            raise MediaRejectedError(
                f"unsupported image URL scheme {url.scheme!r}", code="invalid_image_url"
            )
        if not url.host:
            raise MediaRejectedError("image URL has no host", code="invalid_image_url")
        if url.userinfo:
            raise MediaRejectedError(
                "image URLs must not carry credentials", code="invalid_image_url"
            )
        if not host_allowed(url.host, self.allowed_domains):
            raise MediaRejectedError(
                "image URL host is not in the allowed media domains", code="image_url_not_allowed"
            )

    async def checked_addresses(self, url: httpx.URL) -> list[IPAddress]:
        """Resolve the URL's host once; refuse unless every address is allowed."""
        port = url.port or (443 if url.scheme == "https" else 80)
        literal = _literal(url.host)
        if literal is not None:
            addresses: Sequence[IPAddress] = [literal]
        else:
            try:
                addresses = await self.resolve(url.raw_host.decode("ascii"), port)
            except socket.gaierror as exc:
                if exc.errno in (socket.EAI_AGAIN, errno.EAGAIN):
                    raise MediaUpstreamError("could not resolve the image URL host") from None
                raise MediaRejectedError(
                    "could not resolve the image URL host", code="invalid_image_url"
                ) from None
            except (UnicodeError, ValueError, OSError):
                raise MediaRejectedError(
                    "could not resolve the image URL host", code="invalid_image_url"
                ) from None
        normalized = list(dict.fromkeys(normalize_address(ip) for ip in addresses))
        if not normalized:
            raise MediaRejectedError(
                "could not resolve the image URL host", code="invalid_image_url"
            )
        if not self.allow_private and any(self.is_blocked(ip) for ip in normalized):
            raise MediaRejectedError(
                "image URL resolves to a private or reserved address", code="image_url_not_allowed"
            )
        return normalized


def pinned_request(
    url: httpx.URL, address: IPAddress, headers: dict[str, str], timeout: httpx.Timeout
) -> httpx.Request:
    """A request for url that connects to address: IP literal host, original Host header and SNI.

    Built directly (not client.build_request) so the shared client's default headers, cookies
    and base_url never reach an arbitrary image host. httpcore pools by (scheme, IP, port): a
    TLS connection opened for one name may serve another name on the same checked address.
    """
    host_header = url.netloc.decode("ascii")
    pinned = url.copy_with(host=str(address))
    extensions: dict[str, object] = {"timeout": timeout.as_dict()}
    if url.scheme == "https":
        extensions["sni_hostname"] = url.raw_host.decode("ascii")
    return httpx.Request(
        "GET", pinned, headers={**headers, "Host": host_header}, extensions=extensions
    )
