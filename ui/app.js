/* Cephalon console: plain JavaScript over the daemon's HTTP API (no framework, no build step).
 *
 * Pages are addressed by the URL fragment (#/sessions?prefix=a, #/session/ID, ...). Each page
 * builds its controls once and returns a refresh function; the router calls it again every
 * REFRESH_MS while the tab is visible, so the data updates live without reloading. Every API
 * call carries the token the user gave (kept in sessionStorage, this tab only): with a read
 * token the console views, with an admin token it may also requeue parked turns. Text from
 * the daemon is always set as text (never parsed as HTML). */
'use strict';

const TOKEN_KEY = 'cephalon.token';
const REFRESH_MS = 3000;
const PAGE_SIZE = 50;

/* ------------------------------------------------------------------ the API */

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(method, path, body) {
  const headers = {};
  if (token()) headers.Authorization = 'Bearer ' + token();
  const init = { method, headers };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const text = await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch (e) {
      data = null;
    }
  }
  if (!res.ok) {
    const message = data && data.error ? data.error.message : res.status + ' ' + res.statusText;
    throw new ApiError(res.status, message);
  }
  return data;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, v);
  }
  const s = q.toString();
  return s ? '?' + s : '';
}

const enc = encodeURIComponent;

/* ------------------------------------------------------------------ DOM helpers */

/* h('a', {href: '#/x', class: 'y', 'data-id': 3, onclick: fn}, 'text', child, ...) */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'value') el.value = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/* A table: headers (strings; a leading '#' right-aligns the column), rows of cells. A row may
 * be {attrs, cells} to give the <tr> attributes. */
function table(headers, rows, empty) {
  if (!rows.length) return h('p', { class: 'muted' }, empty || 'None.');
  const num = headers.map((x) => x.startsWith('#'));
  return h('table', {},
    h('thead', {}, h('tr', {}, headers.map((x, i) =>
      h('th', { class: num[i] ? 'num' : null }, num[i] ? x.slice(1) : x)))),
    h('tbody', {}, rows.map((r) => {
      const cells = Array.isArray(r) ? r : r.cells;
      return h('tr', Array.isArray(r) ? {} : r.attrs,
        cells.map((c, i) => h('td', { class: num[i] ? 'num' : null }, c)));
    })));
}

function kv(pairs) {
  return h('dl', { class: 'kv' }, pairs.filter((p) => p).map(([k, v]) =>
    [h('dt', {}, k), h('dd', {}, v === null || v === undefined ? '—' : v)]));
}

function fmtNum(x, digits) {
  if (x === null || x === undefined) return '—';
  return typeof x === 'number' && !Number.isInteger(x) ? x.toFixed(digits ?? 1) : String(x);
}

function fmtTime(ms) {
  return ms ? new Date(ms).toLocaleString() : '—';
}

function short(text, n) {
  if (text === null || text === undefined) return '';
  return text.length > n ? text.slice(0, n - 1) + '…' : text;
}

function setStatus(text, isError) {
  const el = document.getElementById('status');
  el.textContent = text || '';
  el.className = isError ? 'status error' : 'status';
}

function explain(err) {
  if (err.status === 401) return 'The daemon wants a token: paste one above (read scope to view).';
  if (err.status === 403) return 'This token lacks the scope for that: ' + err.message;
  return err.message || String(err);
}

/* ------------------------------------------------------------------ replies tail */

/* The newest replies, shared by the replies page and the session pages. The API has no
 * "newest N", so the tail follows the stream from the start once (at most TAIL_PAGES pages)
 * and then only asks for what is new. */
const TAIL_KEEP = 200;
const TAIL_PAGES = 20;
// after is a cursor in one stream (the answer's `stream`): the daemon started on another data
// directory, or a copy, starts its ids over, so the tail starts over with it.
const tail = { after: 0, items: [], stream: null };

async function pollReplies() {
  for (let page = 0; page < TAIL_PAGES; page++) {
    const d = await api('GET', '/v1/replies' + query({ after: tail.after, limit: 1000, wait_ms: 0 }));
    if (tail.stream !== null && d.stream !== tail.stream) {
      tail.stream = d.stream;
      tail.after = 0;
      tail.items = [];
      continue;
    }
    tail.stream = d.stream;
    tail.items.push(...d.replies);
    if (tail.items.length > TAIL_KEEP) tail.items.splice(0, tail.items.length - TAIL_KEEP);
    tail.after = d.next;
    if (d.replies.length < 1000) break;
  }
  return tail.items;
}

