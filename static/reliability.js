/* The Reliability page's chart drawn by uPlot (docs/design/alerts.md#reliability): GPU-hours lost per week as bars,
 * failures per week as a line on a second axis. The server sends the weeks (json_script "reliability-data").
 */
(function () {
  "use strict";
  var HALF_WEEK = 3.5 * 86400;
  function draw() {
    var script = document.getElementById("reliability-data"), figure = document.querySelector("figure.reliability-chart");
    if (!script || !figure || typeof uPlot === "undefined") return;
    var weeks = JSON.parse(script.textContent);
    var xs = weeks.map(function (w) { return Date.parse(w.week + "T00:00:00Z") / 1000; });
    var data = [xs, weeks.map(function (w) { return w.gpu_hours_lost; }), weeks.map(function (w) { return w.failures; })];
    var host = figure.querySelector(".chart-plot");
    var plot = new uPlot({
      width: Math.max(host.clientWidth || 640, 320), height: 260,
      // Half a week of room on each side, so each week's bar stands whole; both counts start at zero.
      scales: {
        x: {time: true, range: function () { return [xs[0] - HALF_WEEK, xs[xs.length - 1] + HALF_WEEK]; }},
        h: {range: function (u, min, max) { return [0, Math.max(max, 1) * 1.1]; }},
        n: {range: function (u, min, max) { return [0, Math.max(max, 1) * 1.1]; }},
      },
      axes: [{}, {scale: "h", label: "GPU-h"}, {scale: "n", side: 1, label: "failures", grid: {show: false}}],
      series: [
        {},
        {label: "GPU-hours lost", scale: "h", stroke: "#d92d20", fill: "rgba(217,45,32,0.35)",
         paths: uPlot.paths.bars({size: [0.6, 80], align: 0})},
        {label: "failures", scale: "n", stroke: "#2f5bd3", width: 2, points: {show: true}},
      ],
    }, data, host);
    figure.chart = plot;
    figure.dataset.drawn = String(xs.length);
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
