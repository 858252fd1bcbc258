"""The official Python MCP client (mcp 2.x) against the server as an OAuth resource server, with
tokens from a real authorization server (tests/oauth/issuer.mjs, npm oidc-provider).

Usage: client.py MCP_URL ISSUER_URL

In both client modes ("2026-07-28" and "legacy"), for three clients whose tokens are JWTs signed with
RS256, ES256 and EdDSA (and a fourth whose tokens are opaque, checked by introspection): the client starts without a token, gets the server's 401, follows its
RFC 9728 metadata to the issuer, gets a client-credentials token for this resource and calls
run_python_code. Then: the first token holds the least scope (code:run) and tools/list shows
only what it allows; a session call gets 403 insufficient_scope and the client steps up to a token
with sessions:write; one client's session is unknown to another; after the issuer rotates its
keys, a token signed with a new key is accepted (the server refreshes its key set on the unknown
key id); without a token and with a forged one the server answers 401 with the challenge.
A user's agent (erin) gets its token under the authorization-code grant with PKCE instead: the test's
browser logs in and consents on the issuer's pages.
Prints one line per check and ends with "N passed, M failed"; exits non-zero on any failure.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import traceback
from typing import Any
from urllib.parse import parse_qs, urljoin, urlparse

import httpx2
import jwt
from mcp import Client
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

MODES = ("2026-07-28", "legacy")
CLIENTS = {"alice": "RS256", "bob": "ES256", "carol": "EdDSA"}
SCOPES = "code:run sessions:read sessions:write"
TOOL = "run_python_code"
# The user agent's redirect URI (registered in issuer.mjs); never served: the browser stops there.
USER_REDIRECT = "http://127.0.0.1:9/callback"


class Memory(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


class Session:
    """One OAuth client's connection: its token storage and an MCP client over it (client
    credentials, or a user's authorization code when `browser` is given)."""

    def __init__(self, url: str, issuer: str, name: str, mode: str, browser: Browser | None = None) -> None:
        self.storage = Memory()
        if browser is None:
            provider = ClientCredentialsOAuthProvider(
                server_url=url,
                storage=self.storage,
                client_id=name,
                client_secret=f"{name}-secret",
                scope=SCOPES,
                issuer=issuer,
            )
        else:
            metadata = dict(
                redirect_uris=[USER_REDIRECT],
                grant_types=["authorization_code"],
                response_types=["code"],
                token_endpoint_auth_method="none",
                scope=SCOPES,
            )
            # Registered with the issuer beforehand (no dynamic registration).
            self.storage.client_info = OAuthClientInformationFull(client_id=name, **metadata)
            provider = OAuthClientProvider(
                server_url=url,
                client_metadata=OAuthClientMetadata(**metadata),
                storage=self.storage,
                redirect_handler=browser.visit,
                callback_handler=browser.returned,
            )
        self.http = httpx2.AsyncClient(auth=provider, timeout=120)
        self.client = Client(streamable_http_client(url, http_client=self.http), mode=mode, raise_exceptions=True)

    async def __aenter__(self) -> Session:
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.client.__aexit__(*exc)
        await self.http.aclose()

    async def run(self, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self.client.call_tool(TOOL, arguments, read_timeout_seconds=120)
        return result.structured_content or {}

    def header(self) -> dict[str, Any]:
        check(self.storage.tokens is not None, "no token was obtained")
        return jwt.get_unverified_header(self.storage.tokens.access_token)

    def claims(self) -> dict[str, Any]:
        return jwt.decode(self.storage.tokens.access_token, options={"verify_signature": False})


class Browser:
    """A user at the authorization server: follows the authorization URL's redirects, logs in as
    `user` and consents on oidc-provider's development pages, and keeps the code and state of the
    redirect back to the client (which it does not follow)."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.result: AuthorizationCodeResult | None = None

    async def visit(self, url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=30) as http:
            for _ in range(12):
                r = await http.get(url)
                if r.status_code in (302, 303):
                    url = urljoin(url, r.headers["location"])
                    if url.startswith(USER_REDIRECT):
                        query = parse_qs(urlparse(url).query)
                        check("code" in query, f"the authorization failed: {query}")
                        first = lambda k: (query.get(k) or [None])[0]  # noqa: E731
                        self.result = AuthorizationCodeResult(code=first("code"), state=first("state"), iss=first("iss"))
                        return
                    continue
                check(r.status_code == 200, f"{url}: {r.status_code} {r.text[:200]}")
                prompt = "login" if 'name="prompt" value="login"' in r.text else "consent"
                form = {"prompt": prompt, **({"login": self.user} if prompt == "login" else {})}
                r = await http.post(url, data=form)
                check(r.status_code in (302, 303), f"{prompt}: {r.status_code} {r.text[:200]}")
                url = urljoin(url, r.headers["location"])
        raise AssertionError("the authorization took too many redirects")

    async def returned(self) -> AuthorizationCodeResult:
        check(self.result is not None, "the authorization server never redirected back")
        return self.result


async def check_authorization_code(url: str, issuer: str, mode: str) -> None:
    """A user's agent: the 401, the metadata, then the authorization-code grant with PKCE (the
    user logs in and consents), a token for this resource whose subject is the user, and calls."""
    async with Session(url, issuer, "erin", mode, Browser("erin-user")) as erin, Session(url, issuer, "alice", mode) as alice:
        r = await erin.run({"code": "6 * 7"})
        check(r.get("result") == "42", f"erin: {r}")
        claims = erin.claims()
        check(claims["sub"] == "erin-user" and claims["client_id"] == "erin", f"erin's token: {claims}")
        check(claims["aud"] == url and claims["iss"] == issuer, f"erin's token: {claims}")
        # A user's session is the user's: the step-up to sessions:write goes through the
        # authorization server again (the user consents to the new scope), and no other principal
        # reaches the session.
        check(erin.claims()["scope"] == "code:run", f"erin's first token: {erin.claims()['scope']}")
        r = await erin.run({"code": "mine = 6", "session_id": "new"})
        sid = r.get("session_id")
        check(isinstance(sid, str), f"no session: {r}")
        check("sessions:write" in erin.claims()["scope"].split(), f"erin's step-up: {erin.claims()}")
        r = await erin.run({"code": "mine * 7", "session_id": sid})
        check(r.get("result") == "42", f"erin's session: {r}")
        await tool_names(alice)
        r = await alice.run({"code": "mine", "session_id": sid})
        check((r.get("error") or {}).get("type") == "SessionNotFound", f"alice reached erin's session: {r}")


async def check_each_algorithm(url: str, issuer: str, mode: str) -> None:
    for name, alg in CLIENTS.items():
        async with Session(url, issuer, name, mode) as s:
            r = await s.run({"code": "6 * 7"})
            check(r.get("result") == "42", f"{name}: {r}")
            check(s.header()["alg"] == alg, f"{name}: token alg {s.header()}")
            check(s.header()["typ"] == "at+jwt", f"{name}: token typ {s.header()}")
            claims = s.claims()
            check(claims["aud"] == url and claims["iss"] == issuer, f"{name}: claims {claims}")


async def tool_names(s: Session) -> set[str]:
    return {t.name for t in (await s.client.list_tools()).tools}


async def check_sessions_belong_to_their_client(url: str, issuer: str, mode: str) -> None:
    async with Session(url, issuer, "alice", mode) as alice, Session(url, issuer, "bob", mode) as bob:
        # As agents do, the tools first: the 401 names the least scope (code:run), and the list
        # shows only what that token may call.
        names = await tool_names(alice)
        check("run_python_code" in names and "clear_session" not in names, f"code:run token sees {names}")
        check(alice.claims()["scope"] == "code:run", f"first token: {alice.claims()['scope']}")
        # A session call needs sessions:write: the server answers 403 insufficient_scope, the client
        # steps up (SEP-2350) to a token with both scopes and retries.
        r = await alice.run({"code": "secret = 7", "session_id": "new"})
        check(set(alice.claims()["scope"].split()) == {"code:run", "sessions:write"}, f"after step-up: {alice.claims()}")
        names = await tool_names(alice)
        check({"clear_session", "list_session_files"} <= names, f"after step-up the list is {names}")
        await tool_names(bob)
        sid = r.get("session_id")
        check(isinstance(sid, str), f"no session id: {r}")
        r = await bob.run({"code": "secret", "session_id": sid})
        check((r.get("error") or {}).get("type") == "SessionNotFound", f"bob reached alice's session: {r}")
        r = await alice.run({"code": "secret * 6", "session_id": sid})
        check(r.get("result") == "42", f"alice lost her session: {r}")


async def check_opaque_token(url: str, issuer: str, mode: str) -> None:
    async with Session(url, issuer, "dave", mode) as dave, Session(url, issuer, "alice", mode) as alice:
        await tool_names(dave)
        token = dave.storage.tokens.access_token
        check(token.count(".") != 2, f"dave's token is a JWT: {token[:20]}...")
        r = await dave.run({"code": "mine = 5", "session_id": "new"})
        sid = r.get("session_id")
        check(isinstance(sid, str), f"no session: {r}")
        r = await dave.run({"code": "mine * 2", "session_id": sid})
        check(r.get("result") == "10", f"dave's session: {r}")
        await tool_names(alice)
        r = await alice.run({"code": "mine", "session_id": sid})
        check((r.get("error") or {}).get("type") == "SessionNotFound", f"alice reached dave's session: {r}")


async def check_rotation(url: str, issuer: str, mode: str) -> None:
    async with Session(url, issuer, "carol", mode) as before:
        await before.run({"code": "1"})
        old_kid = before.header()["kid"]
    async with httpx2.AsyncClient() as http:
        r = await http.post(f"{issuer}/_test/rotate")
        check(r.status_code == 200, f"rotate: {r.status_code}")
    # The server refreshes at most once a second (JWKS_MIN_REFRESH_INTERVAL_S=1): wait well past it.
    await asyncio.sleep(2.5)
    async with Session(url, issuer, "carol", mode) as after:
        r = await after.run({"code": "2 + 2"})
        check(r.get("result") == "4", f"after rotation: {r}")
        check(after.header()["kid"] != old_kid, f"the new token kept kid {old_kid}")


async def check_challenges(url: str, issuer: str, mode: str) -> None:
    del mode
    base = url.rsplit("/mcp", 1)[0]
    metadata_url = f"{base}/.well-known/oauth-protected-resource/mcp"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx2.AsyncClient() as http:
        r = await http.post(url, json=body, headers={"Accept": "application/json, text/event-stream"})
        check(r.status_code == 401, f"no token: {r.status_code}")
        check(
            r.headers["www-authenticate"] == f'Bearer resource_metadata="{metadata_url}", scope="code:run"',
            f"challenge: {r.headers['www-authenticate']}",
        )
        doc = (await http.get(metadata_url)).json()
        check(doc["resource"] == url and doc["authorization_servers"] == [issuer], f"metadata: {doc}")
        # A token of the right shape whose signature is not the issuer's.
        header = base64.urlsafe_b64encode(json.dumps({"typ": "at+jwt", "alg": "RS256", "kid": "rs256-1"}).encode())
        claims = base64.urlsafe_b64encode(json.dumps({"iss": issuer, "sub": "x", "aud": url, "exp": 4102444800}).encode())
        forged = f"{header.decode().rstrip('=')}.{claims.decode().rstrip('=')}.AAAA"
        r = await http.post(
            url,
            json=body,
            headers={"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {forged}"},
        )
        check(r.status_code == 401, f"forged token: {r.status_code}")
        check('error="invalid_token"' in r.headers["www-authenticate"], r.headers["www-authenticate"])


CHECKS = (
    check_each_algorithm,
    check_authorization_code,
    check_sessions_belong_to_their_client,
    check_opaque_token,
    check_rotation,
    check_challenges,
)


async def main(url: str, issuer: str) -> int:
    async with httpx2.AsyncClient() as http:
        r = await http.post(f"{issuer}/_test/resource", params={"url": url})
        check(r.status_code == 204, f"could not name the resource: {r.status_code}")
    passed = failed = 0
    for mode in MODES:
        for test in CHECKS:
            name = f"[{mode}] {test.__name__}"
            try:
                await asyncio.wait_for(test(url, issuer, mode), 240)
            except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
                failed += 1
                print(f"FAIL {name}: {e!r}")
                traceback.print_exc()
            else:
                passed += 1
                print(f"ok   {name}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
