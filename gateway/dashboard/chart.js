// evq dashboard: a queue's counts over the last minutes, drawn on a canvas.
// samples: [{t: ms, ready, reserved, delayed}] in time order; each holds until the next
// one (the counts change only when the server says so), the last one until `now`.
"use strict";

window.evqChart = (function () {
  const SERIES = [
    ["ready", "--ready", "#2e9d57"],
    ["reserved", "--reserved", "#e59a1c"],
    ["delayed", "--delayed", "#4a7fd4"],
  ];

  function colour(name, fallback) {
    const value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return value || fallback;
  }

  // The samples that matter for [start, now]: the last one before start, and the rest.
  function visible(samples, start) {
    let first = 0;
    for (let i = 0; i < samples.length; i++) {
      if (samples[i].t <= start) first = i;
      else break;
    }
    return samples.slice(first);
  }

  function sizeFor(canvas) {
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(1, Math.round(canvas.clientWidth * ratio));
    const height = Math.max(1, Math.round(canvas.clientHeight * ratio));
    if (canvas.width !== width || canvas.height !== height) {
      canvas.width = width;
      canvas.height = height;
    }
    return { width, height, ratio };
  }

  function draw(canvas, samples, now, windowMs) {
    const { width, height, ratio } = sizeFor(canvas);
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, width, height);
    const start = now - windowMs;
    const shown = visible(samples, start);
    const top = 10 * ratio; // room for the scale's label
    const plot = height - top - 1;
    ctx.fillStyle = "#eef1f4";
    ctx.fillRect(0, height - 1, width, 1);
    let max = 1;
    for (const s of shown) max = Math.max(max, s.ready + s.reserved + s.delayed);
    const x = (t) => ((Math.max(t, start) - start) / windowMs) * width;
    const y = (v) => height - 1 - (v / max) * plot;
    // Stacked step areas: ready at the bottom, then reserved, then delayed.
    let drawn = 0;
    for (let i = 0; i < shown.length; i++) {
      const s = shown[i];
      const x0 = x(s.t);
      const x1 = i + 1 < shown.length ? x(shown[i + 1].t) : x(now);
      if (x1 <= x0) continue;
      let base = 0;
      for (const [field, cssName, fallback] of SERIES) {
        const v = s[field] || 0;
        if (v > 0) {
          ctx.fillStyle = colour(cssName, fallback);
          ctx.fillRect(x0, y(base + v), Math.max(1, x1 - x0), y(base) - y(base + v));
          drawn++;
        }
        base += v;
      }
    }
    ctx.fillStyle = "#6b7583";
    ctx.font = `${9 * ratio}px system-ui, sans-serif`;
    ctx.textBaseline = "top";
    ctx.fillText(String(max), 2 * ratio, 0);
    canvas.dataset.samples = String(shown.length);
    canvas.dataset.max = String(max);
    canvas.dataset.areas = String(drawn);
  }

  return { draw, visible };
})();
