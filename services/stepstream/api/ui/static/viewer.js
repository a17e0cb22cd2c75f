// stepstream viewer: keyboard, permalinks, raw bodies on demand, live tail.
// No framework and no HTML strings: every node is built with createElement and
// textContent, so the page runs under `require-trusted-types-for 'script'`.

const main = document.getElementById("main");
const PREVIEW_CHARS = 1000; // as api/ui/present.py
const KIND_ICONS = { thinking: "\u2234", tool: "\u2692", llm: "\u2726", state: "\u25c6", error: "\u2716" };
const STATUS_WORDS = { running: ["\u25b6", "running"], ok: ["\u2713", "ok"], error: ["\u2716", "error"],
                       abandoned: ["\u2205", "abandoned"], unknown: ["\u00b7", "unknown"] };

function el(tag, attrs = {}, ...children) {
  const node = tag === "svg" || tag === "rect"
    ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined && value !== false) node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

// ---- keyboard -------------------------------------------------------------------
let current = -1;
const items = () => [...document.querySelectorAll("[data-nav]")];

function select(index, { scroll = true } = {}) {
  const all = items();
  if (!all.length) return;
  current = Math.max(0, Math.min(index, all.length - 1));
  all.forEach((item, i) => item.classList.toggle("current", i === current));
  const item = all[current];
  const target = item.matches("li") ? item : item.querySelector("[data-open]") || item;
  if (item.matches("li")) {
    item.setAttribute("tabindex", "-1");
    history.replaceState(null, "", `#${item.id}`);
  }
  target.focus({ preventScroll: !scroll });
  if (scroll) item.scrollIntoView({ block: "nearest" });
}

function toggleDetails(item, open) {
  const details = item && item.querySelector("details");
  if (details) details.open = open === undefined ? !details.open : open;
}

function nextError(step) {
  const all = items();
  for (let i = current + step; i >= 0 && i < all.length; i += step) {
    if (all[i].dataset.status === "error") return select(i);
  }
}

function typing(event) {
  const t = event.target;
  return t instanceof HTMLInputElement || t instanceof HTMLSelectElement || t instanceof HTMLTextAreaElement;
}

document.addEventListener("keydown", (event) => {
  if (event.ctrlKey || event.metaKey || event.altKey || typing(event)) return;
  const all = items();
  const item = all[current];
  switch (event.key) {
    case "j": select(current + 1); break;
    case "k": select(current < 0 ? 0 : current - 1); break;
    case "Enter": case "o": {
      if (!item || (event.key === "Enter" && event.target instanceof HTMLButtonElement)) return;
      const link = item.querySelector("[data-open]");
      if (link) link.click(); else toggleDetails(item, true);
      break;
    }
    case "e": toggleDetails(item); break;
    case "[": nextError(-1); break;
    case "]": nextError(1); break;
    case "/": {
      const filter = document.querySelector("[data-filter]");
      if (filter) filter.focus(); else return;
      break;
    }
    case "l": {
      const follow = document.querySelector("[data-follow]");
      if (follow) follow.checked = !follow.checked; else return;
      break;
    }
    case "?": document.getElementById("help").showModal(); break;
    default: return;
  }
  event.preventDefault();
});

for (const button of document.querySelectorAll("[data-help]")) {
  button.addEventListener("click", () => document.getElementById("help").showModal());
}
document.addEventListener("click", (event) => {
  const item = event.target instanceof Element && event.target.closest("[data-nav]");
  if (item) current = items().indexOf(item);
});

function openPermalink() {
  const match = /^#step-(\d+)$/.exec(location.hash);
  if (!match) return;
  const item = document.getElementById(`step-${match[1]}`);
  if (!item) return;
  select(items().indexOf(item));
  toggleDetails(item, true);
}
window.addEventListener("hashchange", openPermalink);
openPermalink();

// ---- raw bodies (deep:read only; fetched per step, shown as text) ------------------
const rawBase = main.dataset.rawBase;

function rawText(value) {
  return typeof value === "string" ? value : JSON.stringify(value, null, 1);
}

