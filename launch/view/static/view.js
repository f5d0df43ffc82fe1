// dfedrw's web view: the peer network of a run, each round's weights on its edges, and the
// run's course beside it. Fed by the server's events (a live or finished run) or by the data
// a static export carries in the page. Read-only: it asks the server for nothing but data.
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  const token = new URLSearchParams(location.search).get("token") || "";
  const $ = (id) => document.getElementById(id);

  const state = {
    meta: null,
    byzantine: new Set(),
    rounds: [],      // rounds[r]: Map client -> its round-r record
    stats: [],       // stats[r]: the round's sums over honest clients (see add)
    lastAccuracy: new Map(), // client -> [[round, local accuracy]] (evaluation rounds)
    lastSuccess: new Map(),  // client -> [[round, attack success]] (evaluation rounds, under a backdoor)
    last: -1,        // the highest round read
    round: 0,        // the round drawn
    follow: true,
    ended: false,    // no more records will come
    selected: null,
    finals: {},
    pending: false,
    received: 0,     // records taken in
    drawn: 0,        // records taken in when the page was last drawn
  };

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }

  function statsAt(r) {
    let s = state.stats[r];
    if (!s) {
      s = state.stats[r] = {
        acc: [], share: 0, receivers: 0, byzSeen: 0, byzZero: 0, honSeen: 0, honZero: 0, asr: [], stale: 0, staleN: 0,
        seconds: 0, secondsN: 0, bytes: 0, bytesN: 0,
      };
    }
    return s;
  }

  // Records of one batch: kept by round, the round's sums updated.
  function add(records) {
    state.received += records.length;
    for (const rec of records) {
      const r = rec.round;
      let round = state.rounds[r];
      if (!round) round = state.rounds[r] = new Map();
      round.set(rec.c, rec);
      if (r > state.last) state.last = r;
      if (state.byzantine.has(rec.c)) continue;
      const s = statsAt(r);
      if (rec.accuracy != null) {
        s.acc.push(rec.accuracy);
        if (!state.lastAccuracy.has(rec.c)) state.lastAccuracy.set(rec.c, []);
        state.lastAccuracy.get(rec.c).push([r, rec.accuracy]);
      }
      if (rec.attack_success != null) {
        s.asr.push(rec.attack_success);
        if (!state.lastSuccess.has(rec.c)) state.lastSuccess.set(rec.c, []);
        state.lastSuccess.get(rec.c).push([r, rec.attack_success]);
      }
      const weights = rec.weights || {};
      let share = 0;
      for (const sender in weights) {
        const j = Number(sender), w = weights[sender];
        if (j === rec.c) continue;
        if (state.byzantine.has(j)) { share += w; s.byzSeen += 1; if (w === 0) s.byzZero += 1; }
        else { s.honSeen += 1; if (w === 0) s.honZero += 1; }
      }
      s.share += share; s.receivers += 1;
      if (rec.staleness) for (const j in rec.staleness) { s.stale += rec.staleness[j]; s.staleN += 1; }
      if (rec.seconds != null) { s.seconds += rec.seconds; s.secondsN += 1; }
      if (rec.bytes_sent != null) { s.bytes += rec.bytes_sent; s.bytesN += 1; }
    }
    const slider = $("slider");
    slider.max = Math.max(0, state.last);
    if (state.follow) state.round = followed();
    schedule();
  }

  // The round a page that follows the run draws: while it goes, the one before the newest (the
  // newest is still coming in, client by client); once it ended, the last.
  function followed() {
    return Math.max(0, state.ended ? state.last : state.last - 1);
  }

  // While the run goes, records arriving redraw the page at most once a second (a person
  // watching needs no more, and a browser on the machine that runs the clients takes its time
  // from them); a run that ended, and what a person does (the slider, a click), is drawn at once.
  const REDRAW_MS = 1000;
  let lastDraw = -Infinity;
  function schedule() {
    if (state.pending) return;
    state.pending = true;
    const wait = state.ended ? 0 : Math.max(0, lastDraw + REDRAW_MS - performance.now());
    setTimeout(() => requestAnimationFrame(() => { state.pending = false; draw(); }), wait);
  }

  function accuracyColour(a) {
    if (a == null) return "#ddd";
    return `hsl(${Math.round(1.2 * Math.max(0, Math.min(100, a)))}, 60%, 58%)`;
  }

  // A client's measure (local accuracy, attack success) at its last evaluation up to round r.
  function measureAt(byClient, k, r) {
    const list = byClient.get(k);
    if (!list) return null;
    let found = null;
    for (const [round, a] of list) { if (round <= r) found = a; else break; }
    return found;
  }

  function radius() {
    return Math.min(0.03, 0.28 / Math.sqrt(Math.max(1, state.meta.clients)));
  }

  // One arrow from sender to receiver, off the centre line (so both directions show) and
  // ending at the receiver's rim.
  function arrow(parent, from, to, attrs) {
    const p = state.meta.positions, a = p[from], b = p[to];
    if (!a || !b) return null;
    const dx = b[0] - a[0], dy = b[1] - a[1], len = Math.hypot(dx, dy) || 1;
    const ux = dx / len, uy = dy / len, off = radius() * 0.3, rr = radius() * 1.15;
    return el("line", Object.assign({
      x1: a[0] + ux * rr - uy * off, y1: a[1] + uy * rr + ux * off,
      x2: b[0] - ux * rr - uy * off, y2: b[1] - uy * rr + ux * off,
      "data-from": from, "data-to": to,
    }, attrs), parent);
  }

  function drawGraph() {
    const r = state.round, round = state.rounds[r] || new Map();
    const edges = $("edges"), nodes = $("nodes");
    edges.textContent = ""; nodes.textContent = "";
    const frag = document.createDocumentFragment();
    for (const [k, rec] of round) {
      if (state.byzantine.has(k)) continue;
      const weights = rec.weights || {};
      for (const sender in weights) {
        const j = Number(sender);
        if (j === k) continue;
        const w = weights[sender];
        const byz = state.byzantine.has(j);
        const kind = w === 0 ? "zero" : byz ? "byzantine" : "honest";
        // Under asynchronous gossip a model that came steps ago (late) is drawn fainter.
        const late = rec.staleness ? rec.staleness[sender] || 0 : 0;
        const line = arrow(frag, j, k, {
          class: kind + (late ? " late" : ""), "data-weight": w, "stroke-width": (0.0015 + 0.02 * w).toFixed(5),
          "marker-end": w === 0 ? "" : `url(#arrow-${byz ? "byzantine" : "honest"})`,
          ...(late ? { "stroke-opacity": Math.max(0.25, 1 - 0.15 * late).toFixed(2), "data-late": late } : {}),
        });
        if (line) el("title", {}, line).textContent = `${j} \u2192 ${k}: weight ${w}` + (rec.scores && rec.scores[sender] != null ? `, score ${rec.scores[sender]}` : "") + (late ? `, ${late} steps late` : "");
      }
      for (const j of rec.missing || []) arrow(frag, j, k, { class: "missing", "data-weight": "missing" });
    }
    edges.appendChild(frag);
    const rad = radius(), p = state.meta.positions;
    for (let k = 0; k < state.meta.clients; k++) {
      const at = p[k];
      if (!at) continue;
      const byz = state.byzantine.has(k);
      const g = el("g", { class: "node" + (byz ? " byzantine" : "") + (state.selected === k ? " selected" : ""), "data-client": k }, nodes);
      const acc = byz ? null : measureAt(state.lastAccuracy, k, r), success = byz ? null : measureAt(state.lastSuccess, k, r);
      el("circle", { cx: at[0], cy: at[1], r: rad, fill: byz ? "#3a3a3a" : accuracyColour(acc) }, g);
      const rec = round.get(k), final = state.finals[k] || {};
      const rings = [];
      if (final.completed === false) rings.push("failed");
      if ((final.restarts || 0) > 0 || (rec && rec.resumed_from != null)) rings.push("restarted");
      if (rec && !byz && rec.weights && Object.keys(rec.weights).length <= 1) rings.push("isolated");
      rings.forEach((kind, i) => el("circle", { class: `ring ${kind}`, cx: at[0], cy: at[1], r: rad * (1.3 + 0.25 * i) }, g));
      const text = el("text", { x: at[0], y: at[1], style: `font-size:${(rad * 0.95).toFixed(4)}px` }, g);
      text.textContent = byz ? `B${k}` : String(k);
      if (acc != null) {
        // Below the client: its accuracy, and under a backdoor the attack's success on it.
        const note = el("text", { class: "measure", x: at[0], y: at[1] + rad * 1.75, style: `font-size:${(rad * 0.6).toFixed(4)}px` }, g);
        note.textContent = `${acc.toFixed(0)}%`;
        if (success != null) el("tspan", { class: "success" }, note).textContent = ` \u00b7 ${success.toFixed(0)}%`;
      }
      el("title", {}, g).textContent = byz ? `client ${k}: Byzantine (${state.meta.attack})` : `client ${k}: accuracy ${acc == null ? "not yet measured" : acc.toFixed(2) + " %"}` + (success == null ? "" : `, attack success ${success.toFixed(2)} %`);
      g.addEventListener("click", () => { state.selected = k; draw(); });
    }
  }

  function drawBase() {
    const base = $("base");
    base.textContent = "";
    const p = state.meta.positions, seen = new Set();
    for (const [u, v] of state.meta.edges) {
      const key = u < v ? `${u}-${v}` : `${v}-${u}`;
      if (seen.has(key)) continue;
      seen.add(key);
      el("line", { x1: p[u][0], y1: p[u][1], x2: p[v][0], y2: p[v][1] }, base);
    }
  }

  // Where round r lies on the charts' x axis: the round; or, where the records say, the mean
  // seconds the honest clients had run at its end (wall time, or a batched run's simulated
  // clock), or the megabytes each had sent by then on average. Returns [x of each round up to
  // the last read, the axis's end].
  function axis() {
    const kind = $("axis").value, xs = [];
    if (kind === "rounds") {
      for (let r = 0; r <= state.last; r++) xs.push(r);
      return [xs, Math.max(1, state.meta.rounds - 1)];
    }
    let sent = 0, end = 0;
    for (let r = 0; r <= state.last; r++) {
      const s = state.stats[r];
      if (kind === "seconds") xs.push(s && s.secondsN ? s.seconds / s.secondsN : null);
      else { if (s && s.bytesN) sent += s.bytes / s.bytesN / 1e6; xs.push(s && s.bytesN ? sent : null); }
      if (xs[r] != null) end = Math.max(end, xs[r]);
    }
    return [xs, end || 1];
  }

  // A line chart of series [[round, value], ...] with the drawn round marked.
  function chart(id, series, top, xs, end) {
    const svg = document.querySelector(`#${id} svg`);
    const w = svg.clientWidth || 400, h = svg.clientHeight || 90, left = 30, bottom = 12;
    svg.textContent = "";
    let hi = top;
    if (hi == null) { hi = 0; for (const s of series) for (const pt of s.points) hi = Math.max(hi, pt[1]); hi = hi || 1; }
    const x = (r) => left + (w - left - 4) * (xs[r] == null ? 0 : xs[r]) / end, y = (v) => 4 + (h - bottom - 8) * (1 - v / hi);
    series = series.map((s) => ({ kind: s.kind, points: s.points.filter(([r]) => xs[r] != null) }));
    el("line", { class: "axis", x1: left, y1: y(0), x2: w - 4, y2: y(0) }, svg);
    el("text", { x: 2, y: y(hi) + 4 }, svg).textContent = hi >= 10 ? hi.toFixed(0) : hi.toFixed(2);
    el("text", { x: 2, y: y(0) }, svg).textContent = "0";
    for (const s of series) {
      if (!s.points.length) continue;
      el("polyline", { class: s.kind, points: s.points.map(([r, v]) => `${x(r).toFixed(1)},${y(v).toFixed(1)}`).join(" ") }, svg);
    }
    if (xs[state.round] != null) el("line", { class: "now", x1: x(state.round), y1: 2, x2: x(state.round), y2: h - bottom }, svg);
    el("text", { x: w - 4, y: h - 1, "text-anchor": "end" }, svg).textContent = end >= 100 ? end.toFixed(0) : end.toPrecision(3);
  }

  function drawCharts() {
    const mean = [], worst = [], share = [], tp = [], fp = [], asr = [], stale = [];
    for (let r = 0; r <= state.last; r++) {
      const s = state.stats[r];
      if (!s) continue;
      if (s.acc.length) { mean.push([r, s.acc.reduce((a, b) => a + b, 0) / s.acc.length]); worst.push([r, Math.min(...s.acc)]); }
      if (s.receivers) share.push([r, s.share / s.receivers]);
      if (s.byzSeen) tp.push([r, s.byzZero / s.byzSeen]);
      if (s.honSeen) fp.push([r, s.honZero / s.honSeen]);
      if (s.asr.length) asr.push([r, s.asr.reduce((a, b) => a + b, 0) / s.asr.length]);
      if (s.staleN) stale.push([r, s.stale / s.staleN]);
    }
    const [xs, end] = axis();
    chart("chart-accuracy", [{ kind: "mean", points: mean }, { kind: "worst", points: worst }], 100, xs, end);
    chart("chart-share", [{ kind: "share", points: share }], 1, xs, end);
    chart("chart-detect", [{ kind: "tp", points: tp }, { kind: "fp", points: fp }], 1, xs, end);
    $("chart-asr").hidden = !asr.length;
    if (asr.length) chart("chart-asr", [{ kind: "asr", points: asr }], 100, xs, end);
    $("chart-stale").hidden = !stale.length;
    if (stale.length) chart("chart-stale", [{ kind: "stale", points: stale }], null, xs, end);
  }

  function drawClient() {
    const k = state.selected, table = $("candidates");
    table.textContent = "";
    if (k == null) return;
    const rec = (state.rounds[state.round] || new Map()).get(k);
    const byz = state.byzantine.has(k);
    $("client-title").textContent = `client ${k}${byz ? " (Byzantine)" : ""}, round ${state.round}`;
    if (!rec) { table.innerHTML = '<tr><td class="empty">no record of this round (yet)</td></tr>'; return; }
    if (byz) {
      table.innerHTML = "<tr><th>received from</th></tr>";
      const row = table.insertRow(); row.insertCell().textContent = (rec.received_from || []).join(", ") || "nobody";
      return;
    }
    const gossip = state.meta.asynchronous, columns = ["sender", "score", "weight", ...(gossip ? ["staleness"] : [])];
    const head = table.insertRow();
    for (const name of columns) { const th = document.createElement("th"); th.textContent = name; head.appendChild(th); }
    const weights = rec.weights || {}, scores = rec.scores || {}, stale = rec.staleness || {};
    for (const sender of Object.keys(weights).sort((a, b) => Number(a) - Number(b))) {
      const j = Number(sender), row = table.insertRow();
      row.className = "candidate" + (state.byzantine.has(j) ? " byzantine" : "");
      row.dataset.sender = sender;
      row.insertCell().textContent = j === k ? `${j} (own)` : state.byzantine.has(j) ? `${j} (Byzantine)` : String(j);
      row.insertCell().textContent = scores[sender] == null ? "-" : String(scores[sender]);
      row.insertCell().textContent = String(weights[sender]);
      if (gossip) row.insertCell().textContent = stale[sender] == null ? "0" : String(stale[sender]);
    }
    for (const j of rec.missing || []) {
      const row = table.insertRow(); row.className = "missing";
      row.insertCell().textContent = `${j} (missing)`;
      for (let i = 1; i < columns.length; i++) row.insertCell().textContent = "-";
    }
  }

  function draw() {
    if (!state.meta) return;
    lastDraw = performance.now();
    state.drawn = state.received;
    $("slider").value = state.round;
    $("round").textContent = state.last < 0 ? "-" : String(state.round);
    $("last").textContent = state.last < 0 ? "none" : String(state.last);
    drawGraph();
    drawCharts();
    drawClient();
  }

  function begin(meta) {
    state.meta = meta;
    const xs = Object.values(meta.positions).map((p) => p[0]), ys = Object.values(meta.positions).map((p) => p[1]);
    const pad = 2.5 * Math.min(0.03, 0.28 / Math.sqrt(Math.max(1, meta.clients)));
    const x0 = Math.min(...xs) - pad, y0 = Math.min(...ys) - pad;
    $("graph").setAttribute("viewBox", `${x0} ${y0} ${Math.max(...xs) + pad - x0} ${Math.max(...ys) + pad - y0}`);
    state.byzantine = new Set(meta.byzantine);
    $("total").textContent = String(meta.rounds);
    $("what").textContent = `${meta.clients} clients (${meta.byzantine.length} Byzantine, ${meta.attack}), rule ${meta.rule}, ${meta.engine} engine` +
      (meta.asynchronous ? ", asynchronous gossip (rounds are steps)" : "") + (meta.schedule ? `, schedule ${meta.schedule}` : "");
    drawBase();
    draw();
  }

  $("slider").addEventListener("input", (e) => {
    state.round = Number(e.target.value);
    state.follow = state.round >= followed();
    $("follow").checked = state.follow;
    draw();
  });
  $("axis").addEventListener("change", () => draw());
  $("follow").addEventListener("change", (e) => { state.follow = e.target.checked; if (state.follow) { state.round = followed(); draw(); } });

  window.dfedrwView = {
    state,
    // Scrub to round r (what the slider does), drawn at once.
    show(r) { state.round = r; state.follow = false; $("follow").checked = false; draw(); },
    select(k) { state.selected = k; draw(); },
  };

  const embedded = document.getElementById("run-data");
  if (embedded) {
    const data = JSON.parse(embedded.textContent);
    state.finals = data.finals || {};
    state.ended = true;
    begin(data.meta);
    add(data.records);
    $("status").textContent = "a saved copy of the run";
    return;
  }
  fetch(`meta?token=${encodeURIComponent(token)}`).then((r) => r.json()).then((meta) => {
    state.ended = Boolean(meta.ended);
    begin(meta);
    const events = new EventSource(`events?token=${encodeURIComponent(token)}`);
    events.addEventListener("open", () => { $("status").textContent = "live"; });
    events.addEventListener("rounds", (e) => add(JSON.parse(e.data)));
    events.addEventListener("finals", (e) => { state.finals = JSON.parse(e.data); schedule(); });
    events.addEventListener("end", () => {
      $("status").textContent = "the run ended";
      events.close();
      state.ended = true;
      if (state.follow) state.round = followed();
      schedule();
    });
    events.addEventListener("error", () => { if ($("status").textContent !== "the run ended") $("status").textContent = "disconnected"; });
  });
})();