function repliesTable(items) {
  return table(['#Id', 'Session', 'Channel', 'Body', 'Time'],
    items.slice().reverse().map((r) => [r.id, sessionLink(r.session), r.channel,
      h('span', { class: 'pre' }, short(r.body, 300)), fmtTime(r.ts_ms)]),
    'No replies yet.');
}

function sessionLink(id) {
  return h('a', { href: '#/session/' + enc(id) }, id);
}

/* ------------------------------------------------------------------ pages */

function pageLanes(main) {
  main.append(h('h2', {}, 'Lanes'));
  const data = h('div');
  main.append(data);
  return async () => {
    const [d, top] = await Promise.all([api('GET', '/v1/lanes'), api('GET', '/v1/top?limit=10')]);
    data.replaceChildren(
      table(['Lane', '#Turns left', '#Tool calls left', '#Runnable', '#Running',
        '#Turns / min', '#Tool calls / min'],
      d.lanes.map((l) => ({
        attrs: { 'data-lane': l.name },
        cells: [l.name, fmtNum(l.turns_left), fmtNum(l.tool_calls_left), l.runnable, l.running,
          l.budget.turns, l.budget.tool_calls],
      }))),
      h('p', {}, `Concurrency: ${d.concurrency.in_use} of ${d.concurrency.limit} turns running.`),
      h('h3', {}, 'Busiest sessions'),
      table(['Session', 'Class', 'State', '#Credits', '#Staged', '#Pending'],
        top.sessions.map((s) => [sessionLink(s.id), s.class, s.state, fmtNum(s.credits),
          s.staged, s.pending]), 'No session has input waiting.'));
  };
}

function pageSessions(main, args, q) {
  const prefix = q.get('prefix') || '';
  const after = q.get('after') || '';
  const input = h('input', { id: 'session-search', type: 'search', value: prefix,
    placeholder: 'session id prefix' });
  const form = h('form', { class: 'controls', onsubmit: (e) => {
    e.preventDefault();
    location.hash = '#/sessions' + query({ prefix: input.value.trim() });
  } }, input, h('button', { type: 'submit' }, 'Search'));
  main.append(h('h2', {}, 'Sessions'), form);
  const data = h('div');
  main.append(data);
  return async () => {
    const d = await api('GET', '/v1/sessions' + query({ limit: PAGE_SIZE, prefix, after }));
    const pager = h('div', { class: 'controls' },
      after ? h('a', { href: '#/sessions' + query({ prefix }) }, 'First page') : null,
      d.next ? h('a', { id: 'next-page', href: '#/sessions' + query({ prefix, after: d.next }) },
        'Next page') : null);
    data.replaceChildren(
      table(['Id', 'Class', 'State', '#Credits', '#Episode', '#Pending', '#Staged', '#Folded'],
        d.sessions.map((s) => ({
          attrs: { 'data-session': s.id },
          cells: [sessionLink(s.id), s.class, s.state, fmtNum(s.credits), s.episode, s.pending,
            s.staged, s.folded],
        })), prefix ? `No session id begins with "${prefix}".` : 'No sessions.'),
      pager);
  };
}

function turnsTable(session, turns) {
  return table(['#Turn', 'Kind', '#Episode', 'Input', '#Messages', '#Tokens', 'Leased', ''],
    turns.slice().reverse().map((t, i, all) => ({
      attrs: { 'data-turn': t.id },
      cells: [h('a', { href: `#/turn/${enc(session)}/${t.id}` }, String(t.id)), t.kind, t.episode,
        short(t.input, 80), t.messages, t.tokens.messages, fmtTime(t.created_ms),
        i + 1 < all.length
          ? h('a', { href: `#/explorer/${enc(session)}` + query({ from: all[i + 1].id, to: t.id }) },
            'diff with previous')
          : ''],
    })), 'No kept turns (see :context :keep-turns).');
}

