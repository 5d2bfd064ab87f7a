/* The Reliability page's chart drawn by uPlot (docs/design/alerts.md#reliability): GPU-hours lost per week as bars,
 * failures per week as a line on a second axis. The server sends the weeks (json_script "reliability-data").
 */
(function () {
  "use strict";
  function draw() {
    var script = document.getElementById("reliability-data"), figure = document.querySelector("figure.reliability-chart");
    if (!script || !figure || typeof uPlot === "undefined") return;
    var weeks = JSON.parse(script.textContent);
    var xs = weeks.map(function (w) { return Date.parse(w.week + "T00:00:00Z") / 1000; });
    var data = [xs, weeks.map(function (w) { return w.gpu_hours_lost; }), weeks.map(function (w) { return w.failures; })];
    var host = figure.querySelector(".chart-plot");
    var plot = new uPlot({
      width: Math.max(host.clientWidth || 640, 320), height: 260,
      scales: {x: {time: true}, h: {}, n: {}},
      axes: [{}, {scale: "h", label: "GPU-h"}, {scale: "n", side: 1, label: "failures", grid: {show: false}}],
      series: [
        {},
        {label: "GPU-hours lost", scale: "h", stroke: "#d92d20", fill: "rgba(217,45,32,0.35)",
         paths: uPlot.paths.bars({size: [0.6, 60]})},
        {label: "failures", scale: "n", stroke: "#2f5bd3", width: 2, points: {show: true}},
      ],
    }, data, host);
    figure.chart = plot;
    figure.dataset.drawn = String(xs.length);
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
