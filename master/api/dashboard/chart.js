// The return curve of the dashboard, drawn as SVG with no library: every episode's return, the
// mean of the last 100, the target line and the evaluations (mean with a bar of +- one std),
// against env steps. A long run has more episodes than the chart has pixels: each pixel column
// then draws the lowest and highest return that falls in it, so no episode is left out of sight.
"use strict";

const A3CChart = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const MARGIN = { left: 56, right: 14, top: 10, bottom: 34 };

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    if (parent) parent.appendChild(node);
    return node;
  }

  // About `count` round tick values covering [lo, hi].
  function ticks(lo, hi, count) {
    const raw = (hi - lo) / Math.max(1, count);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function short(value) {
    const abs = Math.abs(value);
    if (abs >= 1e6) return `${+(value / 1e6).toFixed(2)}M`;
    if (abs >= 1e3) return `${+(value / 1e3).toFixed(1)}k`;
    return `${+value.toFixed(2)}`;
  }

  // The path of `ys` against `xs`, one point per episode, or per pixel column the lowest and
  // highest value in it (`envelope`) or its last one, when there are more points than columns.
  function pathOf(xs, ys, sx, sy, columns, envelope) {
    const n = xs.length;
    if (n === 0) return "";
    const parts = [];
    if (n <= 2 * columns) {
      for (let i = 0; i < n; i++) parts.push(`${i ? "L" : "M"}${sx(xs[i]).toFixed(1)},${sy(ys[i]).toFixed(1)}`);
      return parts.join("");
    }
    let column = -1, lo = 0, hi = 0, last = 0;
    const flush = () => {
      if (column < 0) return;
      const x = column + 0.5 + MARGIN.left;
      if (envelope) parts.push(`M${x},${sy(lo).toFixed(1)}L${x},${sy(hi).toFixed(1)}`);
      else parts.push(`${parts.length ? "L" : "M"}${x},${sy(last).toFixed(1)}`);
    };
    for (let i = 0; i < n; i++) {
      const c = Math.floor(sx(xs[i]) - MARGIN.left);
      if (c !== column) { flush(); column = c; lo = hi = ys[i]; }
      lo = Math.min(lo, ys[i]); hi = Math.max(hi, ys[i]); last = ys[i];
    }
    flush();
    return parts.join("");
  }

  // series: {x: [env steps], y: [returns], mean: [mean of the last 100], target: number|null,
  //          evals: [{x, mean, std}]}
  function draw(svg, series) {
    const width = svg.clientWidth || 800, height = svg.clientHeight || 340;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.replaceChildren();
    const plotW = width - MARGIN.left - MARGIN.right, plotH = height - MARGIN.top - MARGIN.bottom;
    // (loops, not Math.min(...values): a long run has more values than a call takes arguments)
    let yLo = Infinity, yHi = -Infinity, xHi = 1;
    const extend = (v) => { yLo = Math.min(yLo, v); yHi = Math.max(yHi, v); };
    for (const v of series.y) extend(v);
    if (series.target != null) extend(series.target);
    for (const e of series.evals) { extend(e.mean - e.std); extend(e.mean + e.std); xHi = Math.max(xHi, e.x); }
    if (series.x.length) xHi = Math.max(xHi, series.x[series.x.length - 1]);
    if (yLo === Infinity) { yLo = 0; yHi = 1; }
    if (yHi - yLo < 1e-9) { yLo -= 1; yHi += 1; }
    const pad = (yHi - yLo) * 0.05;
    yLo -= pad; yHi += pad;
    const sx = (v) => MARGIN.left + (v / xHi) * plotW;
    const sy = (v) => MARGIN.top + (1 - (v - yLo) / (yHi - yLo)) * plotH;

    const grid = el("g", { class: "grid" }, svg);
    for (const v of ticks(yLo, yHi, 6)) {
      el("line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: sy(v), y2: sy(v) }, grid);
      el("text", { x: MARGIN.left - 6, y: sy(v) + 4, "text-anchor": "end" }, grid).textContent = short(v);
    }
    for (const v of ticks(0, xHi, Math.max(2, Math.floor(plotW / 90)))) {
      el("text", { x: sx(v), y: height - MARGIN.bottom + 16, "text-anchor": "middle" }, grid).textContent = short(v);
    }
    el("text", { x: width - MARGIN.right, y: height - 4, "text-anchor": "end" }, grid).textContent = "env steps";
    const axis = el("g", { class: "axis" }, svg);
    el("line", { x1: MARGIN.left, x2: MARGIN.left, y1: MARGIN.top, y2: height - MARGIN.bottom }, axis);
    el("line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: height - MARGIN.bottom, y2: height - MARGIN.bottom }, axis);

    el("path", { class: "episodes", d: pathOf(series.x, series.y, sx, sy, plotW, true) }, svg);
    el("path", { class: "mean100", d: pathOf(series.x, series.mean, sx, sy, plotW, false) }, svg);
    if (series.target != null) {
      el("line", { class: "target", x1: MARGIN.left, x2: width - MARGIN.right, y1: sy(series.target), y2: sy(series.target) }, svg);
    }
    const evals = el("g", { class: "evaluation" }, svg);
    for (const e of series.evals) {
      el("line", { x1: sx(e.x), x2: sx(e.x), y1: sy(e.mean - e.std), y2: sy(e.mean + e.std) }, evals);
      const dot = el("circle", { cx: sx(e.x), cy: sy(e.mean), r: 4 }, evals);
      el("title", {}, dot).textContent = `evaluation at ${short(e.x)} env steps: ${e.mean.toFixed(1)} ± ${e.std.toFixed(1)}`;
    }
    svg.dataset.episodes = String(series.x.length);
    svg.dataset.evaluations = String(series.evals.length);
  }

  return { draw };
})();
