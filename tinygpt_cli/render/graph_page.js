// The attribution graph's viewer: graph_page.py embeds this in the page (no URL of any kind).
(() => {
const doc = JSON.parse(document.getElementById("graph").textContent);
const nodes = doc.nodes, edges = doc.edges, byId = {};
nodes.forEach(n => { byId[n.id] = n; n.ins = []; n.outs = []; });
edges.forEach(e => { byId[e.target].ins.push(e); byId[e.source].outs.push(e); });
const nl = doc.n_layers, T = doc.tokens.length;
const row = n => n.kind === "embedding" ? 0 : n.kind === "logit" ? nl + 1 : n.kind === "bias" ? 0 : n.layer + 1;
const cells = {};
nodes.forEach(n => { const k = row(n) + ":" + (n.kind === "bias" ? T : n.position);
  (cells[k] = cells[k] || []).push(n); });
const per = Math.max(1, ...Object.values(cells).map(c => c.length));
const cols = Math.min(per, 8), colW = Math.max(70, cols * 11 + 10), rowH = 40 + 11 * Math.ceil(per / cols);
const W = 60 + colW * (T + 1), H = rowH * (nl + 2) + 40;
Object.values(cells).forEach(c => { c.sort((a, b) => b.influence - a.influence);
  c.forEach((n, i) => { const col = n.kind === "bias" ? T : n.position;
    n.x = 60 + colW * col + 8 + (i % cols) * 11;
    n.y = H - 40 - rowH * row(n) - 10 - Math.floor(i / cols) * 11; }); });
const svg = document.getElementById("canvas"), NS = svg.namespaceURI;  // no URL in the file
svg.setAttribute("width", W); svg.setAttribute("height", H);
svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
svg.setAttribute("role", "img"); svg.setAttribute("aria-label", "attribution graph");
const el = (name, attrs, parent) => { const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]); (parent || svg).appendChild(e); return e; };
const txt = (s, attrs) => { const t = el("text", attrs); t.textContent = s; return t; };
for (let r = 0; r <= nl + 1; r++)
  txt(r === 0 ? "emb" : r === nl + 1 ? "logit" : "L" + (r - 1), {x: 4, y: H - 40 - rowH * r - 6, class: "lay"});
doc.tokens.forEach((t, p) => txt(doc.shown[p], {x: 60 + colW * p + 4, y: H - 14, class: "tok"}));
txt("bias", {x: 60 + colW * T + 4, y: H - 14, class: "tok"});
const maxW = Math.max(1e-12, ...edges.map(e => Math.abs(e.weight)));
const shownEdges = edges.slice().sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)).slice(0, 600);
const gEdges = el("g", {});
shownEdges.forEach(e => { const s = byId[e.source], t = byId[e.target];
  e.line = el("line", {x1: s.x, y1: s.y, x2: t.x, y2: t.y, class: "edge",
    stroke: e.weight >= 0 ? "#1f6feb" : "#cf222e",
    "stroke-width": (0.4 + 3.6 * Math.abs(e.weight) / maxW).toFixed(2),
    "stroke-opacity": (0.15 + 0.6 * Math.abs(e.weight) / maxW).toFixed(2)}, gEdges); });