function pageSession(main, args) {
  const id = args[0];
  main.append(h('h2', {}, 'Session ', h('span', { id: 'session-id' }, id)));
  const data = h('div');
  const memories = h('div');
  const q = h('input', { type: 'search', placeholder: 'search this session\'s memories' });
  const search = h('form', { class: 'controls', onsubmit: async (e) => {
    e.preventDefault();
    try {
      const d = await api('GET', '/v1/memories/search' + query({ session: id, q: q.value, k: 20 }));
      memories.replaceChildren(table(['#Id', 'Kind', 'Text', '#Score'],
        d.memories.map((m) => [m.id, m.kind, h('span', { class: 'pre' }, m.text), fmtNum(m.score, 3)]),
        'No memory matches.'));
    } catch (err) {
      setStatus(explain(err), true);
    }
  } }, q, h('button', { type: 'submit' }, 'Search'),
  h('span', { class: 'muted' }, 'a search counts as an access to what it finds'));
  main.append(data, h('h3', {}, 'Memory search'), search, memories);
  return async () => {
    const base = '/v1/sessions/' + enc(id);
    const [s, why, kept, replies] = await Promise.all([api('GET', base), api('GET', base + '/why'),
      api('GET', base + '/turns'), pollReplies()]);
    const newest = kept.turns.length ? kept.turns[kept.turns.length - 1] : null;
    let recent = null;
    if (newest) recent = await api('GET', `${base}/turns/${newest.id}/context`);
    data.replaceChildren(h('div', { class: 'panels' },
      h('section', { class: 'panel' }, h('h3', {}, 'Session'), kv([
        ['class', s.class], ['state', s.state], ['credits', fmtNum(s.credits)],
        ['episode', s.episode], ['subscribe', (s.subscribe || []).join(', ') || '—'],
        ['member', (s.member || []).join(', ') || '—'],
        ['context window', s.context_window_tokens], ['tools', (s.tools || []).join(', ') || '—']])),
      h('section', { class: 'panel', id: 'why' }, h('h3', {}, 'Why'), kv([
        ['reason', h('strong', {}, why.reason)], ['lane', why.lane],
        ['credits', fmtNum(why.credits)], ['waiting', fmtNum(why.waiting_s) + ' s'],
        why.rank !== null ? ['rank in lane', `${why.rank} of ${why.lane_runnable}`] : null,
        why.until_ms !== null ? ['budget again at', fmtTime(why.until_ms)] : null,
        ['ahead in higher lanes', why.ahead_in_higher_lanes]])),
      h('section', { class: 'panel' }, h('h3', {}, 'Inbox'), kv([
        ['pending', s.pending], ['staged', s.staged], ['folded', s.folded]]))),
    h('h3', {}, 'Turns (kept contexts)'), turnsTable(id, kept.turns),
    h('h3', {}, 'Replies'),
    repliesTable(replies.filter((r) => r.session === id)),
    h('h3', {}, 'Memories in its newest turn'),
    recent ? table(['#Id', 'Kind', 'Text'], recent.sections.recent_memory.map((m) =>
      [m.id, m.kind || '—', h('span', { class: 'pre' }, m.text || '(gone)')]),
    recent.turn.omitted.includes('sections.recent_memory')
      ? 'That turn\'s lease left recent_memory out.' : 'None.')
      : h('p', { class: 'muted' }, 'No kept turn.'));
  };
}

function pageParked(main) {
  main.append(h('h2', {}, 'Parked turns'),
    h('p', { class: 'muted' }, 'A turn is parked after :leases :max-attempts failed attempts. ' +
      'Requeueing stages its messages again; it needs a token with the admin scope.'));
  const data = h('div');
  main.append(data);
  let refresh;
  const requeue = async (btn, id) => {
    btn.disabled = true;
    try {
      await api('POST', `/v1/turns/${id}/requeue`, {});
      setStatus(`Turn ${id} requeued.`);
    } catch (err) {
      setStatus(err.status === 401 || err.status === 403
        ? 'Requeue needs a token with the admin scope: ' + err.message : explain(err), true);
      btn.disabled = false;
      return;
    }
    await refresh();
  };
  refresh = async () => {
    const d = await api('GET', '/v1/turns?state=parked');
    data.replaceChildren(table(['#Turn', 'Session', '#Attempts', 'Messages', 'Last error', ''],
      d.turns.map((t) => ({
        attrs: { 'data-turn': t.id },
        cells: [t.id, sessionLink(t.session), t.attempts, t.inbox_ids.join(', '),
          h('span', { class: 'pre' }, t.error || ''),
          h('button', { class: 'requeue', 'data-turn': t.id,
            onclick: (e) => requeue(e.currentTarget, t.id) }, 'Requeue')],
      })), 'No parked turns.'));
  };
  return refresh;
}

