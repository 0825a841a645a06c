// The web console in a real headless browser (Debian's Chromium driven by playwright-core).
// It starts nothing: tests/integration/test_ui.c starts cephalond, makes sessions and turns
// (two kept turns of one session, between which a node with a TTL left and another entered,
// and a parked turn), then runs this script with what it made in the environment:
//
//   CPH_UI_URL          http://127.0.0.1:PORT
//   CPH_UI_MODULES      the directory holding node_modules/playwright-core (tests/support/npm-install.sh)
//   CPH_UI_CHROMIUM     the browser (default /usr/bin/chromium)
//   CPH_UI_READ_TOKEN   a token with the read scope only
//   CPH_UI_ADMIN_TOKEN  a token with every scope
//   CPH_UI_SESSION, CPH_UI_FROM, CPH_UI_TO   the session and its two kept turns
//   CPH_UI_PARKED       the parked turn's id
//
// It exits 0 when every check passed, 1 with the failing check on stderr otherwise. The C test
// then checks through the API that the console's requeue requeued.
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`${name} is not set`);
  return v;
};
const base = env('CPH_UI_URL');
const chromiumPath = env('CPH_UI_CHROMIUM', '/usr/bin/chromium');
const readToken = env('CPH_UI_READ_TOKEN');
const adminToken = env('CPH_UI_ADMIN_TOKEN');
const session = env('CPH_UI_SESSION');
const from = env('CPH_UI_FROM');
const to = env('CPH_UI_TO');
const parked = env('CPH_UI_PARKED');

if (!existsSync(chromiumPath)) {
  console.error(`FAIL: no Chromium at ${chromiumPath}: install Debian's chromium ` +
    '(scripts/install-deps.sh installs it)');
  process.exit(1);
}
const require = createRequire(env('CPH_UI_MODULES') + '/');
const { chromium } = require('playwright-core');

// How long a step may wait for the page. Generous: it only matters when something is slow,
// and make test's ASan run on a loaded 2-core machine once took more than 10 s for a step.
const TIMEOUT = 30000;
let step = 'start';
const problems = []; // console errors and CSP violations: the console must have none

function check(cond, what) {
  if (!cond) throw new Error(what);
}

async function useToken(page, token) {
  await page.fill('#token', token);
  await page.click('#token-form button[type=submit]');
}

async function api(method, path, body) {
  const res = await fetch(base + path, {
    method,
    headers: { Authorization: 'Bearer ' + adminToken, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
  return res.json();
}

const browser = await chromium.launch({
  executablePath: chromiumPath,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
let failed = false;
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(TIMEOUT);
  page.on('console', (m) => {
    if (m.type() === 'error' && !/status of 40[13]/.test(m.text())) problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(String(e)));

  step = 'the console loads with its security headers';
  const res = await page.goto(base + '/ui');
  check(res.status() === 200, `/ui answered ${res.status()}`);
  check(res.headers()['content-security-policy'] === "default-src 'self'",
    'no Content-Security-Policy on /ui');
  await useToken(page, readToken);

  step = 'the lanes page shows the lanes';
  await page.waitForSelector('tr[data-lane="interactive"]');

  step = 'the sessions page lists the sessions';
  await page.goto(base + '/ui#/sessions');
  await page.waitForSelector(`tr[data-session="${session}"]`);
  await page.waitForSelector('tr[data-session="zed-1"]');

  step = 'searching by prefix narrows the list';
  await page.fill('#session-search', 'zed-');
  await page.press('#session-search', 'Enter');
  await page.waitForSelector(`tr[data-session="${session}"]`, { state: 'detached' });
  await page.waitForSelector('tr[data-session="zed-2"]');

  step = 'a session created meanwhile appears without reloading';
  await api('POST', '/v1/sessions', { id: 'zed-live', class: 'interactive' });
  await page.waitForSelector('tr[data-session="zed-live"]');

  step = "a session's page shows why, its kept turns and its replies";
  await page.goto(base + `/ui#/session/${session}`);
  await page.waitForSelector('#why');
  await page.waitForSelector(`tr[data-turn="${from}"]`);
  await page.waitForSelector(`tr[data-turn="${to}"]`);
  await page.waitForSelector('text=re: hello');

  step = 'requeue with a read-only token is refused';
  await page.goto(base + '/ui#/parked');
  const button = `button.requeue[data-turn="${parked}"]`;
  await page.waitForSelector(button);
  await page.click(button);
  await page.waitForSelector('#status.error');
  check(/admin/.test(await page.textContent('#status')), 'the refusal does not name the admin scope');
  await page.waitForSelector(button);

  step = 'requeue with an admin token requeues';
  await useToken(page, adminToken);
  await page.waitForSelector(button);
  await page.click(button);
  await page.waitForSelector(`text=Turn ${parked} requeued`);
  await page.waitForSelector(`tr[data-turn="${parked}"]`, { state: 'detached' });

  step = 'the diff view shows a node that left with its reason and one that entered';
  await page.goto(base + `/ui#/explorer/${session}?from=${from}&to=${to}`);
  const left = '.change[data-part="nodes"][data-change="left"][data-reason="ttl_expired"]';
  await page.waitForSelector(left);
  const leftText = await page.textContent(left);
  check(/remind: standup/.test(leftText), `the node that left is not the reminder: ${leftText}`);
  check(/TTL expired/i.test(leftText), `no "TTL expired" on the node that left: ${leftText}`);
  const entered = '.change[data-part="nodes"][data-change="entered"][data-reason="inserted"]';
  await page.waitForSelector(entered);
  check(/new note/.test(await page.textContent(entered)), 'the node that entered is not shown');

  step = "a kept turn's context shows its messages";
  await page.goto(base + `/ui#/turn/${session}/${from}`);
  await page.waitForSelector('.message >> text=remind: standup');

  step = 'the channels page shows the backpressure step and the families';
  await page.goto(base + `/ui#/channels/${session}-chan`);
  await page.waitForSelector('#channel >> text=0 normal');
  await page.waitForSelector('text=Duplicate families');

  step = 'no console errors';
  check(problems.length === 0, 'console errors: ' + problems.join(' | '));
  console.log('console.test: every check passed');
} catch (err) {
  failed = true;
  console.error(`FAIL: ${step}: ${err.message}`);
  if (problems.length) console.error('console errors: ' + problems.join(' | '));
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