async function showRaw(button) {
  const out = button.parentElement.querySelector("[data-raw-out]");
  out.replaceChildren(el("p", { class: "state" }, "Loading\u2026"));
  let answer;
  try {
    answer = await fetch(rawBase + button.dataset.showRaw, { credentials: "same-origin", cache: "no-store" });
  } catch {
    out.replaceChildren(el("p", { class: "state" }, "The raw body could not be fetched."));
    return;
  }
  if (answer.status === 403) {
    out.replaceChildren(el("p", { class: "state" }, "This token lacks the deep:read scope."));
    return;
  }
  if (!answer.ok) {
    out.replaceChildren(el("p", { class: "state" }, `The raw body could not be fetched (${answer.status}).`));
    return;
  }
  const { state, body } = await answer.json();
  if (state === "pruned") {
    out.replaceChildren(el("p", { class: "state" }, "Raw body pruned by retention: only the operator view remains."));
    return;
  }
  if (state !== "present") {
    out.replaceChildren(el("p", { class: "state" }, "No raw body: it was purged, or this step has none."));
    return;
  }
  const parts = [];
  for (const name of ["reasoning", "arguments", "output"]) {
    if (body[name] === null || body[name] === undefined) continue;
    parts.push(el("p", {}, `Raw ${name}:`), el("pre", {}, rawText(body[name])));
  }
  if (body.clipped) parts.push(el("p", { class: "clip" }, "Clipped at the body cap: the text ends at the clip marker."));
  if (!parts.length) parts.push(el("p", { class: "state" }, "The raw body is empty."));
  out.replaceChildren(...parts);
  button.textContent = "Show raw again";
}

document.addEventListener("click", (event) => {
  const button = event.target instanceof Element && event.target.closest("[data-show-raw]");
  if (button) showRaw(button);
});

// ---- the timeline (bars on one time axis) ---------------------------------------
const stepsList = document.querySelector("[data-steps]");
let runRecord = null;

function seconds(ts) { return ts ? Date.parse(ts) / 1000 : null; }

function layout() {
  if (!stepsList) return;
  const rows = [...stepsList.children];
  const times = rows.flatMap((r) => [seconds(r.dataset.start), seconds(r.dataset.end)]).filter((t) => t !== null);
  const start = seconds(runRecord && runRecord.started_at) ?? (times.length ? Math.min(...times) : null);
  const end = seconds(runRecord && runRecord.ended_at) ?? Math.max(...times, seconds(runRecord && runRecord.last_event_at) ?? 0);
  if (start === null || !(end > start)) return;
  for (const row of rows) {
    const rect = row.querySelector("svg.bar rect") || row.querySelector("svg.bar").appendChild(el("rect", { y: 0, height: 10 }));
    const a = seconds(row.dataset.start);
    if (a === null) { rect.remove(); continue; }
    const b = seconds(row.dataset.end) ?? (row.dataset.status === "running" ? end : a);
    rect.setAttribute("x", Math.max(0, ((a - start) / (end - start)) * 1000).toFixed(2));
    rect.setAttribute("width", Math.max(2, ((b - a) / (end - start)) * 1000).toFixed(2));
  }
}

function took(step) {
  const a = seconds(step.started_at), b = seconds(step.ended_at);
  if (a === null || b === null) return "";
  const d = Math.max(0, b - a);
  return d < 10 ? `${d.toFixed(2)} s` : d < 60 ? `${d.toFixed(1)} s` : `${Math.floor(d / 60)} min ${Math.floor(d % 60)} s`;
}

