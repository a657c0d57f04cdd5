// A real OpenID Connect provider (npm's oidc-provider) for the backend's
// tests and local demo. Unlike the library's development pages, it checks
// passwords: a wrong password is refused, so tests can show that it is.
//
// Configuration is one JSON object, from the file named by the first
// argument or from the environment variable OIDC_PROVIDER_CONFIG:
//
//   {
//     "host": "127.0.0.1",          // listen address (default 127.0.0.1)
//     "port": 0,                    // 0 picks a free port (default 0)
//     "clientID": "kube-bind",
//     "clientSecret": "…",
//     "redirectURIs": ["http://127.0.0.1:8080/callback"],
//     "users": [{"name": "alice", "password": "…", "email": "…", "groups": ["…"]}]
//     (a user may also have "emailVerified": <any JSON> or "noEmailVerified": true)
//   }
//
// Once it serves, it prints one line to stdout: {"issuer": "http://127.0.0.1:PORT"}.
// The subject (sub) of a user is its name.

import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import Provider from 'oidc-provider';

const maxFormBytes = 16 * 1024;

function loadConfig() {
  const raw = process.argv[2]
    ? fs.readFileSync(process.argv[2], 'utf8')
    : process.env.OIDC_PROVIDER_CONFIG;
  if (!raw) {
    throw new Error('no configuration: pass a JSON file as the first argument or set OIDC_PROVIDER_CONFIG');
  }
  const cfg = JSON.parse(raw);
  for (const key of ['clientID', 'clientSecret']) {
    if (typeof cfg[key] !== 'string' || cfg[key] === '') {
      throw new Error(`configuration: ${key} must be a non-empty string`);
    }
  }
  if (!Array.isArray(cfg.redirectURIs) || cfg.redirectURIs.length === 0) {
    throw new Error('configuration: redirectURIs must list at least one URI');
  }
  if (!Array.isArray(cfg.users)) {
    throw new Error('configuration: users must be a list');
  }
  return cfg;
}

// Compares secrets in constant time (hashing first evens out lengths).
function secretEquals(a, b) {
  const ha = crypto.createHash('sha256').update(String(a)).digest();
  const hb = crypto.createHash('sha256').update(String(b)).digest();
  return crypto.timingSafeEqual(ha, hb);
}

function escapeHTML(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({
    '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;',
  }[c]));
}