function pageReplies(main) {
  main.append(h('h2', {}, 'Replies'),
    h('p', { class: 'muted' }, `The newest ${TAIL_KEEP} replies, newest first.`));
  const data = h('div');
  main.append(data);
  return async () => data.replaceChildren(repliesTable(await pollReplies()));
}

function pageChannels(main, args) {
  const name = args[0] || '';
  const input = h('input', { type: 'search', value: name, placeholder: 'channel id' });
  main.append(h('h2', {}, 'Channels'), h('form', { class: 'controls', onsubmit: (e) => {
    e.preventDefault();
    location.hash = '#/channels/' + enc(input.value.trim());
  } }, input, h('button', { type: 'submit' }, 'Show')));
  const data = h('div');
  main.append(data);
  return async () => {
    const [top, agg, ch] = await Promise.all([api('GET', '/v1/top?limit=1'),
      api('GET', '/v1/aggregates?top=20'),
      name ? api('GET', '/v1/channels/' + enc(name)).catch((e) => ({ missing: explain(e) })) : null]);
    const parts = [];
    if (ch && ch.missing) parts.push(h('p', { class: 'muted' }, ch.missing));
    if (ch && !ch.missing) {
      const t = ch.trigger;
      parts.push(h('section', { class: 'panel', id: 'channel' }, h('h3', {}, 'Channel ' + ch.id), kv([
        ['backpressure step', h('strong', { class: 'step-' + ch.step }, `${ch.step} ${ch.step_name}`)],
        ['trigger', t ? t.name + (t.figure !== undefined && t.figure !== null
          ? ` (${t.figure} over ${t.limit})` : '') : '—'],
        ['since', fmtTime(ch.since_ms)], ['events / min', ch.events_per_minute],
        ['fastest family growth / min', ch.family_growth_per_minute],
        ['calm intervals', ch.calm_intervals],
        ['subscribers', ch.subscribers], ['members', ch.members],
        ['max events / min', ch.settings.max_events_per_minute || 'no limit'],
        ['max step', ch.settings.max_step],
        ['dedupe window', ch.settings.dedupe_window_seconds + ' s']])));
    }
    parts.push(h('h3', {}, `Degraded channels (${top.degraded_channels_total})`),
      table(['Channel', '#Step', 'Step name'], top.degraded_channels.map((c) =>
        [h('a', { href: '#/channels/' + enc(c.channel) }, c.channel), c.step, c.step_name]),
      'Every channel is at step 0 (normal).'),
      h('h3', {}, 'Duplicate families'),
      table(['#Family', '#Duplicates', 'Sample', 'Channels', 'Last'], agg.aggregates.map((a) =>
        [a.family, a.dup_count, short(a.sample, 120),
          a.channels.map((c) => h('a', { href: '#/channels/' + enc(c) }, c + ' ')),
          fmtTime(a.last_ms)]), 'No duplicate families.'));
    data.replaceChildren(...parts);
  };
}

/* ---- the context explorer */

const REASONS = {
  ttl_expired: 'TTL expired',
  cadence: 'cadence',
  lifecycle: 'lifecycle ended',
  window_budget: 'window budget',
  compaction: 'compaction',
  history_bound: 'history bound',
  deleted: 'deleted',
  consumed: 'consumed',
  turn_kind: 'turn kind',
  not_in_scope: 'not in scope',
  not_yet_created: 'not yet created',
  shown_as_history: 'shown as history',
  unknown: 'unknown',
  inserted: 'inserted',
  new: 'new',
  staged: 'staged',
  moved: 'moved',
  content: 'content changed',
};

const DIFF_PARTS = [
  ['nodes', 'Context tree nodes'],
  ['messages', 'Messages'],
  ['conversation_history', 'conversation_history'],
  ['recent_memory', 'recent_memory'],
  ['pending_obligations', 'pending_obligations'],
];

