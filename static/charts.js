/* Interactive metric charts drawn by uPlot (docs/design/interfaces.md#workspace).
 *
 * The server sends, per metric key, one series per Run already reduced to what a chart can show
 * (runs/charts.py, json_script "chart-data"). This file only configures uPlot: hover values in the
 * legend, drag to zoom, "Reset zoom" (or double click), log y scale, EMA smoothing with the raw curve
 * faint behind it, x axis by step or wall time, and the data-stage / resume markers as vertical lines.
 * The options live in sessionStorage so the live refresh (htmx swap every 5 s) keeps them.
 */
(function () {
  "use strict";
  var PALETTE = ["#2f5bd3", "#f79009", "#12b76a", "#7a5af8", "#ee46bc", "#06aed4", "#98a2b3", "#b42318",
                 "#667085", "#0e9384"];
  var MARKER_COLORS = {data: "#f79009", resume: "#7a5af8"};
  // Tick spacings of a step axis: whole steps only (1, 2, 5, 10, 20, 50, …), never 22.5.
  var STEP_INCRS = [];
  for (var power = 1; power <= 1e15; power *= 10) STEP_INCRS.push(power, 2 * power, 5 * power);
  var STORE = "mado.charts.options";
  var zooms = {};  // key -> [min, max] of the x scale while zoomed, kept across live refreshes

  function color(index, alpha) {
    var hex = PALETTE[index % PALETTE.length];
    if (alpha === undefined) return hex;
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  function options() {
    try {
      return Object.assign({log: false, smoothing: 0, x: "step"}, JSON.parse(sessionStorage.getItem(STORE) || "{}"));
    } catch (e) {
      return {log: false, smoothing: 0, x: "step"};
    }
  }

  var COMPACT = new Intl.NumberFormat(undefined, {notation: "compact", maximumSignificantDigits: 4});

  var BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

  /* A byte count as "16 GiB" (keys ending in "_bytes", such as the system metrics' memory). */
  function bytes(value) {
    if (value === null) return "";
    var size = Math.abs(value), unit = 0;
    while (size >= 1024 && unit < BYTE_UNITS.length - 1) { size /= 1024; unit += 1; }
    return (value < 0 ? "-" : "") + parseFloat(size.toPrecision(3)) + " " + BYTE_UNITS[unit];
  }

  /* Axis labels that fit: 12,500,000,000 as "12.5B", 0.00012 as "1.2e-4". */
  function compact(value) {
    if (value === null) return "";
    var size = Math.abs(value);
    return size !== 0 && size < 0.001 ? value.toExponential(1) : COMPACT.format(value);
  }

  /* Exponential moving average with TensorBoard's debiasing, so the start is not pulled towards 0. */
  function ema(values, weight) {
    if (!weight) return values;
    var last = 0, count = 0;
    return values.map(function (v) {
      if (v == null) return v;  // a gap: null, or undefined where uPlot.join found no point of this Run
      last = last * weight + (1 - weight) * v;
      count += 1;
      return last / (1 - Math.pow(weight, count));
    });
  }

  /* Each series as an [xs, ys] table sorted by x, one y per x (the last logged wins), positive only on a log
   * scale; then uPlot.join aligns them on one x axis (a gap where a Run has no point there). */
  function tables(chart, opts) {
    return chart.series.map(function (s) {
      var xs = opts.x === "time" ? s.t : s.x, byX = new Map();
      xs.forEach(function (x, i) { byX.set(x, opts.log && s.y[i] <= 0 ? null : s.y[i]); });
      var sorted = Array.from(byX.keys()).sort(function (a, b) { return a - b; });
      return [sorted, sorted.map(function (x) { return byX.get(x); })];
    });
  }

  function markerHook(chart, opts) {
    return function (u) {
      if (opts.x !== "step" || !chart.markers.length) return;
      var ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
      ctx.save();
      ctx.setLineDash([4, 3]);
      ctx.lineWidth = 1.2 * devicePixelRatio;
      chart.markers.forEach(function (m) {
        var x = u.valToPos(m.step, "x", true);
        if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
        ctx.strokeStyle = MARKER_COLORS[m.kind] || MARKER_COLORS.data;
        ctx.beginPath();
        ctx.moveTo(x, top);
        ctx.lineTo(x, top + height);
        ctx.stroke();
      });
      ctx.restore();
    };
  }

  function build(figure, chart, opts, labels) {
    var host = figure.querySelector(".chart-plot");
    host.textContent = "";
    var joined = uPlot.join(tables(chart, opts));
    var data = [joined[0]], series = [{label: opts.x === "time" ? labels.time : labels.step}];
    var format = /_bytes$/.test(chart.key) ? bytes : compact;
    chart.series.forEach(function (s, i) {
      data.push(ema(joined[i + 1], opts.smoothing));
      series.push({label: s.label, stroke: color(s.color), width: 1.6, spanGaps: true, dash: s.dashed ? [6, 3] : undefined,
                   points: {show: s.x.length === 1 ? true : undefined}});
    });
    if (format === bytes) series.forEach(function (s, i) { if (i) s.value = function (u, v) { return bytes(v); }; });
    if (opts.smoothing) {  // the raw curves, faint, behind the smoothed ones; their legend rows are hidden
      chart.series.forEach(function (s, i) {
        data.push(joined[i + 1]);
        series.push({label: s.label + " (raw)", stroke: color(s.color, 0.25), width: 1, spanGaps: true});
      });
    }
    var plot = new uPlot({
      width: Math.max(host.clientWidth, 200),
      height: 220,
      scales: {x: {time: opts.x === "time"}, y: {distr: opts.log ? 3 : 1}},
      axes: [opts.x === "time" ? {} : {incrs: STEP_INCRS},
             {size: 64, values: function (u, splits) { return splits.map(format); }}],
      cursor: {drag: {x: true, y: false}},
      series: series,
      hooks: {
        draw: [markerHook(chart, opts)],
        setScale: [function (u, key) {
          if (key !== "x") return;
          var all = u.data[0], min = u.scales.x.min, max = u.scales.x.max;
          zooms[chart.key] = all.length && (min > all[0] || max < all[all.length - 1]) ? [min, max] : null;
        }],
        setSeries: [function (u, index, s) {  // toggling a Run in the legend toggles its raw curve too
          var n = chart.series.length;
          if (opts.smoothing && index >= 1 && index <= n && s && "show" in s) u.setSeries(index + n, {show: s.show}, false);
        }],
      },
    }, data, host);
    var rows = plot.root.querySelectorAll(".u-legend .u-series");
    for (var r = chart.series.length + 1; r < rows.length; r++) rows[r].classList.add("raw");
    var zoom = zooms[chart.key];
    if (zoom) plot.setScale("x", {min: zoom[0], max: zoom[1]});
    figure.chart = plot;
    return plot;
  }

  function init(root) {
    var script = root.querySelector("#chart-data");
    if (!script || typeof uPlot === "undefined") return;
    var data = JSON.parse(script.textContent), opts = options();
    var tools = root.querySelector(".chart-tools");
    if (!tools) return;  // a Run with no metric (or no system metric) draws no chart
    var labels = {step: tools.dataset.step, time: tools.dataset.time};
    var figures = Array.prototype.slice.call(root.querySelectorAll("figure.metric-chart"));
    var drawAll = function () {
      figures.forEach(function (figure, i) {
        if (figure.chart) figure.chart.destroy();
        build(figure, data.charts[i], opts, labels);
      });
    };
    var log = tools.querySelector(".chart-log"), smooth = tools.querySelector(".chart-smoothing");
    var xAxis = tools.querySelector(".chart-x"), shown = tools.querySelector(".chart-smoothing-value");
    log.checked = opts.log;
    smooth.value = String(opts.smoothing);
    shown.textContent = opts.smoothing.toFixed(2);
    xAxis.value = opts.x;
    var changed = function () {
      opts = {log: log.checked, smoothing: parseFloat(smooth.value), x: xAxis.value};
      shown.textContent = opts.smoothing.toFixed(2);
      sessionStorage.setItem(STORE, JSON.stringify(opts));
      if (xAxis.value !== tools.dataset.drawnX) zooms = {};
      tools.dataset.drawnX = xAxis.value;
      drawAll();
    };
    tools.dataset.drawnX = opts.x;
    log.addEventListener("change", changed);
    smooth.addEventListener("change", changed);
    smooth.addEventListener("input", function () { shown.textContent = parseFloat(smooth.value).toFixed(2); });
    xAxis.addEventListener("change", changed);
    figures.forEach(function (figure) {
      figure.querySelector(".chart-reset").addEventListener("click", function () {
        zooms[figure.dataset.key] = null;
        var xs = figure.chart.data[0];
        if (xs.length) figure.chart.setScale("x", {min: xs[0], max: xs[xs.length - 1]});
      });
    });
    drawAll();
    followWidth(figures, 220, root.querySelector(".chart-grid") || root);
  }

  /* Keep each figure's chart as wide as its ".chart-plot" when ``container`` changes size. */
  function followWidth(figures, height, container) {
    if (!window.ResizeObserver) return;
    new ResizeObserver(function () {
      figures.forEach(function (figure) {
        var host = figure.querySelector(".chart-plot");
        if (figure.chart && host.clientWidth && Math.abs(figure.chart.width - host.clientWidth) > 4) {
          figure.chart.setSize({width: host.clientWidth, height: height});
        }
      });
    }).observe(container);
  }

  window.madoCharts = {color: color, compact: compact, followWidth: followWidth};  // shared with scatter.js
  document.addEventListener("DOMContentLoaded", function () { init(document); });
  document.addEventListener("htmx:afterSettle", function () { init(document); });
})();
