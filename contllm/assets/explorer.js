"use strict";
(function () {
  const data = JSON.parse(document.getElementById("explorer-data").textContent);
  const runs = data.runs;
  const COLORS = ["#4a7bd0", "#d0674a", "#2e9c5a", "#8a4ad0", "#c9a227", "#3bb3c3", "#d04a8f", "#6b6b6b",
                  "#7fa33a", "#a3573a"];
  const $ = (id) => document.getElementById(id);
  const svgNS = "http://www.w3.org/2000/svg";
  const itemIds = [];
  runs.forEach((run) => run.items.forEach((it) => { if (!itemIds.includes(it.id)) itemIds.push(it.id); }));
  const state = { item: itemIds[0], k: 0, label: null };

  function views() {  // [run index, item view] of every run holding the chosen item
    const out = [];
    runs.forEach((run, r) => { const v = run.items.find((it) => it.id === state.item); if (v) out.push([r, v]); });
    return out;
  }
  function nearest(xs, value) {
    let best = 0;
    xs.forEach((x, i) => { if (Math.abs(x - value) < Math.abs(xs[best] - value)) best = i; });
    return best;
  }
  function fmt(p) { return p === null ? "n/a" : p.toFixed(4); }
  function truthAt(v, k) { return v.truths ? v.truths[k] : v.truth; }  // an interpolation has one at its ends only
  function atEnd(v, k) { return v.prompt_end && k === v.x.length - 1 && v.x[k] > v.x[0]; }
  function el(tag, attrs, text) {
    const node = tag.startsWith("svg:") ? document.createElementNS(svgNS, tag.slice(4)) : document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function chooseItem(id) {
    state.item = id;
    const [, first] = views()[0];
    $("knob").max = String(first.x.length - 1);
    let k = first.x.findIndex((x) => Math.abs(x - 1) < 1e-12);
    state.k = k >= 0 ? k : Math.floor((first.x.length - 1) / 2);
    $("knob").value = String(state.k);
    const truth = truthAt(first, state.k) || (first.truths || []).find((t) => t !== null) || first.truth;
    if (truth !== null && truth !== undefined && first.labels.includes(truth)) state.label = truth;
    else if (!first.labels.includes(state.label)) {
      const row = first.probs[state.k];
      state.label = first.labels[row.indexOf(Math.max(...row.map((p) => (p === null ? -1 : p))))];
    }
    render();
  }

  function renderBars(list, value) {
    const box = $("bars");
    box.textContent = "";
    list.forEach(([r, v]) => {
      const k = nearest(v.x, value);
      if (runs.length > 1) box.appendChild(el("div", { class: "run-name" }, `${runs[r].name} (${data.knob} = ${v.x[k]})`));
      const truth = truthAt(v, k);
      v.labels.forEach((label, j) => {
        const p = v.probs[k][j];
        const row = el("div", { class: "bar-row" + (label === truth ? " truth" : ""), "data-run": String(r),
                                "data-label": label, "data-p": p === null ? "" : String(p) });
        row.appendChild(el("span", { class: "bar-label", title: label }, label));
        const track = el("div", { class: "bar-track" });
        track.appendChild(el("div", { class: "bar-fill", style: `width: ${100 * Math.max(0, p || 0)}%` }));
        row.appendChild(track);
        row.appendChild(el("span", { class: "bar-value" }, fmt(p)));
        box.appendChild(row);
      });
    });
  }

  function renderPlot(list, value) {
    const svg = $("plot");
    svg.textContent = "";
    const W = 560, H = 300, L = 40, R = 10, T = 10, B = 30;
    const xs = list.flatMap(([, v]) => v.x);
    const lo = Math.min(...xs), hi = Math.max(...xs);
    const sx = (x) => L + (hi > lo ? (x - lo) / (hi - lo) : 0.5) * (W - L - R);
    const sy = (p) => T + (1 - p) * (H - T - B);
    svg.appendChild(el("svg:line", { x1: L, y1: sy(0), x2: W - R, y2: sy(0), stroke: "#999" }));
    svg.appendChild(el("svg:line", { x1: L, y1: sy(0), x2: L, y2: sy(1), stroke: "#999" }));
    [0, 0.5, 1].forEach((p) => svg.appendChild(el("svg:text", { x: 4, y: sy(p) + 4 }, p.toFixed(1))));
    svg.appendChild(el("svg:text", { x: L, y: H - 8 }, String(lo)));
    svg.appendChild(el("svg:text", { x: W - R - 30, y: H - 8 }, String(hi)));
    svg.appendChild(el("svg:text", { x: (W - L) / 2, y: H - 8 }, data.knob));
    const curve = (v, j, color, chosen) => {
      const points = v.x.map((x, i) => [x, v.probs[i][j]]).filter(([, p]) => p !== null)
        .map(([x, p]) => `${sx(x).toFixed(1)},${sy(p).toFixed(1)}`).join(" ");
      svg.appendChild(el("svg:polyline", { points, class: "curve" + (chosen ? " chosen" : ""), stroke: color,
                                           "stroke-opacity": chosen ? 1 : 0.35 }));
    };
    if (runs.length === 1) {
      const [, v] = list[0];
      v.labels.forEach((label, j) => curve(v, j, COLORS[j % COLORS.length], label === state.label));
    } else {
      list.forEach(([r, v]) => { const j = v.labels.indexOf(state.label); if (j >= 0) curve(v, j, COLORS[r % COLORS.length], true); });
    }
    svg.appendChild(el("svg:line", { id: "cursor", x1: sx(value), x2: sx(value), y1: sy(0), y2: sy(1) }));
    const legend = $("legend");
    legend.textContent = "";
    const [, first] = list[0];
    if (runs.length > 1) list.forEach(([r]) => legend.appendChild(el("span", { style: `color: ${COLORS[r % COLORS.length]}` }, `— ${runs[r].name}`)));
    const truths = new Set([truthAt(first, nearest(first.x, value))].filter((t) => t !== null && t !== undefined));
    first.labels.forEach((label, j) => {
      const span = el("span", { class: (label === state.label ? "chosen" : "") + (truths.has(label) ? " truth" : ""),
                                "data-choose": label,
                                style: runs.length === 1 ? `color: ${COLORS[j % COLORS.length]}` : "" }, label);
      span.addEventListener("click", () => { state.label = label; render(); });
      legend.appendChild(span);
    });
  }

  function renderExpected(list, value) {
    const svg = $("expected");
    svg.textContent = "";
    const [, first] = list[0];
    const shown = list.filter(([, v]) => v.expected);
    $("expected-title").textContent = first.expected_name ? `expected value: ${first.expected_name}` : "expected value";
    if (!shown.length) { $("expected-note").textContent = "these labels have no expected value"; return; }
    const W = 560, H = 190, L = 40, R = 10, T = 10, B = 26;
    const xs = list.flatMap(([, v]) => v.x);
    const lo = Math.min(...xs), hi = Math.max(...xs);
    const values = shown.flatMap(([, v]) => [...v.expected, ...(v.proportional || []), ...(v.expected_truths || [])])
      .filter((y) => y !== null);
    const top = Math.max(1, Math.ceil(Math.max(...values)));
    const sx = (x) => L + (hi > lo ? (x - lo) / (hi - lo) : 0.5) * (W - L - R);
    const sy = (y) => T + (1 - y / top) * (H - T - B);
    svg.appendChild(el("svg:line", { x1: L, y1: sy(0), x2: W - R, y2: sy(0), stroke: "#999" }));
    svg.appendChild(el("svg:line", { x1: L, y1: sy(0), x2: L, y2: sy(top), stroke: "#999" }));
    [0, top / 2, top].forEach((y) => svg.appendChild(el("svg:text", { x: 4, y: sy(y) + 4 }, String(+y.toFixed(2)))));
    svg.appendChild(el("svg:text", { x: L, y: H - 6 }, String(lo)));
    svg.appendChild(el("svg:text", { x: W - R - 30, y: H - 6 }, String(hi)));
    const line = (v, ys, cls, color) => {
      const points = v.x.map((x, i) => [x, ys[i]]).filter(([, y]) => y !== null)
        .map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
      const node = el("svg:polyline", { points, class: cls });
      if (color) node.setAttribute("style", `stroke: ${color}`);
      svg.appendChild(node);
    };
    shown.forEach(([r, v]) => {
      const color = runs.length > 1 ? COLORS[r % COLORS.length] : null;
      if (v.proportional) line(v, v.proportional, "proportional-line", null);
      line(v, v.expected, "expected-line", color);
      const truths = v.expected_truths || [];
      const known = truths.filter((t) => t !== null);
      if (known.length === truths.length && known.length && known.every((t) => t === known[0])) {
        svg.appendChild(el("svg:line", { class: "truth-line", x1: sx(lo), x2: sx(hi), y1: sy(known[0]), y2: sy(known[0]) }));
      } else {
        truths.forEach((t, i) => { if (t !== null) svg.appendChild(el("svg:circle", { class: "truth-ring", cx: sx(v.x[i]), cy: sy(t), r: 7 })); });
      }
    });
    svg.appendChild(el("svg:line", { id: "expected-cursor", x1: sx(value), x2: sx(value), y1: sy(0), y2: sy(top), stroke: "#c33" }));
    const k = nearest(first.x, value);
    const at = first.expected ? first.expected[k] : null;
    const parts = [`${first.expected_name || "expected value"} at the slider: ${at === null ? "n/a" : at.toFixed(3)}`];
    if (first.proportional) parts.push(`dotted: ${first.proportional[k].toFixed(2)} if the count followed time (n × c)`);
    if ((first.expected_truths || []).some((t) => t !== null)) parts.push("green: the true answer");
    $("expected-note").textContent = parts.join("; ");
  }

  function renderTokens(v, value, k) {
    const end = atEnd(v, k);  // an interpolation at its far end shows the other prompt
    const text = (end ? v.prompt_end : v.prompt) || "";
    const span = end ? v.span_end : v.span;
    const tokens = end ? v.tokens_end : v.tokens;
    const edited = end ? v.edited_end : v.edited;
    const names = end ? v.edited_tokens_end : v.edited_tokens;
    const prompt = $("prompt");
    prompt.textContent = "";
    let at = 0;  // the edited text marked wherever it occurs
    while (span && text.indexOf(span, at) >= 0) {
      const hit = text.indexOf(span, at);
      prompt.appendChild(document.createTextNode(text.slice(at, hit)));
      prompt.appendChild(el("mark", {}, span));
      at = hit + span.length;
    }
    prompt.appendChild(document.createTextNode(text.slice(at)));
    prompt.dataset.end = end ? "second" : "first";
    const strip = $("strip");
    strip.textContent = "";
    if (!tokens) { $("strip-note").textContent = "this record keeps no token positions"; return; }
    const unit = Math.max(16, Math.min(40, 1000 / tokens));  // px per unit of time; long prompts scroll, the end is shown
    let total = 0;
    for (let i = 0; i < tokens; i++) {
      const e = edited.indexOf(i);
      const d = e >= 0 && v.scales ? value : 1;
      total += d;
      const box = el("div", { class: "tok" + (e >= 0 ? " edited" : "") + (d === 0 ? " zero" : ""),
                              "data-duration": String(d), title: `token ${i}, duration ${d}` },
                     e >= 0 ? names[e] || "" : "");
      box.style.width = `${d * unit}px`;
      strip.appendChild(box);
    }
    strip.dataset.unit = String(unit);
    strip.scrollLeft = strip.scrollWidth;
    prompt.scrollTop = prompt.scrollHeight;
    const which = v.prompt_end ? (end ? "the second prompt, " : "the first prompt, ") : "";
    $("strip-note").textContent = edited.length
      ? `${which}${tokens} tokens, ${edited.length} edited` + (v.scales ? `, each lasting ${value}; the prompt lasts ${+total.toFixed(4)} steps`
        : " (interpolated in embedding space; durations unchanged)")
      : `${which}${tokens} tokens, every one of duration 1`;
  }

  function render() {
    const list = views();
    const [, first] = list[0];
    const value = first.x[state.k];
    $("knob-name").textContent = data.knob;
    $("knob-value").textContent = String(value);
    renderBars(list, value);
    renderPlot(list, value);
    renderExpected(list, value);
    renderTokens(first, value, state.k);
  }

  $("about").textContent = data.about || "";
  const select = $("item");
  itemIds.forEach((id) => select.appendChild(el("option", { value: id }, id)));
  select.addEventListener("change", () => chooseItem(select.value));
  $("knob").addEventListener("input", () => { state.k = Number($("knob").value); render(); });
  chooseItem(state.item);
})();