function changeView(part, kind, c) {
  const where = c.from_at ? `${c.from_at} → ${c.at}` : c.at || c.channel || c.scope;
  const who = c.role || c.sender || c.kind;
  return h('div', { class: 'change', 'data-part': part, 'data-change': kind,
    'data-reason': c.reason, 'data-id': c.id },
  h('span', { class: 'reason', title: c.reason }, REASONS[c.reason] || c.reason), ' ',
  h('span', { class: 'pre' }, who ? `[${who}] ` : '', short(c.content || '', 400)),
  h('div', { class: 'meta' }, [c.id !== null ? `id ${c.id}` : null, where,
    c.detail].filter((x) => x).join(' · ')));
}

function diffView(d) {
  const out = [h('p', {}, `From turn ${d.from.id} (${d.from.kind}, episode ${d.from.episode}) to ` +
    `turn ${d.to.id} (${d.to.kind}, episode ${d.to.episode}).`)];
  const omitted = [...new Set([...d.from.omitted, ...d.to.omitted])];
  if (omitted.length) {
    out.push(h('p', { class: 'muted' }, 'Not compared (a lease left them out): ' +
      omitted.join(', ')));
  }
  for (const [key, title] of DIFF_PARTS) {
    const p = d[key];
    const n = p.entered.length + p.left.length + p.changed.length;
    const section = h('section', { class: 'diff-part', 'data-part': key },
      h('h3', {}, `${title} — ${p.entered.length} entered, ${p.left.length} left, ` +
        `${p.changed.length} changed`));
    if (!n) section.append(h('p', { class: 'muted' }, 'No change.'));
    for (const kind of ['left', 'entered', 'changed']) {
      for (const c of p[kind]) section.append(changeView(key, kind, c));
    }
    out.push(section);
  }
  return out;
}

function pageExplorer(main, args, q) {
  const session = args[0] || '';
  const input = h('input', { id: 'explorer-session', type: 'search', value: session,
    placeholder: 'session id' });
  main.append(h('h2', {}, 'Context explorer'),
    h('p', { class: 'muted' }, 'What entered and what left the context between two kept turns ' +
      'of a session, and why.'),
    h('form', { class: 'controls', onsubmit: (e) => {
      e.preventDefault();
      location.hash = '#/explorer/' + enc(input.value.trim());
    } }, input, h('button', { type: 'submit' }, 'Open')));
  const data = h('div');
  main.append(data);
  if (!session) return null;
  const load = async () => {
    const kept = await api('GET', `/v1/sessions/${enc(session)}/turns`);
    const turns = kept.turns;
    if (turns.length < 1) {
      data.replaceChildren(h('p', { class: 'muted' }, 'No kept turns for this session.'));
      return;
    }
    const last = turns[turns.length - 1].id;
    const prev = turns.length > 1 ? turns[turns.length - 2].id : last;
    const from = q.get('from') || String(prev);
    const to = q.get('to') || String(last);
    const pick = (id, chosen) => h('select', { id }, turns.map((t) =>
      h('option', { value: t.id, selected: String(t.id) === chosen },
        `turn ${t.id} · ${t.kind} · episode ${t.episode} · ${short(t.input, 40)}`)));
    const fromSel = pick('diff-from', from);
    const toSel = pick('diff-to', to);
    const form = h('form', { class: 'controls', onsubmit: (e) => {
      e.preventDefault();
      location.hash = `#/explorer/${enc(session)}` + query({ from: fromSel.value, to: toSel.value });
    } }, 'From', fromSel, 'to', toSel, h('button', { id: 'diff-go', type: 'submit' }, 'Compare'),
    h('a', { href: `#/turn/${enc(session)}/${from}` }, 'turn ' + from),
    h('a', { href: `#/turn/${enc(session)}/${to}` }, 'turn ' + to));
    const d = await api('GET', `/v1/sessions/${enc(session)}/context/diff` + query({ from, to }));
    data.replaceChildren(form, h('div', { id: 'diff' }, diffView(d)));
  };
  load().catch((err) => setStatus(explain(err), true));
  return null; /* kept contexts never change: no refresh */
}

