// The page: load /metadata and /schema, build the action form, play over /web/ws.
//
// Every tab opens its own WebSocket, so every tab is its own session with its
// own environment instance on the server.

import { apiKey, keyIsToken } from "./apikey.js";
import { endpoint, loadJSON, loadText } from "./fetching.js";
import { ActionForm, choiceText, exactInteger } from "./form.js";
import { addHistory, exportHistory, formatNumber, rewardOf } from "./history.js";
import { MetricsPanel } from "./metrics.js";
import { TaskPicker } from "./tasks.js";
import { ToolsPanel } from "./tools.js";
import { messageOf, renderFrames, renderViews, shown } from "./views.js";
import { Session, SessionClosed } from "./session.js";

const $ = (id) => document.getElementById(id);
const ui = {
  name: $("env-name"),
  description: $("env-description"),
  status: $("status"),
  banner: $("connection-banner"),
  bannerMessage: $("connection-message"),
  reconnect: $("reconnect"),
  resetForm: $("reset-form"),
  seed: $("reset-seed"),
  episodeId: $("reset-episode-id"),
  reset: $("reset"),
  actionForm: $("action-form"),
  fields: $("action-fields"),
  step: $("step"),
  stepHint: $("step-hint"),
  error: $("error"),
  outcome: $("outcome"),
  stepCount: $("step-count"),
  reward: $("reward"),
  totalReward: $("total-reward"),
  done: $("done"),
  observation: $("observation"),
  refreshState: $("refresh-state"),
  state: $("state"),
  history: $("history").tBodies[0],
  readme: $("readme"),
  readmeText: $("readme-text"),
  exportHistory: $("export-history"),
};

const page = {
  session: null,
  form: null,
  tools: null,
  tasks: null,
  busy: false,
  // From a new socket until the page knows its session holds a slot (the queue
  // check), and for as long as it waits in the server's queue for one.
  waiting: false,
  greeted: false, // a new session's Reset has been offered (and given the focus)
  started: false,
  done: false,
  steps: 0,
  total: 0,
  log: [], // the episode's exchanges, for Export JSONL
};

// Relative to the page (/web), so a path prefix added by a proxy is kept.
const pretty = (value) => JSON.stringify(value, null, 2);
const MESSAGE_TOO_BIG = 1009; // the WebSocket close code for a frame over the server's limit
const SERVICE_RESTART = 1012; // plain uvicorn's close on shutdown, sent with no frame

function setStatus(text) {
  ui.status.textContent = text;
}

function showError(text) {
  ui.error.textContent = text;
  ui.error.hidden = !text;
}

function connected() {
  return Boolean(page.session && page.session.open) && !page.waiting;
}

// A button is enabled only once a click on it can be acted on as it is: a Reset
// button enabled and then disabled, or moved by the task picker growing above it,
// would lose a click already on its way to it.
function updateButtons() {
  const idle = connected() && !page.busy;
  ui.reset.disabled = !idle || page.tasks.busy;
  if (!ui.reset.disabled && !page.greeted) {
    page.greeted = true;
    if (document.activeElement === document.body) ui.reset.focus();
  }
  ui.step.disabled = !idle || !page.started || page.done; // an ended episode needs a Reset
  ui.refreshState.disabled = !idle;
  ui.exportHistory.disabled = page.log.length === 0;
  for (const button of $("quick-actions").querySelectorAll("button")) button.disabled = ui.step.disabled;
  if (page.tools) page.tools.setEnabled(idle && page.started && !page.done);
}

// Run one exchange with the buttons disabled; keep keyboard focus where it was.
async function exclusive(task) {
  if (page.busy || !connected()) return;
  const focused = document.activeElement;
  page.busy = true;
  updateButtons();
  try {
    await task();
  } catch (problem) {
    if (!(problem instanceof SessionClosed)) showError(`The page failed: ${problem.message}`);
  } finally {
    page.busy = false;
    updateButtons();
    if (document.activeElement === document.body && focused && !focused.disabled) focused.focus();
  }
}

// -- episode -------------------------------------------------------------------

function clearEpisode(message) {
  page.started = false;
  page.done = false;
  page.steps = 0;
  page.total = 0;
  page.log = [];
  ui.history.replaceChildren();
  ui.stepCount.textContent = ui.reward.textContent = ui.totalReward.textContent = "–";
  ui.done.textContent = "–";
  ui.observation.textContent = message;
  ui.outcome.textContent = "";
  renderViews($("views"), {});
  renderFrames($("frames"), {});
  ui.state.textContent = "–";
}

