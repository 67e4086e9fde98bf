// The operator's view: the server's /metrics (Prometheus text), polled while the panel is open.
//
// Sessions and the queue are the server's gauges. Steps per second and the
// step latency percentiles are computed from the difference between two
// polls, so they describe the last interval, not the server's whole life.

const POLL_MS = 1000;

// Prometheus text exposition format: `name{label="v",...} value` per line.
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)/);
    if (!match) continue;
    const labels = {};
    for (const pair of (match[3] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[pair[1]] = pair[2];
    }
    samples.push({ name: match[1], labels, value: Number(match[4]) });
  }
  return samples;
}

function total(samples, name) {
  return samples.filter((s) => s.name === name).reduce((sum, s) => sum + s.value, 0);
}

function buckets(samples) {
  return samples
    .filter((s) => s.name === "openenv_step_seconds_bucket")
    .map((s) => ({ le: s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), count: s.value }))
    .sort((a, b) => a.le - b.le);
}

// The q-quantile of the steps between two polls, from their histogram buckets
// (linear within a bucket, as Prometheus's histogram_quantile does).
export function quantile(q, before, after) {
  const now = buckets(after);
  const then = new Map(buckets(before).map((b) => [b.le, b.count]));
  const counts = now.map((b) => ({ le: b.le, count: b.count - (then.get(b.le) || 0) }));
  const n = counts.length ? counts[counts.length - 1].count : 0;
  if (n <= 0) return null;
  const rank = q * n;
  let lower = 0;
  let below = 0;
  for (const { le, count } of counts) {
    if (count >= rank) {
      if (le === Infinity) return lower;
      const inBucket = count - below;
      return inBucket > 0 ? lower + ((le - lower) * (rank - below)) / inBucket : le;
    }
    lower = le === Infinity ? lower : le;
    below = count;
  }
  return lower;
}

const ms = (seconds) => (seconds === null ? "–" : `${(seconds * 1000).toPrecision(3)} ms`);

export class MetricsPanel {
  // `ui`: the panel (a <details>) and its value elements; `load`: fetches /metrics as text.
  constructor(ui, load) {
    this.ui = ui;
    this.load = load;
    this.timer = null;
    this.polling = false;
    this.last = null; // { samples, at }
    ui.panel.addEventListener("toggle", () => (ui.panel.open ? this.start() : this.stop()));
  }

  start() {
    if (this.timer !== null) return;
    this.poll();
    this.timer = setInterval(() => this.poll(), POLL_MS);
  }

  stop() {
    clearInterval(this.timer);
    this.timer = null;
    this.last = null;
  }

  // One request at a time: a server too busy to answer within a period is not
  // asked again until it has, and answers cannot arrive out of order.
  async poll() {
    if (this.polling) return;
    this.polling = true;
    let samples;
    let problem = null;
    try {
      samples = parseMetrics(await this.load());
    } catch (error) {
      problem = error;
    } finally {
      this.polling = false;
    }
    if (this.timer === null) return; // the panel was closed meanwhile
    if (problem !== null) {
      this.ui.updated.textContent = `Could not read /metrics: ${problem.message}`;
      return;
    }
    const at = performance.now();
    const { ui } = this;
    const active = total(samples, "openenv_sessions_active");
    const capacity = total(samples, "openenv_sessions_capacity");
    ui.sessions.textContent = `${active} / ${capacity}`;
    ui.queued.textContent = String(total(samples, "openenv_sessions_queued"));
    const steps = total(samples, "openenv_steps_total");
    ui.steps.textContent = steps.toLocaleString("en");
    const errors = samples.filter((s) => s.name === "openenv_errors_total" && s.value > 0);
    ui.errors.textContent = errors.length
      ? errors.map((s) => `${s.labels.code}: ${s.value}`).join(", ")
      : "none";
    if (this.last !== null) {
      const seconds = (at - this.last.at) / 1000;
      const before = total(this.last.samples, "openenv_steps_total");
      ui.rate.textContent = seconds > 0 ? Math.round((steps - before) / seconds).toLocaleString("en") : "–";
      ui.p50.textContent = ms(quantile(0.5, this.last.samples, samples));
      ui.p99.textContent = ms(quantile(0.99, this.last.samples, samples));
    }
    this.last = { samples, at };
    ui.updated.textContent = `Updated ${new Date().toLocaleTimeString()}; every ${POLL_MS / 1000} s while open.`;
  }
}