function pageTurn(main, args) {
  const [session, turn] = args;
  main.append(h('h2', {}, `Turn ${turn} of `, sessionLink(session)));
  const data = h('div');
  main.append(data);
  (async () => {
    const c = await api('GET', `/v1/sessions/${enc(session)}/turns/${enc(turn)}/context`);
    const t = c.turn;
    const s = c.sections;
    data.replaceChildren(
      kv([['kind', t.kind], ['episode', t.episode], ['leased', fmtTime(t.created_ms)],
        ['input', h('span', { class: 'pre' }, t.input || '')],
        ['channels', c.channels.join(', ') || '—'],
        ['left out by the lease', t.omitted.join(', ') || 'nothing']]),
      h('h3', {}, 'Tokens'),
      table(['#Window', '#State', '#Obligations', '#History', '#Memory', '#Tools', '#Sections',
        '#Messages', '#History cut', '#Messages cut'], [[t.tokens.window, t.tokens.current_state,
        t.tokens.pending_obligations, t.tokens.conversation_history, t.tokens.recent_memory,
        t.tokens.available_tools, t.tokens.sections, t.tokens.messages, t.tokens.history_cut,
        t.tokens.messages_cut]]),
      h('h3', {}, `Messages (${c.messages.length})`),
      h('div', { id: 'messages' }, c.messages.length ? c.messages.map((m) =>
        h('div', { class: 'message' },
          h('div', { class: 'meta' }, `${m.role} · ${m.coord}` + (m.node ? ` · node ${m.node}` : '')),
          h('div', { class: 'pre' }, m.content))) : h('p', { class: 'muted' }, 'None kept.')),
      h('h3', {}, 'pending_obligations'),
      table(['#Inbox id', 'Sender: preview'], s.pending_obligations.map((o) => [o.id, o.text])),
      h('h3', {}, 'conversation_history'),
      table(['#Event', 'Sender', 'Body'], s.conversation_history.map((e) =>
        [e.event_id, e.sender || '—', h('span', { class: 'pre' }, e.body || '(gone)')])),
      h('h3', {}, 'recent_memory'),
      table(['#Memory', 'Kind', 'Text'], s.recent_memory.map((m) =>
        [m.id, m.kind || '—', h('span', { class: 'pre' }, m.text || '(gone)')])),
      h('h3', {}, 'available_tools'),
      h('p', {}, s.available_tools.join(', ') || 'None.'),
      h('h3', {}, 'Context tree as the turn saw it'),
      table(['#Node', 'At', 'Role', 'Content', '#TTL', '#Cadence', '#Created', 'State'],
        c.nodes.map((n) => [n.id, n.at, n.role || '—', short(n.content, 120), fmtNum(n.ttl),
          fmtNum(n.cadence), n.created_at_episode, n.waiting ? 'waiting' : 'live'])));
  })().catch((err) => setStatus(explain(err), true));
  return null;
}

/* ------------------------------------------------------------------ router */

const PAGES = {
  lanes: pageLanes,
  sessions: pageSessions,
  session: pageSession,
  parked: pageParked,
  replies: pageReplies,
  channels: pageChannels,
  explorer: pageExplorer,
  turn: pageTurn,
};

const NAV_OF = { session: 'sessions', turn: 'explorer' };

let current = null; /* the shown page's refresh function, or null */
let generation = 0; /* bumps on every navigation: a late answer for an old page is dropped */

async function refreshNow() {
  if (!current) return;
  const mine = generation;
  try {
    await current();
    if (mine === generation) setStatus('Updated ' + new Date().toLocaleTimeString() + '.');
  } catch (err) {
    if (mine === generation) setStatus(explain(err), true);
  }
}

function route() {
  const hash = location.hash.replace(/^#\/?/, '') || 'lanes';
  const [path, qs] = hash.split('?');
  const [name, ...args] = path.split('/').map(decodeURIComponent);
  const page = PAGES[name] || pageLanes;
  const main = document.getElementById('main');
  main.replaceChildren();
  generation++;
  setStatus('');
  for (const a of document.querySelectorAll('nav a')) {
    a.classList.toggle('active', a.dataset.page === (NAV_OF[name] || name));
  }
  current = page(main, args, new URLSearchParams(qs || ''));
  refreshNow();
}

function setupToken() {
  const form = document.getElementById('token-form');
  const input = document.getElementById('token');
  input.value = token();
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    route();
  });
  document.getElementById('token-forget').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    input.value = '';
    route();
  });
}

document.addEventListener('DOMContentLoaded', () => {
  setupToken();
  window.addEventListener('hashchange', route);
  setInterval(() => {
    if (!document.hidden) refreshNow();
  }, REFRESH_MS);
  route();
});