function page(title, body) {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHTML(title)} - Test identity provider</title>
<style>
body{font-family:system-ui,sans-serif;max-width:26rem;margin:3rem auto;padding:0 1rem;color:#1b1f24}
label{display:block;margin-top:1rem;font-weight:600}
input{display:block;width:100%;box-sizing:border-box;padding:.5rem;margin-top:.25rem;font-size:1rem}
button{margin-top:1.25rem;margin-right:.5rem;padding:.5rem 1rem;font-size:1rem}
.error{color:#a4161a;font-weight:600}
</style></head>
<body><h1>${escapeHTML(title)}</h1>${body}</body></html>`;
}

function loginPage(uid, clientID, login, error) {
  return page('Sign in', `
<p>Sign in to continue to <strong>${escapeHTML(clientID)}</strong>.</p>
${error ? `<p class="error" id="login-error" role="alert">${escapeHTML(error)}</p>` : ''}
<form method="post" action="/interaction/${escapeHTML(uid)}/login" autocomplete="off">
<label for="login">User name</label>
<input id="login" name="login" required autofocus value="${escapeHTML(login || '')}">
<label for="password">Password</label>
<input id="password" name="password" type="password" required>
<button type="submit">Sign in</button>
</form>
<form method="post" action="/interaction/${escapeHTML(uid)}/abort"><button type="submit">Cancel</button></form>`);
}

function consentPage(uid, clientID, scopes) {
  return page('Authorize', `
<p><strong>${escapeHTML(clientID)}</strong> asks for: ${escapeHTML(scopes.join(', ') || 'your identity')}.</p>
<form method="post" action="/interaction/${escapeHTML(uid)}/confirm"><button type="submit" autofocus>Continue</button></form>
<form method="post" action="/interaction/${escapeHTML(uid)}/abort"><button type="submit">Deny</button></form>`);
}

function readForm(req) {
  return new Promise((resolve, reject) => {
    let size = 0;
    const chunks = [];
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > maxFormBytes) {
        reject(Object.assign(new Error('form too large'), { status: 413 }));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(new URLSearchParams(Buffer.concat(chunks).toString('utf8'))));
    req.on('error', reject);
  });
}

function send(res, status, html) {
  res.writeHead(status, {
    'Content-Type': 'text/html; charset=utf-8',
    'Cache-Control': 'no-store',
  });
  res.end(html);
}

const cfg = loadConfig();
const users = new Map(cfg.users.map((u) => [u.name, u]));

const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = {
  ...privateKey.export({ format: 'jwk' }),
  kid: crypto.randomBytes(8).toString('hex'),
  alg: 'RS256',
  use: 'sig',
};

const server = http.createServer();
server.listen(cfg.port || 0, cfg.host || '127.0.0.1', () => {
  const { address, port } = server.address();
  const host = address.includes(':') ? `[${address}]` : address;
  const issuer = `http://${host}:${port}`;

  const provider = new Provider(issuer, {
    clients: [{
      client_id: cfg.clientID,
      client_secret: cfg.clientSecret,
      redirect_uris: cfg.redirectURIs,
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    }],
    pkce: { required: () => true },
    jwks: { keys: [signingKey] },
    cookies: { keys: [crypto.randomBytes(32).toString('hex')] },
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name'],
      groups: ['groups'],
    },
    // Put the scope's claims into the ID token of the code flow too: the
    // backend reads email and groups from the ID token.
    conformIdTokenClaims: false,
    features: { devInteractions: { enabled: false } },
    interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
    async findAccount(_ctx, sub) {
      const user = users.get(sub);
      if (!user) return undefined;
      return {
        accountId: sub,
        async claims() {
          const claims = {
            sub,
            name: user.name,
            email: user.email,
            email_verified: Boolean(user.email),
            groups: user.groups || [],
          };
          // A test user may carry email_verified as any JSON value (a
          // provider that spells it wrongly), or none at all.
          if ('emailVerified' in user) claims.email_verified = user.emailVerified;
          if (user.noEmailVerified) delete claims.email_verified;
          return claims;
        },
      };
    },
  });
  provider.on('server_error', (_ctx, err) => console.error('server_error:', err));

  const callback = provider.callback();
  const interactionPath = /^\/interaction\/([A-Za-z0-9_-]+)(?:\/(login|confirm|abort))?$/;

  async function interaction(req, res, uid, action) {
    const details = await provider.interactionDetails(req, res);
    if (details.uid !== uid) {
      send(res, 400, page('Error', '<p class="error">This sign-in attempt is not the current one.</p>'));
      return;
    }
    const { prompt, params, session } = details;

    if (!action) {
      if (req.method !== 'GET') { send(res, 405, page('Error', '<p>Method not allowed.</p>')); return; }
      if (prompt.name === 'login') {
        send(res, 200, loginPage(uid, params.client_id));
      } else {
        send(res, 200, consentPage(uid, params.client_id, String(params.scope || '').split(' ').filter(Boolean)));
      }
      return;
    }
    if (req.method !== 'POST') { send(res, 405, page('Error', '<p>Method not allowed.</p>')); return; }
    const form = await readForm(req);

    switch (action) {
      case 'login': {
        if (prompt.name !== 'login') { send(res, 400, page('Error', '<p class="error">Not signing in now.</p>')); return; }
        const name = form.get('login') || '';
        const user = users.get(name);
        // Compare against a dummy when the user is unknown, so timing does not tell.
        const ok = secretEquals(form.get('password') || '', user ? user.password : crypto.randomBytes(16).toString('hex')) && Boolean(user);
        if (!ok) {
          console.error(`login refused for user ${JSON.stringify(name)}`);
          send(res, 401, loginPage(uid, params.client_id, name, 'Invalid user name or password.'));
          return;
        }
        await provider.interactionFinished(req, res, { login: { accountId: name } }, { mergeWithLastSubmission: false });
        return;
      }
      case 'confirm': {
        if (prompt.name !== 'consent') { send(res, 400, page('Error', '<p class="error">Nothing to confirm.</p>')); return; }
        const grant = details.grantId
          ? await provider.Grant.find(details.grantId)
          : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
        const d = prompt.details;
        if (d.missingOIDCScope) grant.addOIDCScope(d.missingOIDCScope.join(' '));
        if (d.missingOIDCClaims) grant.addOIDCClaims(d.missingOIDCClaims);
        if (d.missingResourceScopes) {
          for (const [indicator, scopes] of Object.entries(d.missingResourceScopes)) {
            grant.addResourceScope(indicator, scopes.join(' '));
          }
        }
        const grantId = await grant.save();
        await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
        return;
      }
      case 'abort':
        await provider.interactionFinished(req, res, {
          error: 'access_denied',
          error_description: 'End-User aborted interaction',
        }, { mergeWithLastSubmission: false });
        return;
      default:
        send(res, 404, page('Error', '<p>Not found.</p>'));
    }
  }

  server.on('request', (req, res) => {
    const path = req.url.split('?')[0];
    const m = interactionPath.exec(path);
    if (!m) {
      callback(req, res);
      return;
    }
    interaction(req, res, m[1], m[2]).catch((err) => {
      console.error(`interaction ${path}:`, err.message || err);
      if (!res.headersSent) {
        send(res, err.status || 400, page('Error', `<p class="error">${escapeHTML(err.message || 'error')}</p>`));
      }
    });
  });

  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});

for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => { server.close(); process.exit(0); });
}