function showObservation(data) {
  const metadata = data.metadata && Object.keys(data.metadata).length ? { metadata: data.metadata } : {};
  // Sent among the fields too (as OpenEnv's), but not one of them: shown once, after.
  const { metadata: _copy, ...observed } = data.observation || {};
  const fields = renderFrames($("frames"), observed);
  renderViews($("views"), fields);
  ui.outcome.textContent = messageOf(fields);
  ui.observation.textContent = shown(pretty({ ...fields, ...metadata }));
  ui.stepCount.textContent = String(page.steps);
  ui.reward.textContent = formatNumber(data.reward);
  ui.totalReward.textContent = formatNumber(page.total);
  ui.done.textContent = data.done ? "yes" : "no";
  page.done = Boolean(data.done);
}

// Turn a server error into inline messages; field errors go next to their fields.
function showServerError(data, placeOnFields) {
  let unplaced = [];
  if (data.code === "VALIDATION_ERROR" && Array.isArray(data.errors)) {
    const errors = data.errors.map((error) => {
      const loc = Array.isArray(error.loc) ? error.loc : [];
      const rest = loc.slice(1).join(".");
      return { name: String(loc[0] ?? ""), message: rest ? `${rest}: ${error.msg}` : error.msg };
    });
    unplaced = placeOnFields(errors);
  }
  const details = unplaced.map((error) => `${error.name || "(action)"}: ${error.message}`);
  showError([`${data.code}: ${data.message}`, ...details].join("\n"));
  setStatus(data.code === "VALIDATION_ERROR" ? "Fix the highlighted fields." : "The server reported an error.");
}

const resetFields = { seed: ui.seed, episode_id: ui.episodeId };

function setResetError(input, message) {
  const error = $(`${input.id}-error`);
  error.textContent = message || "";
  error.hidden = !message;
  if (message) input.setAttribute("aria-invalid", "true");
  else input.removeAttribute("aria-invalid");
}

function placeResetErrors(errors) {
  const unplaced = [];
  for (const error of errors) {
    const input = resetFields[error.name];
    if (input) setResetError(input, error.message);
    else unplaced.push(error);
  }
  return unplaced;
}

async function reset() {
  Object.values(resetFields).forEach((input) => setResetError(input, null));
  page.form.clearErrors();
  showError("");
  if (ui.seed.validity.badInput) {
    setResetError(ui.seed, "Enter a whole number, or leave it empty.");
    ui.seed.focus();
    return;
  }
  const data = {};
  if (ui.seed.value !== "") {
    try {
      data.seed = exactInteger(ui.seed.value);
    } catch (problem) {
      setResetError(ui.seed, problem.message);
      ui.seed.focus();
      return;
    }
  }
  if (ui.episodeId.value !== "") data.episode_id = ui.episodeId.value;
  const task = await page.tasks.chosen();
  if (task === null) return; // a task number that names no task, said next to it
  if (task !== undefined) data.task = task;
  const reply = await page.session.request("reset", data);
  if (reply.type === "error") return showServerError(reply.data, placeResetErrors);
  clearEpisode("");
  page.log.push({ type: "reset", request: data, reply: reply.data });
  if (task !== undefined) {
    const prompt = await page.session.request("get_prompt");
    page.tasks.showPrompt(prompt.type === "prompt" ? prompt.data.prompt : "");
  } else {
    page.tasks.showPrompt("");
  }
  page.started = true;
  showObservation(reply.data);
  setStatus("Episode started: fill in the action and press Step.");
  await refreshState();
}

async function step() {
  showError("");
  page.form.clearErrors();
  const { values, errors } = page.form.read();
  if (errors.length) {
    page.form.showErrors(errors);
    setStatus("Fix the highlighted fields.");
    return;
  }
  const reply = await page.session.request("step", values);
  if (reply.type === "error") return showServerError(reply.data, (list) => page.form.showErrors(list));
  page.steps += 1;
  const reward = rewardOf(reply.data.reward);
  page.total += typeof reward === "number" ? reward : 0;
  page.log.push({ type: "step", request: values, reply: reply.data });
  showObservation(reply.data);
  addHistory(ui.history, values, reply.data, String(page.steps));
  setStatus(
    reply.data.done
      ? `Episode done after ${page.steps} steps, total reward ${formatNumber(page.total)}. Press Reset to play again.`
      : `Step ${page.steps}: reward ${formatNumber(reply.data.reward)}.`,
  );
  await refreshState();
}

