// Titan's live dashboard: polls dashboard/data every second and redraws the charts (Plotly,
// served by Titan from the installed plotly package) and the deployments table.
"use strict";

(() => {
  const POLL_MS = 1000;
  const MAX_SAMPLES = 300; // what the server keeps: five minutes at one a second
  const MIN_WINDOW_S = 60;
  const COLORS = {
    blue: "#2563eb", red: "#dc2626", amber: "#d97706", green: "#16a34a",
    violet: "#7c3aed", teal: "#0d9488", grey: "#6b7280",
  };
  // One chart per entry; each trace plots sample[key] * scale.
  const CHARTS = [
    { id: "chart-requests", title: "Requests / s", traces: [
      { key: "requests_per_s", name: "requests/s", color: COLORS.blue, fill: "tozeroy" },
    ] },
    { id: "chart-errors", title: "Errors and refusals / s", traces: [
      { key: "errors_per_s", name: "errors (non-2xx)", color: COLORS.red },
      { key: "refusals_per_s", name: "refused by admission", color: COLORS.amber },
    ] },
    { id: "chart-latency", title: "End-to-end latency (ms)", traces: [
      { key: "latency_p50_s", name: "p50", color: COLORS.blue, scale: 1000 },
      { key: "latency_p99_s", name: "p99", color: COLORS.violet, scale: 1000 },
      { key: "latency_mean_s", name: "mean", color: COLORS.grey, scale: 1000, dash: "dot" },
    ] },
    { id: "chart-ttft", title: "Time to first token (ms)", traces: [
      { key: "ttft_p50_s", name: "p50", color: COLORS.teal, scale: 1000 },
      { key: "ttft_p99_s", name: "p99", color: COLORS.violet, scale: 1000 },
      { key: "ttft_mean_s", name: "mean", color: COLORS.grey, scale: 1000, dash: "dot" },
    ] },
    { id: "chart-queue", title: "Queue depth and running (admission)", traces: [
      { key: "queue_depth", name: "waiting", color: COLORS.amber },
      { key: "running", name: "running", color: COLORS.blue },
      { key: "engine_batch", name: "engine batch", color: COLORS.green },
    ] },
    { id: "chart-kv", title: "KV-cache usage (%)", range: [0, 100], traces: [
      { key: "kv_cache_usage", name: "fullest engine", color: COLORS.violet, scale: 100,
        fill: "tozeroy" },
    ], empty: "no embedded engine" },
    { id: "chart-cache", title: "Response cache hit rate (%)", range: [0, 100], traces: [
      { key: "cache_hit_rate", name: "hits / lookups", color: COLORS.green, scale: 100 },
    ], empty: "no cache lookups yet" },
  ];
  const PLOT_CONFIG = { displayModeBar: false, responsive: true };

  let samples = [];
  let lastT = null;

  const $ = (id) => document.getElementById(id);

  function pad(n, width = 2) { return String(n).padStart(width, "0"); }

  // Plotly reads "YYYY-MM-DD HH:MM:SS" as wall-clock time: give it the browser's local time.
  function localStamp(t) {
    const d = new Date(t * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.` +
      pad(d.getMilliseconds(), 3);
  }

  // At least a minute wide, so that the first seconds sit at the right edge, as they will later.
  function xRange() {
    if (!samples.length) return undefined;
    const last = samples[samples.length - 1].t;
    return [localStamp(Math.min(samples[0].t, last - MIN_WINDOW_S)), localStamp(last)];
  }

  function layout(chart, hasData) {
    const yaxis = { gridcolor: "#eef0f3", zeroline: false, rangemode: "tozero", fixedrange: true };
    if (chart.range) { yaxis.range = chart.range; yaxis.autorange = false; }
    const annotations = hasData || !chart.empty ? [] : [{
      text: chart.empty, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
      font: { color: COLORS.grey, size: 13 },
    }];
    return {
      title: { text: chart.title, x: 0.01, xanchor: "left", font: { size: 14 } },
      margin: { l: 48, r: 12, t: 36, b: 32 },
      xaxis: { type: "date", gridcolor: "#eef0f3", fixedrange: true, tickformat: "%H:%M:%S", range: xRange() },
      yaxis,
      showlegend: chart.traces.length > 1,
      legend: { orientation: "h", x: 1, xanchor: "right", y: 1.12, font: { size: 11 } },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, sans-serif", color: "#1f2430" },
      hovermode: "x unified",
      annotations,
    };
  }

  function drawCharts() {
    const x = samples.map((s) => localStamp(s.t));
    for (const chart of CHARTS) {
      let hasData = false;
      const traces = chart.traces.map((trace) => {
        const y = samples.map((s) => {
          const v = s[trace.key];
          if (v === null || v === undefined) return null;
          hasData = true;
          return v * (trace.scale || 1);
        });
        return {
          x, y, name: trace.name, type: "scatter", mode: "lines",
          line: { color: trace.color, width: 2, shape: "linear", dash: trace.dash || "solid" },
          fill: trace.fill || "none",
          fillcolor: trace.fill ? `${trace.color}22` : undefined,
          connectgaps: false,
          hovertemplate: "%{y:.3~f}<extra>" + trace.name + "</extra>",
        };
      });
      Plotly.react($(chart.id), traces, layout(chart, hasData), PLOT_CONFIG);
    }
  }

  function fmt(value, digits = 2) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
  }
  function ms(seconds) {
    return seconds === null || seconds === undefined ? "–" : `${(seconds * 1000).toFixed(0)} ms`;
  }
  function pct(fraction) {
    return fraction === null || fraction === undefined ? "–" : `${(fraction * 100).toFixed(0)}%`;
  }

  function drawTiles() {
    const s = samples[samples.length - 1];
    if (!s) return;
    $("tile-requests").textContent = fmt(s.requests_per_s, 1);
    $("tile-errors").textContent = fmt(s.errors_per_s, 1);
    $("tile-refusals").textContent = fmt(s.refusals_per_s, 1);
    $("tile-latency").textContent = ms(s.latency_p99_s);
    $("tile-ttft").textContent = ms(s.ttft_p99_s);
    $("tile-queue").textContent = `${s.queue_depth} · ${s.running}`;
    $("tile-kv").textContent = pct(s.kv_cache_usage);
    $("tile-cache").textContent = pct(s.cache_hit_rate);
  }

  function drawModels(models) {
    const box = $("models");
    box.replaceChildren(...models.map((name) => {
      const chip = document.createElement("span");
      chip.className = "model";
      chip.textContent = name;
      return chip;
    }));
  }

  function cell(text, className) {
    const td = document.createElement("td");
    if (className) td.className = className;
    td.textContent = text;
    return td;
  }
  function badge(text, className) {
    const td = document.createElement("td");
    const span = document.createElement("span");
    span.className = `badge ${className}`;
    span.textContent = text;
    td.appendChild(span);
    return td;
  }

  function drawDeployments(deployments) {
    const rows = deployments.map((d) => {
      const tr = document.createElement("tr");
      tr.dataset.deployment = d.deployment;
      tr.append(
        cell(d.model), cell(d.deployment),
        badge(d.health, `health-${d.health}`),
        badge(d.breaker.replace("_", "-"), `breaker-${d.breaker}`),
        cell(String(d.outstanding), "num"), cell(String(d.attempts), "num"),
        cell(String(d.successes), "num"), cell(String(d.failures), "num"),
        cell(ms(d.ewma_ttfb_s), "num"), cell(String(d.breaker_openings), "num"),
        cell(d.last_breaker_reason || "", "subtle"),
      );
      return tr;
    });
    $("deployments").tBodies[0].replaceChildren(...rows);
  }

  function setStatus(kind, text) {
    const status = $("status");
    status.className = `status status-${kind}`;
    status.textContent = text;
  }

  async function poll() {
    const url = lastT === null ? "dashboard/data" : `dashboard/data?since=${lastT}`;
    try {
      const response = await fetch(url, { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const data = await response.json();
      if (data.samples.length) {
        samples = samples.concat(data.samples).slice(-MAX_SAMPLES);
        lastT = samples[samples.length - 1].t;
      }
      drawModels(data.models);
      drawDeployments(data.deployments);
      drawTiles();
      drawCharts();
      setStatus("live", `live · ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      setStatus("offline", `offline, retrying (${error.message})`);
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  drawCharts(); // empty axes at once; the first poll fills them
  poll();
})();