const groupOf = {};
(doc.supernodes || []).forEach(sn => {
  const ms = sn.members.map(id => byId[id]).filter(Boolean);
  if (!ms.length) return;
  ms.forEach(m => { groupOf[m.id] = sn; });
  const xs = ms.map(m => m.x), ys = ms.map(m => m.y);
  const box = el("rect", {class: "super", x: Math.min(...xs) - 7, y: Math.min(...ys) - 7,
    width: Math.max(...xs) - Math.min(...xs) + 14, height: Math.max(...ys) - Math.min(...ys) + 14,
    rx: 6, fill: "#8250df22", stroke: "#8250df", "stroke-dasharray": "3 2"});
  el("title", {}, box).textContent = `${sn.id}: ${ms.length} features`;
});
const colour = {feature: "#8250df", error: "#9a6700", embedding: "#1a7f37", bias: "#57606a", logit: "#0969da"};
nodes.forEach(n => {
  const a = {class: "node", fill: colour[n.kind], "data-id": n.id};
  n.el = n.kind === "feature" || n.kind === "logit"
    ? el("circle", {...a, cx: n.x, cy: n.y, r: n.is_target ? 7 : 4.5})
    : el("rect", {...a, x: n.x - 4, y: n.y - 4, width: 8, height: 8});
  const title = el("title", {}, n.el); title.textContent = n.id;
  n.el.addEventListener("mouseenter", () => show(n));
  n.el.addEventListener("click", ev => { ev.stopPropagation(); pin(n); });
});
const side = document.getElementById("side");
function add(parent, tag, text, cls) { const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text; if (cls) e.className = cls; parent.appendChild(e); return e; }
function name(n) {
  if (n.kind === "feature") return `feature ${n.feature} of block ${n.layer} at ${doc.shown[n.position]}`;
  if (n.kind === "error") return `error of block ${n.layer} at ${doc.shown[n.position]}`;
  if (n.kind === "embedding") return `embedding of ${doc.shown[n.position]} (position ${n.position})`;
  if (n.kind === "logit") return `logit of ${n.shown}` + (n.is_target ? " (target)" : "");
  return "bias: every constant term";
}
function show(n) {
  side.replaceChildren();
  add(side, "h2", name(n));
  // a logit reads the stream and feeds nothing: its influence is not a number to show
  const facts = n.kind === "logit" ? [] : [`influence on the target ${n.influence.toFixed(4)}`];
  if (n.activation !== undefined) facts.push(`activation ${n.activation.toFixed(4)}`);
  if (n.value !== undefined) facts.push(`value ${n.value.toFixed(4)}`);
  if (n.probability !== undefined) facts.push(`probability ${n.probability.toFixed(4)}`);
  add(side, "p", facts.join(" · "), "dim");
  const sn = groupOf[n.id];
  if (sn) add(side, "p", `supernode ${sn.id}: ${sn.members.length} features (${sn.labels.join("; ")})`);
  if (n.label) add(side, "p", "label: " + n.label + " (a summary of its top windows, not an explanation)");
  if (n.examples && n.examples.length) {
    add(side, "p", "top windows of the training text:", "dim");
    const ol = add(side, "ol");
    n.examples.forEach(x => { const li = add(ol, "li", undefined, "ex");
      add(li, "span", x.before); add(li, "b", x.token); add(li, "span", x.after);
      add(li, "span", ` (${x.value.toFixed(2)})`, "dim"); });
  }
  for (const [what, list, key] of [["strongest inputs", n.ins, "source"], ["strongest outputs", n.outs, "target"]]) {
    if (!list.length) continue;
    add(side, "p", what + ":", "dim");
    const ol = add(side, "ol");
    list.slice().sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)).slice(0, 6).forEach(
      e => { const li = add(ol, "li", `${e.weight >= 0 ? "+" : ""}${e.weight.toFixed(4)}  ${name(byId[e[key]])}`);
        if (e.qk) add(li, "div", qkText(e.qk), "dim qk"); });
  }
  nodes.forEach(m => m.el.classList.toggle("on", m === n));
}
function partName(p) { return byId[p] ? name(byId[p]) : p; }
function qkText(q) {
  const terms = list => list.slice(0, 3).map(t => `${partName(t.part)} ${t.term >= 0 ? "+" : ""}${t.term.toFixed(3)}`).join(", ");
  return `via head ${q.head} (attention ${q.attention.toFixed(3)}, score ${q.score.toFixed(3)}): query side ${terms(q.query_terms)}; key side ${terms(q.key_terms)}`;
}
let pinned = null;
function strongest(list, key) { let best = null;
  list.forEach(e => { const w = Math.abs(e.weight) * (key === "target" ? byId[e.target].influence + (byId[e.target].is_target ? 1 : 0) : 1);
    if (!best || w > best[0]) best = [w, e]; }); return best && best[1]; }
function path(n) {
  const on = new Set([n]), lines = new Set();
  for (const [key, next] of [["source", m => m.ins], ["target", m => m.outs]]) {
    let m = n;
    for (let i = 0; i < 2 * nl + 4; i++) { const e = strongest(next(m), key); if (!e) break;
      lines.add(e); m = byId[e[key]]; on.add(m); }
  }
  return [on, lines];
}
function pin(n) {
  if (pinned === n) { pinned = null; svg.classList.remove("pinned");
    nodes.forEach(m => m.el.classList.remove("path")); edges.forEach(e => e.line && e.line.classList.remove("path")); return; }
  pinned = n; const [on, lines] = path(n);
  svg.classList.add("pinned");
  nodes.forEach(m => m.el.classList.toggle("path", on.has(m)));
  edges.forEach(e => { if (!e.line && lines.has(e)) { const s = byId[e.source], t = byId[e.target];
      e.line = el("line", {x1: s.x, y1: s.y, x2: t.x, y2: t.y, class: "edge", stroke: e.weight >= 0 ? "#1f6feb" : "#cf222e", "stroke-width": 2}, gEdges); }
    if (e.line) e.line.classList.toggle("path", lines.has(e)); });
  show(n);
  document.getElementById("pinned").textContent = `pinned: ${name(n)}; ${lines.size} edges on its strongest path (click it again to unpin)`;
}
svg.addEventListener("click", () => { if (pinned) pin(pinned); document.getElementById("pinned").textContent = ""; });
show(nodes.find(n => n.is_target));
})();