async function refreshState() {
  const reply = await page.session.request("state");
  ui.state.textContent =
    reply.type === "error" ? `Unavailable: ${reply.data.message}` : shown(pretty(reply.data));
}

// A tool call holds the session as a Step does: Reset, Step and the other tools
// wait for its reply. Null if none could be made (another exchange, no session).
async function callTool(name, args) {
  let reply = null;
  await exclusive(async () => {
    reply = await page.session.request("call_tool", { name, arguments: args });
  });
  return reply;
}

function toolCalled(name, args, reply) {
  page.log.push({ type: "call_tool", request: { name, arguments: args }, reply: reply.data });
  updateButtons();
  if (reply.type === "error") return setStatus(`Tool ${name}: ${reply.data.code}.`);
  const output = reply.data;
  addHistory(ui.history, `${name}(${JSON.stringify(args)})`, output, "tool");
  const reward = rewardOf(output.reward);
  if (typeof reward === "number") page.total += reward;
  ui.totalReward.textContent = formatNumber(page.total);
  if (typeof reward === "number") ui.reward.textContent = formatNumber(reward);
  if (output.finished) {
    page.done = true;
    ui.done.textContent = "yes";
    setStatus(`Episode done by ${name}, total reward ${formatNumber(page.total)}. Press Reset to play again.`);
  } else {
    setStatus(`Tool ${name} answered.`);
  }
  updateButtons();
  return exclusive(refreshState);
}

// A one-click step for each value of a small discrete action (CartPole's 0 and 1, say).
function showQuickActions(choices) {
  const box = $("quick-actions");
  box.hidden = choices === null;
  if (choices === null) return;
  box.replaceChildren(
    ...choices.values.map((value) => {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = `${choices.name} = ${choiceText(value)}`;
      button.disabled = true;
      button.addEventListener("click", () => {
        page.form.set(choices.name, value);
        ui.actionForm.requestSubmit();
      });
      return button;
    }),
  );
}

// -- connection ----------------------------------------------------------------

function showBanner(message, button) {
  ui.bannerMessage.textContent = message;
  ui.reconnect.textContent = button;
  ui.banner.hidden = false;
}

function connect() {
  ui.banner.hidden = true;
  setStatus("Connecting…");
  const url = new URL(endpoint("web/ws", true));
  if (apiKey && !keyIsToken) url.searchParams.set("api_key", apiKey);
  const session = new Session(url.href, {
    protocols: keyIsToken ? ["openenv", `openenv.key.${apiKey}`] : ["openenv"],
    onopen: () => {
      if (page.session !== session) return;
      clearEpisode("Press Reset to start an episode.");
      setStatus("Connected: a new session. Press Reset to start an episode.");
      waitIfQueued(session);
    },
    onclose: (info) => {
      if (page.session !== session) return;
      page.busy = false;
      page.waiting = false;
      updateButtons();
      if (info.atCapacity) {
        const used = info.error && info.error.max_sessions ? ` (all ${info.error.max_sessions} sessions are in use)` : "";
        setStatus("Server at capacity.");
        showBanner(`Server at capacity, try again in a moment${used}.`, "Try again");
      } else if (info.error) {
        setStatus("Disconnected.");
        showBanner(`Disconnected: ${info.error.message}.`, "Reconnect");
      } else if (info.code === MESSAGE_TOO_BIG) {
        // Said by the close code alone: the server sends no frame before it.
        setStatus("Disconnected.");
        showBanner(
          "The server closed the session: the last request was larger than it accepts (its max_message_size).",
          "Reconnect",
        );
      } else if (info.code === SERVICE_RESTART) {
        setStatus("Disconnected.");
        showBanner("The server is shutting down or restarting: Reconnect once it is back.", "Reconnect");
      } else if (!info.opened) {
        setStatus("Could not connect.");
        showBanner("Could not connect to the server.", "Reconnect");
      } else {
        setStatus("Disconnected.");
        showBanner(`The connection to the server was lost (code ${info.code}).`, "Reconnect");
      }
    },
  });
  page.session = session;
  page.waiting = true;
  page.greeted = false;
  updateButtons();
}