function renderStep(step) {
  const status = step.status || "unknown";
  const [symbol, word] = STATUS_WORDS[status] || STATUS_WORDS.unknown;
  const details = el("details", { "data-details": true }, el("summary", {}, "Details"));
  if (step.call_id) details.append(el("p", {}, "Call ", el("code", {}, step.call_id)));
  details.append(el("p", {}, "Input shape: ", el("code", {}, step.input_shape || "none"), "; output shape: ",
    el("code", {}, step.output_shape || "none"), `; started ${step.started_at || "unknown"}, ended ${step.ended_at || "not yet"}.`));
  if (step.arguments !== null && step.arguments !== undefined) {
    const text = JSON.stringify(step.arguments, null, 1);
    details.append(el("pre", { class: "arguments", "aria-label": "Redacted arguments" }, text.slice(0, PREVIEW_CHARS)));
    if (text.length > PREVIEW_CHARS) {
      details.append(el("p", { class: "clip" }, `The first ${PREVIEW_CHARS} of ${text.length} characters; the JSON twin has them all.`));
    }
  }
  if (rawBase) {
    details.append(el("button", { type: "button", "data-show-raw": step.step_seq }, "Show raw"),
      el("div", { class: "raw", "data-raw-out": true, "aria-live": "polite" }));
  }
  return el("li", {
      id: `step-${step.step_seq}`, class: `step kind-${step.kind} status-${status}`, "data-nav": true,
      "data-status": status, "data-seq": step.step_seq, "data-start": step.started_at || "", "data-end": step.ended_at || "",
      tabindex: "-1",
    },
    el("div", { class: "row" },
      el("a", { class: "seq", href: `#step-${step.step_seq}`, "aria-label": `Permalink to step ${step.step_seq}` }, `#${step.step_seq}`),
      el("span", { class: "kind" }, el("span", { "aria-hidden": "true" }, KIND_ICONS[step.kind] || ""), ` ${step.kind}`),
      el("span", { class: "label" }, step.label || ""),
      el("span", { class: "status" }, el("span", { "aria-hidden": "true" }, symbol), ` ${word}`),
      el("span", { class: "took" }, took(step)),
      el("svg", { class: "bar", viewBox: "0 0 1000 10", preserveAspectRatio: "none", "aria-hidden": "true", focusable: "false" })),
    details);
}

function upsert(step) {
  const fresh = renderStep(step);
  const old = document.getElementById(fresh.id);
  if (old) {
    const wasOpen = old.querySelector("details")?.open;
    const raw = old.querySelector("[data-raw-out]");
    old.replaceWith(fresh);
    if (wasOpen) fresh.querySelector("details").open = true;
    if (raw && raw.childNodes.length) fresh.querySelector("[data-raw-out]")?.replaceWith(raw);
    return;
  }
  const after = [...stepsList.children].find((r) => Number(r.dataset.seq) > step.step_seq);
  stepsList.insertBefore(fresh, after || null);
}

// ---- live tail (Server-Sent Events) ---------------------------------------------
const liveState = document.querySelector("[data-live-state]");
const follow = document.querySelector("[data-follow]");
let source = null;
let ended = false;

function atBottom() {
  return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 48;
}

function apply(data) {
  const stay = follow && follow.checked && atBottom();
  runRecord = data.run;
  for (const step of data.steps) upsert(step);
  document.querySelector("[data-run-status]").textContent = data.run.status;
  document.querySelector("[data-run-steps]").textContent = String(data.run.step_count);
  layout();
  if (stay) window.scrollTo({ top: document.documentElement.scrollHeight });
}

function setState(text) { if (liveState) liveState.textContent = text; }

function connect() {
  if (ended || source) return;
  source = new EventSource(main.dataset.live);
  source.addEventListener("open", () => setState("live"));
  source.addEventListener("snapshot", (e) => { setState("live"); apply(JSON.parse(e.data)); });
  source.addEventListener("steps", (e) => apply(JSON.parse(e.data)));
  source.addEventListener("end", (e) => {
    apply(JSON.parse(e.data));
    ended = true;
    source.close();
    source = null;
    setState("ended");
  });
  source.addEventListener("error", () => {
    if (ended) return;
    setState(source && source.readyState === EventSource.CLOSED ? "disconnected" : "reconnecting");
  });
}

function disconnect() {
  if (source) { source.close(); source = null; }
  if (!ended) setState("paused while hidden");
}

if (main.dataset.live && stepsList) {
  document.addEventListener("visibilitychange", () => (document.hidden ? disconnect() : connect()));
  if (!document.hidden) connect();
}
