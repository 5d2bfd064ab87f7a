/* The Sweep page's scatter plots drawn by uPlot (docs/design/sweeps.md#sweeps): the sweep's metric against each searched parameter.
 *
 * The server sends each plot's axis and dots (sweeps/charts.py, json_script "scatter-data"). Three series
 * of dots without lines: finished trials, the best trial (ringed) and trials whose run has not finished (hollow:
 * their value is partial). Hovering shows the nearest trial under the plot; drag to zoom, double click resets.
 * A parameter with listed non-numeric values gets one slot per value, labelled.
 */
(function () {
  "use strict";
  var HOVER_PX = 24;  // how close the pointer must be to a dot to name its trial
  var STYLE = {
    final: {fill: "rgba(47,91,211,0.7)", stroke: "#2f5bd3", size: 8, width: 1},
    best: {fill: "#2f5bd3", stroke: "#d92d20", size: 12, width: 3},
    partial: {fill: "#ffffff", stroke: "#2f5bd3", size: 8, width: 1.5},
  };
  var KINDS = ["final", "best", "partial"];

  function padded(low, high, log) {
    if (log) return [low / 1.25, high * 1.25];
    var pad = high === low ? (Math.abs(low) || 1) * 0.1 : (high - low) * 0.08;
    return [low - pad, high + pad];
  }

  /* The series' index of the dot nearest the pointer (in pixels), so the legend names that dot, not the one whose
   * x is nearest (trials share x values). */
  function nearest(u, seriesIdx, fallback) {
    var xs = u.data[0], ys = u.data[seriesIdx], best = null, bestDistance = Infinity;
    var left = u.cursor.left, top = u.cursor.top;
    for (var i = 0; i < xs.length; i++) {
      if (ys[i] === null) continue;
      var dx = u.valToPos(xs[i], "x") - left, dy = u.valToPos(ys[i], "y") - top, d = dx * dx + dy * dy;
      if (d < bestDistance) { bestDistance = d; best = i; }
    }
    return best === null ? fallback : best;
  }

  function build(figure, scatter, payload) {
    var host = figure.querySelector(".chart-plot"), hover = figure.querySelector(".scatter-hover");
    var points = scatter.points.slice().sort(function (a, b) { return a.x - b.x || a.trial - b.trial; });
    var categories = scatter.categories;
    var data = [points.map(function (p) { return p.x; })];
    var series = [{label: scatter.parameter}];
    KINDS.forEach(function (kind) {
      var style = STYLE[kind];
      data.push(points.map(function (p) { return p.kind === kind ? p.y : null; }));
      series.push({label: payload.kinds[kind], stroke: style.stroke, paths: function () { return null; },
                   points: {show: true, size: style.size, width: style.width, fill: style.fill, stroke: style.stroke}});
    });
    var ys = points.map(function (p) { return p.y; });
    // The x axis spans the searched space: two dot-less x values at its padded ends, so zoom and reset stay uPlot's.
    var ends = categories ? [-0.5, categories.length - 0.5]
      : scatter.domain ? padded(scatter.domain[0], scatter.domain[1], scatter.log) : null;
    if (ends) {
      data = data.map(function (column, c) { return [c ? null : ends[0]].concat(column, [c ? null : ends[1]]); });
    }
    var yRange = ys.length ? padded(Math.min.apply(null, ys), Math.max.apply(null, ys), false) : [0, 1];
    var xAxis = {values: function (u, splits) {
      return splits.map(function (v) { return categories ? (categories[v] === undefined ? "" : categories[v]) : madoCharts.compact(v); });
    }};
    if (categories) xAxis.splits = function () { return categories.map(function (_, i) { return i; }); };
    var plot = new uPlot({
      width: Math.max(host.clientWidth, 200),
      height: 240,
      scales: {
        x: {time: false, distr: scatter.log ? 3 : 1},
        y: {range: function () { return yRange; }},
      },
      axes: [xAxis, {size: 56, values: function (u, splits) { return splits.map(madoCharts.compact); }}],
      cursor: {drag: {x: true, y: false}, dataIdx: function (u, seriesIdx, closestIdx) {
        return nearest(u, seriesIdx, closestIdx);
      }},
      legend: {live: false},
      series: series,
      hooks: {setCursor: [function (u) {
        var found = null, distance = HOVER_PX * HOVER_PX;
        if (u.cursor.left >= 0) {
          points.forEach(function (p) {
            var dx = u.valToPos(p.x, "x") - u.cursor.left, dy = u.valToPos(p.y, "y") - u.cursor.top;
            if (dx * dx + dy * dy <= distance) { distance = dx * dx + dy * dy; found = p; }
          });
        }
        hover.textContent = found ? found.label : "";
        hover.dataset.trial = found ? found.trial : "";
      }]},
    }, data, host);
    figure.chart = plot;
    figure.dataset.drawn = String(points.length);
    return plot;
  }

  function init(root) {
    var script = root.querySelector("#scatter-data");
    if (!script || typeof uPlot === "undefined") return;
    var payload = JSON.parse(script.textContent);
    var figures = Array.prototype.slice.call(root.querySelectorAll("figure.sweep-scatter"));
    figures.forEach(function (figure, i) {
      if (figure.chart) figure.chart.destroy();
      build(figure, payload.scatters[i], payload);
    });
    madoCharts.followWidth(figures, 240, root.querySelector(".sweep-scatters") || root);
  }

  document.addEventListener("DOMContentLoaded", function () { init(document); });
})();
