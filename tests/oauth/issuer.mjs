// A real authorization server for the OAuth tests: npm oidc-provider (pinned in package.json) on a
// free loopback port, issuing access tokens for one resource (RFC 8707) under the client-credentials
// grant. Clients: alice (JWT access tokens, RFC 9068, signed RS256), bob (ES256), carol (EdDSA), dave
// (opaque tokens, checked by the server through introspection, RFC 7662), each with the scopes
// code:run sessions:read sessions:write; erin, a public client of a user under the authorization-code
// grant with PKCE (the development login and consent pages); code-interpreter-mcp is the server's
// own client, the only one allowed to introspect. Prints `issuer URL` once it listens.
//
// POST /_test/resource?url=R names the resource (the MCP server's URL, known once it listens);
// POST /_test/rotate swaps in a new signing key of each algorithm (the old ones stay published, so
// tokens already issued stay valid); the next tokens carry the new key ids.
//
// Usage: node issuer.mjs
import * as http from 'node:http';
import * as crypto from 'node:crypto';
import Provider, { errors } from 'oidc-provider';

let RESOURCE = '';
const SCOPES = 'code:run sessions:read sessions:write';
const ALG_OF = { alice: 'RS256', bob: 'ES256', carol: 'EdDSA', dave: null, erin: 'RS256' };
// erin is a user's agent: its tokens come from the authorization-code grant, not client credentials.
const USER_AGENT = 'erin';
const USER_AGENT_REDIRECT = 'http://127.0.0.1:9/callback';
const INTROSPECTOR = 'code-interpreter-mcp';

let generation = 0;
function keyOf(kind, alg) {
  const options = kind === 'rsa' ? { modulusLength: 2048 } : kind === 'ec' ? { namedCurve: 'P-256' } : {};
  const { privateKey } = crypto.generateKeyPairSync(kind, options);
  const jwk = privateKey.export({ format: 'jwk' });
  return { ...jwk, kid: `${alg.toLowerCase()}-${generation}`, use: 'sig', alg };
}
function keySet() {
  generation += 1;
  return [keyOf('rsa', 'RS256'), keyOf('ec', 'ES256'), keyOf('ed25519', 'EdDSA')];
}

const server = http.createServer();
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const ISSUER = `http://127.0.0.1:${server.address().port}`;

let keys = keySet();
function provider() {
  const p = new Provider(ISSUER, {
    clients: [
      ...[...Object.keys(ALG_OF).filter((id) => id !== USER_AGENT), INTROSPECTOR].map((id) => ({
        client_id: id,
        client_secret: `${id}-secret`,
        grant_types: ['client_credentials'],
        redirect_uris: [],
        response_types: [],
        scope: SCOPES,
      })),
      // A user's agent: a public native client (PKCE, no secret) under the authorization-code grant.
      {
        client_id: USER_AGENT,
        application_type: 'native',
        token_endpoint_auth_method: 'none',
        grant_types: ['authorization_code'],
        response_types: ['code'],
        redirect_uris: [USER_AGENT_REDIRECT],
        scope: SCOPES,
      },
    ],
    // Newest keys first: the provider signs with the first key of an algorithm.
    jwks: { keys },
    scopes: ['openid', ...SCOPES.split(' ')],
    features: {
      clientCredentials: { enabled: true },
      introspection: {
        enabled: true,
        allowedPolicy: (ctx, client) => client.clientId === INTROSPECTOR,
      },
      // The login and consent pages a user sees (any login; the test's "browser" fills them in).
      devInteractions: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: (ctx, client, oneOf) => oneOf ?? RESOURCE,
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, resource, client) => {
          if (resource !== RESOURCE) throw new errors.InvalidTarget();
          return {
            scope: SCOPES,
            audience: RESOURCE,
            accessTokenTTL: 300,
            ...(ALG_OF[client.clientId]
              ? { accessTokenFormat: 'jwt', jwt: { sign: { alg: ALG_OF[client.clientId] } } }
              : { accessTokenFormat: 'opaque' }),
          };
        },
      },
    },
    cookies: { keys: [crypto.randomBytes(32).toString('hex')] },
  });
  return p.callback();
}

let handler = provider();
server.on('request', (req, res) => {
  if (req.method === 'POST' && req.url.startsWith('/_test/resource?')) {
    RESOURCE = new URL(req.url, ISSUER).searchParams.get('url');
    res.writeHead(204);
    res.end();
    return;
  }
  if (req.method === 'POST' && req.url === '/_test/rotate') {
    keys = [...keySet(), ...keys];
    handler = provider();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kids: keys.map((k) => k.kid) }));
    return;
  }
  handler(req, res);
});
console.log(`issuer ${ISSUER}`);