// A server at its cap with a queue accepts the socket at once, and opens its
// session only when a slot frees: until then no request is answered. Seen full
// from /health, the tab says it waits, and the first reply (to a request that
// touches no environment) says its session is open. The buttons stay disabled
// until /health has answered: enabled at the socket's open and disabled on a
// full /health, they would drop a click made in between.
async function waitIfQueued(session) {
  let health = null;
  try {
    health = await loadJSON("health");
  } catch {
    // no word on the queue: the page works as it would anyway
  }
  if (page.session !== session || !session.open) return;
  // Full with no line is this tab's own session in the last slot: not waiting.
  if (health && health.active_sessions >= health.max_sessions && health.queued_sessions > 0) {
    setStatus(
      `Waiting for a free slot: all ${health.max_sessions} sessions are in use. ` +
        "This tab gets the next one that frees up.",
    );
    try {
      await session.request("list_tools");
    } catch {
      return; // closed while waiting (queue_timeout, say): onclose says why
    }
    if (page.session !== session) return;
    setStatus("Connected: a new session. Press Reset to start an episode.");
  }
  page.waiting = false;
  updateButtons();
}

// -- wiring --------------------------------------------------------------------

function wire() {
  new MetricsPanel(
    {
      panel: $("server-metrics"),
      sessions: $("m-sessions"),
      queued: $("m-queued"),
      steps: $("m-steps"),
      rate: $("m-rate"),
      p50: $("m-p50"),
      p99: $("m-p99"),
      errors: $("m-errors"),
      updated: $("m-updated"),
    },
    () => loadText("metrics"),
  );
  ui.resetForm.addEventListener("submit", (event) => {
    event.preventDefault();
    exclusive(reset);
  });
  ui.actionForm.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!page.started) setStatus("Press Reset to start an episode first.");
    else exclusive(step);
  });
  // Enter steps from any field; in a text area it needs Ctrl (or Cmd) so newlines still work.
  ui.actionForm.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.isComposing || event.shiftKey) return;
    const tag = event.target.tagName;
    if (tag === "BUTTON" || (tag === "TEXTAREA" && !(event.ctrlKey || event.metaKey))) return;
    event.preventDefault();
    ui.actionForm.requestSubmit();
  });
  ui.refreshState.addEventListener("click", () => exclusive(refreshState));
  ui.exportHistory.addEventListener("click", () =>
    exportHistory(page.log, document.title.split(" ")[0]),
  );
  page.tasks = new TaskPicker(
    {
      fieldset: $("task-picker"),
      split: $("task-split"),
      task: $("task-choice"),
      count: $("task-count"),
      numberField: $("task-number-field"),
      number: $("task-number"),
      numberHint: $("task-number-hint"),
      numberError: $("task-number-error"),
      prompt: $("task-prompt"),
    },
    loadJSON,
    updateButtons,
  );
  page.tools = new ToolsPanel(
    $("tools-panel"),
    $("tools"),
    callTool,
    toolCalled,
  );
  ui.reconnect.addEventListener("click", connect);
  // Free the server's slot as soon as the tab goes away.
  window.addEventListener("pagehide", () => page.session && page.session.close());
}

async function main() {
  wire();
  let metadata;
  let schema;
  try {
    [metadata, schema] = await Promise.all([loadJSON("metadata"), loadJSON("schema")]);
  } catch (problem) {
    setStatus("Could not load the environment.");
    showError(`Could not load /metadata and /schema: ${problem.message}. Reload the page to retry.`);
    return;
  }
  document.title = `${metadata.name} · openenv`;
  ui.name.textContent = metadata.name;
  ui.description.textContent = metadata.description || "";
  if (metadata.readme_content) {
    ui.readmeText.textContent = metadata.readme_content;
    ui.readme.hidden = false;
  }
  page.form = new ActionForm(ui.fields, schema.action);
  showQuickActions(page.form.choices());
  page.tasks.start().catch(() => {});
  loadJSON("tools")
    .then((listed) => page.tools.show(listed.tools || []))
    .catch(() => page.tools.show([])); // an app without the catalog routes has no tools to show
  if (ui.fields.querySelector("textarea")) {
    ui.stepHint.textContent = "Enter in a field steps (Ctrl+Enter in a text box)";
  }
  connect();
}

main();
