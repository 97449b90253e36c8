"""OAuth 2.1 for MCP servers, as the MCP authorization spec describes it, sans-IO.

    protocol_options: {oauth: {redirect_uri: "http://127.0.0.1:3000/callback"}}     # dynamic registration
    protocol_options: {oauth: {client_id: ..., client_secret: ...}}                  # a configured client
    protocol_options: {oauth: {grant: client_credentials, client_id: ..., private_key_pem: ...}}

A server that answers 401 (or 403 ``insufficient_scope``) starts a flow: the
protected-resource metadata (RFC 9728: the ``WWW-Authenticate``
``resource_metadata``, then the path-based and root well-known URLs), the
authorization server's metadata (RFC 8414 and OpenID discovery, path-aware, its
``issuer`` checked), dynamic client registration (RFC 7591) unless a client is
configured or a client-metadata URL may be used, then the authorization code
grant with PKCE (S256), ``state``, ``resource`` (RFC 8707) and the RFC 9207
``iss`` check, or the client-credentials grant. Scopes: the challenge's, else
the resource's ``scopes_supported``, else none; a step-up asks for the union.
An expired access token is refreshed first when a refresh token is held.

A flow is a generator: it yields :class:`HttpRequest` s and is sent back each
:class:`HttpResponse`, so the transport that runs MCP's handshake runs it too.
The authorization request is sent as is and its redirect read (an authorization
server that approves without a person, as a pre-consented client's does); one
that shows a login page instead raises :class:`~reach_plugins.errors.Unauthenticated`
naming the URL to open. Client authentication (``client_secret_basic``,
``client_secret_post``, ``none``, ``private_key_jwt``), the PKCE challenge and
the grant parameters come from authlib.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from authlib.common.security import generate_token
from authlib.oauth2.auth import ClientAuth
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri
from authlib.oauth2.rfc7523 import PrivateKeyJWT
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey

from reach_plugins.errors import ConfigError, Unauthenticated
from reach_plugins.protocols.base import HttpRequest, HttpResponse, header

Flow = Generator[HttpRequest, HttpResponse, None]
"""An OAuth exchange: the requests to send, each answered by its response; it ends with the grant kept."""
MAX_FLOWS = 2
"""Authorizations one handshake may run: a server refusing every fresh token is not asked forever."""

FORM = "application/x-www-form-urlencoded"
METHODS = ("client_secret_basic", "client_secret_post", "none", "private_key_jwt")
GRANTS = ("authorization_code", "client_credentials", "jwt_bearer")
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
DPOP_ALGORITHM = "ES256"
_CHALLENGE = re.compile(r'(\w+)=(?:"([^"]*)"|([^\s,]+))')


@dataclass(frozen=True, slots=True)
class OAuthSettings:
    """``protocol_options.oauth``: how this client gets tokens for an MCP server."""

    redirect_uri: str = "http://127.0.0.1:33418/callback"
    client_name: str = "reach-plugins"
    grant: str = "authorization_code"
    client_id: str | None = None
    client_secret: str | None = None
    private_key_pem: str | None = None
    signing_algorithm: str = "ES256"
    token_endpoint_auth_method: str | None = None
    client_metadata_url: str | None = None
    scope: str | None = None
    idp_token_endpoint: str | None = None
    """``jwt_bearer`` (enterprise-managed authorization, SEP-990): the enterprise IdP's token endpoint, where
    ``idp_id_token`` is exchanged (RFC 8693, as ``idp_client_id``) for an ID-JAG to present to the server's AS."""
    idp_client_id: str | None = None
    idp_id_token: str | None = None
    assertion: str | None = None
    """``jwt_bearer`` with a workload identity (SEP-1933): the JWT presented as the grant, as is."""

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> OAuthSettings:
        unknown = sorted(set(options) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(
                f"unknown protocol_options.oauth keys {unknown}; known: {sorted(cls.__dataclass_fields__)}"
            )
        settings = cls(**{key: str(value) for key, value in options.items() if value is not None})
        if settings.grant not in GRANTS:
            raise ConfigError(f"protocol_options.oauth.grant {settings.grant!r}: use one of {', '.join(GRANTS)}")
        if settings.grant != "authorization_code" and not settings.client_id:
            raise ConfigError(f"protocol_options.oauth.grant {settings.grant} needs client_id (and a secret or key)")
        exchangeable = settings.idp_token_endpoint and settings.idp_id_token
        if settings.grant == "jwt_bearer" and not (settings.assertion or exchangeable):
            raise ConfigError(
                "protocol_options.oauth.grant jwt_bearer needs an assertion, or idp_token_endpoint and idp_id_token"
            )
        method = settings.token_endpoint_auth_method
        if method is not None and method not in METHODS:
            raise ConfigError(f"protocol_options.oauth.token_endpoint_auth_method {method!r}: use one of {METHODS}")
        return settings


def challenge(response: HttpResponse) -> dict[str, str]:
    """The parameters of a ``WWW-Authenticate: Bearer ...`` challenge (``resource_metadata``, ``scope``, ``error``)."""
    value = header(response.headers, "WWW-Authenticate") or ""
    return {match[1]: match[2] or match[3] for match in _CHALLENGE.finditer(value)}


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def resource_of(server_url: str) -> str:
    """The canonical resource URI of an MCP server (RFC 8707): lower-case scheme and host, no fragment."""
    parts = urlsplit(server_url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path}" + (f"?{parts.query}" if parts.query else "")


def _covers(configured: str, requested: str) -> bool:
    """``configured`` (a resource metadata's ``resource``) names ``requested`` or a parent path of it."""
    configured, requested = resource_of(configured), resource_of(requested)
    if _origin(configured) != _origin(requested):
        return False
    parent = urlsplit(configured).path.rstrip("/")
    path = urlsplit(requested).path
    return path.rstrip("/") == parent or path.startswith(parent + "/")


def _loopback(url: str) -> bool:
    """A redirect to this machine (a native app's, per OpenID registration), not to a web server."""
    host = urlsplit(url).hostname or ""
    return host == "localhost" or host.startswith("127.") or host == "::1"


def _union(first: str | None, second: str | None) -> str | None:
    scopes = [*(first or "").split(), *(second or "").split()]
    return " ".join(dict.fromkeys(scopes)) or None


def _json(response: HttpResponse) -> dict[str, Any] | None:
    if response.status != 200:
        return None
    try:
        value = json.loads(response.body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _get(url: str) -> HttpRequest:
    return HttpRequest("GET", url, {"Accept": "application/json"})


def protected_resource_urls(server_url: str, advertised: str | None) -> list[str]:
    """Where the resource's metadata may be (RFC 9728): the challenge's URL, then path-based, then root."""
    origin, path = _origin(server_url), urlsplit(server_url).path.rstrip("/")
    urls = [advertised] if advertised else []
    if path:
        urls.append(f"{origin}/.well-known/oauth-protected-resource{path}")
    return [*urls, f"{origin}/.well-known/oauth-protected-resource"]


def server_metadata_urls(issuer: str) -> list[str]:
    """Where an authorization server's metadata may be: RFC 8414 and OpenID discovery, path-aware."""
    origin, path = _origin(issuer), urlsplit(issuer).path.rstrip("/")
    if not path:
        return [f"{origin}/.well-known/oauth-authorization-server", f"{origin}/.well-known/openid-configuration"]
    return [
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{origin}/.well-known/openid-configuration{path}",
        f"{origin}{path}/.well-known/openid-configuration",
    ]


@dataclass(slots=True)
class OAuthClient:
    """What one MCP server taught this client: its metadata, the client registered with it, the tokens held."""

    server_url: str
    settings: OAuthSettings
    resource_metadata: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    issuer: str | None = None
    client: dict[str, Any] | None = None
    scope: str | None = None
    access_token: str | None = None
    refresh_token: str | None = None
    expires_at: float | None = None
    refused: HttpResponse | None = None
    """A call's 401/403 answer, kept until the next attempt authorizes again."""
    token_type: str = "Bearer"
    dpop: DPoP | None = None
    """The key proving possession of the tokens (RFC 9449), when the authorization server offers DPoP."""

    def __post_init__(self) -> None:
        settings = self.settings
        self.scope = settings.scope
        if settings.client_id:
            secret = settings.client_secret or settings.private_key_pem
            method = settings.token_endpoint_auth_method or (
                "private_key_jwt" if settings.private_key_pem else "client_secret_basic" if secret else "none"
            )
            self.client = {"client_id": settings.client_id, "client_secret": secret, "method": method}

    def authorization(self, method: str, url: str) -> dict[str, str]:
        """The headers authorizing a request to the server, when a token is held: ``Bearer``, or ``DPoP`` with a
        fresh proof bound to the request and the token."""
        if not self.access_token:
            return {}
        if self.dpop is None or self.token_type.lower() != "dpop":
            return {"Authorization": f"Bearer {self.access_token}"}
        proof = self.dpop.proof(method, url, self.dpop.resource_nonce, self.access_token)
        return {"Authorization": f"DPoP {self.access_token}", "DPoP": proof}

    def expired(self, now: float) -> bool:
        return self.access_token is not None and self.expires_at is not None and now >= self.expires_at

    def refresh(self, now: float) -> Flow:
        """Trade the refresh token for a new access token; on refusal the tokens are dropped (a 401 follows)."""
        token = {"grant_type": "refresh_token", "refresh_token": self.refresh_token or ""}
        response = yield from self._token(token)
        if not self._keep(response, now):
            self.access_token = self.refresh_token = None

    def authorize(self, refused: HttpResponse, now: float) -> Flow:
        """The whole flow after ``refused`` (a 401, or a 403 asking for more scope): discover, register, grant."""
        params = challenge(refused)
        step_up = refused.status == 403
        if not step_up or self.metadata is None:
            yield from self._discover(params.get("resource_metadata"))
        wanted = params.get("scope") or " ".join((self.resource_metadata or {}).get("scopes_supported") or []) or None
        self.scope = _union(self.scope, wanted) if step_up else (wanted or self.settings.scope)
        supported = (self.metadata or {}).get("scopes_supported") or []
        if self.scope and "offline_access" in supported and "offline_access" not in self.scope.split():
            self.scope = f"{self.scope} offline_access"
        if self.settings.grant == "client_credentials":
            response = yield from self._token({"grant_type": "client_credentials", "scope": self.scope or ""})
        elif self.settings.grant == "jwt_bearer":
            assertion = yield from self._identity_assertion()
            response = yield from self._token({"grant_type": JWT_BEARER, "assertion": assertion, "scope": ""})
        else:
            if self.client is None:
                yield from self._register()
            response = yield from self._code_grant()
        if not self._keep(response, now):
            raise Unauthenticated(
                f"the token endpoint of {self.issuer} refused the grant: HTTP {response.status} {response.body[:200]!r}"
            )

    def _discover(self, advertised: str | None) -> Generator[HttpRequest, HttpResponse, None]:
        self.resource_metadata = None
        for url in protected_resource_urls(self.server_url, advertised):
            found = _json((yield _get(url)))
            if found is not None and isinstance(found.get("authorization_servers"), list):
                resource = str(found.get("resource") or "")
                if resource and not _covers(resource, self.server_url):
                    raise Unauthenticated(
                        f"the protected-resource metadata of {self.server_url} names another resource, {resource!r}: "
                        "no token is asked for it"
                    )
                self.resource_metadata = found
                break
        servers = (self.resource_metadata or {}).get("authorization_servers") or []
        issuer = str(servers[0]) if servers else _origin(self.server_url)
        if self.issuer is not None and issuer != self.issuer and self.client is not None:
            if not self.settings.client_id:
                self.client = None  # registered with the old server: register with the new one
            self.access_token = self.refresh_token = None
        self.issuer, self.metadata = issuer, None
        for url in server_metadata_urls(issuer):
            found = _json((yield _get(url)))
            if found is None:
                continue
            named = str(found.get("issuer") or "")
            legacy = not servers  # no resource metadata: the issuer is the server's origin, with or without "/"
            if (named.rstrip("/") != issuer.rstrip("/")) if legacy else (named != issuer):
                raise Unauthenticated(
                    f"the authorization server metadata at {url} names issuer {named!r}, not {issuer!r}: not trusted"
                )
            self.issuer, self.metadata = named, found
            algorithms = found.get("dpop_signing_alg_values_supported")
            if self.dpop is None and isinstance(algorithms, list) and DPOP_ALGORITHM in algorithms:
                self.dpop = DPoP()
            break

    def _endpoint(self, name: str, fallback: str) -> str:
        return str((self.metadata or {}).get(name) or f"{_origin(self.issuer or self.server_url)}{fallback}")

    def _register(self) -> Generator[HttpRequest, HttpResponse, None]:
        settings = self.settings
        if settings.client_metadata_url and (self.metadata or {}).get("client_id_metadata_document_supported"):
            self.client = {"client_id": settings.client_metadata_url, "client_secret": None, "method": "none"}
            return
        body: dict[str, Any] = {
            "client_name": settings.client_name,
            "redirect_uris": [settings.redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "application_type": "native" if _loopback(settings.redirect_uri) else "web",
        }
        supported = (self.metadata or {}).get("token_endpoint_auth_methods_supported")
        if isinstance(supported, list) and supported and "client_secret_basic" not in supported:
            body["token_endpoint_auth_method"] = next((m for m in METHODS if m in supported), supported[0])
        if self.scope:
            body["scope"] = self.scope
        url = self._endpoint("registration_endpoint", "/register")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        response = yield HttpRequest("POST", url, headers, json.dumps(body).encode())
        registered = json.loads(response.body) if response.status in (200, 201) and response.body else None
        if not isinstance(registered, dict) or not registered.get("client_id"):
            raise Unauthenticated(f"dynamic client registration at {url} failed: HTTP {response.status}")
        secret = registered.get("client_secret")
        method = registered.get("token_endpoint_auth_method") or ("client_secret_basic" if secret else "none")
        self.client = {"client_id": registered["client_id"], "client_secret": secret, "method": method}

    def _code_grant(self) -> Generator[HttpRequest, HttpResponse, HttpResponse]:
        assert self.client is not None
        verifier, state = generate_token(64), generate_token(32)
        extra = {"code_challenge": create_s256_code_challenge(verifier), "code_challenge_method": "S256"}
        if self.scope and "offline_access" in self.scope.split():
            extra["prompt"] = "consent"
        url = prepare_grant_uri(
            self._endpoint("authorization_endpoint", "/authorize"),
            self.client["client_id"],
            "code",
            redirect_uri=self.settings.redirect_uri,
            scope=self.scope,
            state=state,
            resource=self._resource(),
            **extra,
        )
        answer = yield HttpRequest("GET", url, {})
        location = header(answer.headers, "Location") or ""
        query = dict(parse_qsl(urlsplit(location).query)) if 300 <= answer.status < 400 else {}
        if "code" not in query:
            raise Unauthenticated(
                f"the MCP server {self.server_url} needs a person to authorize this client: open {url}",
                authorization_url=url,
            )
        if query.get("state") != state:
            raise Unauthenticated("the authorization response's state does not match the request's: refused")
        self._check_issuer(query.get("iss"))
        token = {"grant_type": "authorization_code", "code": query["code"], "redirect_uri": self.settings.redirect_uri}
        return (yield from self._token({**token, "code_verifier": verifier}))

    def _identity_assertion(self) -> Generator[HttpRequest, HttpResponse, str]:
        """The assertion to present: the configured workload JWT, or the ID-JAG the enterprise IdP gives in
        exchange for its ID token."""
        settings = self.settings
        if settings.assertion:
            return settings.assertion
        form = {
            "grant_type": TOKEN_EXCHANGE,
            "requested_token_type": "urn:ietf:params:oauth:token-type:id-jag",
            "subject_token": settings.idp_id_token or "",
            "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
            "audience": self.issuer or "",
            "resource": self._resource(),
            "client_id": settings.idp_client_id or "",
        }
        headers = {"Content-Type": FORM, "Accept": "application/json"}
        url = settings.idp_token_endpoint or ""
        answer = _json((yield HttpRequest("POST", url, headers, urlencode(form).encode())))
        if answer is None or not answer.get("access_token"):
            raise Unauthenticated(f"the identity provider at {url} refused to exchange the ID token for this server")
        return str(answer["access_token"])

    def _check_issuer(self, iss: str | None) -> None:
        """RFC 9207: an ``iss`` in the authorization response names the server asked; required when it says so."""
        expected = str((self.metadata or {}).get("issuer") or self.issuer)
        if iss is not None and iss != expected:
            raise Unauthenticated(f"the authorization response comes from issuer {iss!r}, not {expected!r}: refused")
        if iss is None and (self.metadata or {}).get("authorization_response_iss_parameter_supported") is True:
            raise Unauthenticated(f"the authorization response of {expected!r} lacks the iss it promises: refused")

    def _resource(self) -> str:
        resource = str((self.resource_metadata or {}).get("resource") or "")
        return resource if resource and _covers(resource, self.server_url) else resource_of(self.server_url)

    def _token(self, form: dict[str, str]) -> Generator[HttpRequest, HttpResponse, HttpResponse]:
        """A token request; asked for a DPoP nonce (RFC 9449 section 8), sent once more with it."""
        response = yield self._token_request(form)
        if self.dpop is not None and self._nonce_asked(response):
            self.dpop.server_nonce = header(response.headers, "DPoP-Nonce")
            response = yield self._token_request(form)
        return response

    def _nonce_asked(self, response: HttpResponse) -> bool:
        asked = response.status in (400, 401) and header(response.headers, "DPoP-Nonce") is not None
        return asked and (b"use_dpop_nonce" in response.body or challenge(response).get("error") == "use_dpop_nonce")

    def resource_nonce(self, response: HttpResponse) -> bool:
        """The MCP server asks for a DPoP nonce (RFC 9449 section 9): kept, and the request is to be sent again."""
        if self.dpop is None or not self._nonce_asked(response):
            return False
        self.dpop.resource_nonce = header(response.headers, "DPoP-Nonce")
        return True

    def _token_request(self, form: dict[str, str]) -> HttpRequest:
        """A token-endpoint request carrying ``form``, the resource and the client's authentication."""
        url = self._endpoint("token_endpoint", "/token")
        client = self.client or {"client_id": self.settings.client_id or "", "client_secret": None, "method": "none"}
        fields = {key: value for key, value in {**form, "resource": self._resource()}.items() if value}
        method, secret = client["method"], client["client_secret"]
        if method == "private_key_jwt":
            algorithm = self.settings.signing_algorithm
            key = (ECKey if algorithm.startswith("ES") else RSAKey).import_key(str(secret))
            # the assertion's audience is the issuer (RFC 7523bis), which servers accept where the endpoint was asked
            auth = ClientAuth(client["client_id"], key, PrivateKeyJWT(self.issuer or url, alg=algorithm))
        else:
            auth = ClientAuth(client["client_id"], secret, method if secret and method in METHODS else "none")
        headers = {"Content-Type": FORM, "Accept": "application/json"}
        if self.dpop is not None:
            headers["DPoP"] = self.dpop.proof("POST", url, self.dpop.server_nonce)
        url, headers, body = auth.prepare("POST", url, headers, urlencode(fields))
        return HttpRequest("POST", url, headers, body.encode())

    def _keep(self, response: HttpResponse, now: float) -> bool:
        token = _json(response)
        if token is None or not token.get("access_token"):
            return False
        self.access_token = str(token["access_token"])
        self.token_type = str(token.get("token_type") or "Bearer")
        self.refresh_token = str(token.get("refresh_token") or self.refresh_token or "") or None
        expires = token.get("expires_in")
        self.expires_at = now + float(expires) if isinstance(expires, int | float) else None
        self.scope = str(token.get("scope") or self.scope or "") or None
        return True


class DPoP:
    """An ES256 key and the proofs it signs (RFC 9449): one per request, bound to its method, URL, the server's
    nonce and the access token it carries."""

    def __init__(self) -> None:
        self._key = ECKey.generate_key("P-256")
        self.server_nonce: str | None = None
        """The authorization server's nonce, once it asked for one."""
        self.resource_nonce: str | None = None
        """The MCP server's nonce, once it asked for one."""

    def proof(self, method: str, url: str, nonce: str | None, token: str | None = None) -> str:
        parts = urlsplit(url)
        claims: dict[str, Any] = {
            "jti": generate_token(24),
            "htm": method,
            "htu": f"{parts.scheme}://{parts.netloc}{parts.path}",
            "iat": int(time.time()),
        }
        if token is not None:
            digest = hashlib.sha256(token.encode()).digest()
            claims["ath"] = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        if nonce is not None:
            claims["nonce"] = nonce
        header_ = {"typ": "dpop+jwt", "alg": DPOP_ALGORITHM, "jwk": self._key.as_dict(private=False)}
        return str(jwt.encode(header_, claims, self._key))


class Running:
    """One flow under way for one call: the request it waits on, fed each answer until it ends."""

    def __init__(self, flow: Flow) -> None:
        self._flow = flow
        self.request: HttpRequest | None = next(flow, None)

    def feed(self, response: HttpResponse) -> None:
        try:
            self.request = self._flow.send(response)
        except StopIteration:
            self.request = None


def needs_authorization(response: HttpResponse) -> bool:
    """A 401, or a 403 whose challenge asks for more scope (a step-up)."""
    return response.status == 401 or (
        response.status == 403 and challenge(response).get("error") == "insufficient_scope"
    )
