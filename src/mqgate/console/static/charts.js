// The console's charts: uPlot (static/vendor/uplot) draws each [data-uplot] element from the
// JSON block the page carries beside it (the page's policy allows no inline script, and data
// is not script). A chart follows its element's width; a live part (console.js) that swaps
// charts in fires live:before-swap and live:swapped, so old plots are destroyed, new ones drawn.
"use strict";
(() => {
  const HEIGHT = 180;
  const plots = new Map(); // element -> { plot, observer }

  // As mqgate.console.charts.number on the server, so the hover and the table agree.
  const number = (v) => {
    if (v >= 1000 || Number.isInteger(v)) return Math.round(v).toLocaleString("en");
    return v < 10 ? v.toFixed(2) : v.toFixed(1);
  };

  const draw = (el) => {
    const source = document.getElementById(el.dataset.uplot);
    if (!source || plots.has(el)) return;
    const data = JSON.parse(source.textContent);
    const width = () => Math.max(el.clientWidth, 120);
    const utc = (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC");
    // Clock times over a day or less, dates over longer (the week's range).
    const span = data.times.length ? data.times[data.times.length - 1] - data.times[0] : 0;
    const tick = uPlot.fmtDate(span > 86400 ? "{MM}-{DD}" : "{HH}:{mm}");
    const full = uPlot.fmtDate("{YYYY}-{MM}-{DD} {HH}:{mm}");
    const opts = {
      width: width(),
      height: HEIGHT,
      // The tables and summaries say UTC: so does the time axis.
      tzDate: utc,
      scales: { x: { time: true }, y: { range: () => [0, data.top] } },
      series: [
        { label: "Time (UTC)", value: (u, ts, s, idx) => (idx == null ? "–" : full(utc(ts))) },
        {
          label: data.unit,
          stroke: "#1f5fbf",
          width: 2,
          fill: "rgba(31, 95, 191, 0.08)",
          // A point between two gaps has no line: its dot shows it.
          points: { show: true, size: 6, fill: "#1f5fbf" },
          value: (u, v, s, idx) => {
            if (idx == null) return "–"; // the cursor is not on the chart
            return v == null ? "no data" : `${number(v)} ${data.unit}`;
          },
        },
      ],
      axes: [
        {
          stroke: "#5d6675",
          grid: { stroke: "#d8dde6", width: 1 },
          ticks: { stroke: "#d8dde6" },
          values: (u, splits) => splits.map((ts) => tick(utc(ts))),
        },
        {
          stroke: "#5d6675",
          size: 52,
          grid: { stroke: "#d8dde6", width: 1 },
          ticks: { stroke: "#d8dde6" },
          values: (u, ticks) => ticks.map(number),
        },
      ],
      cursor: { drag: { x: false, y: false } },
    };
    const plot = new uPlot(opts, [data.times, data.values], el);
    const observer = new ResizeObserver(() => {
      if (el.clientWidth && width() !== plot.width) plot.setSize({ width: width(), height: HEIGHT });
    });
    observer.observe(el);
    plots.set(el, { plot, observer });
  };

  const drawIn = (root) => root.querySelectorAll("[data-uplot]").forEach(draw);
  const destroyIn = (root) => {
    for (const [el, { plot, observer }] of plots) {
      if (root.contains(el) || !el.isConnected) {
        observer.disconnect();
        plot.destroy();
        plots.delete(el);
      }
    }
  };

  document.addEventListener("live:before-swap", (e) => destroyIn(e.target));
  document.addEventListener("live:swapped", (e) => drawIn(e.target));
  // How many plots are alive (the browser tests check a swap leaves none behind).
  window.mqgateCharts = { count: () => plots.size };
  drawIn(document);
})();
