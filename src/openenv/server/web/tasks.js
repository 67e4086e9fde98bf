// The task picker: an environment's splits and tasks (GET /splits, /tasks), for Reset.
//
// A chosen task is sent with the reset as `task`, as an agent's client sends
// it; after the reset the page asks the session for the task's prompt.

import { element } from "./form.js";

const PAGE = 200; // tasks listed per split; the rest are reachable by their number

export class TaskPicker {
  // `ui`: the fieldset, its split and task selects, and the prompt's element;
  // `load(path)`: a JSON GET relative to the page.
  constructor(ui, load) {
    this.ui = ui;
    this.load = load;
    this.tasks = [];
    this.asked = 0; // lists asked for so far: only the latest may be shown
    this.pending = 0; // lists asked for and not yet answered
    ui.split.addEventListener("change", () => this.showSplit(ui.split.value));
  }

  async start() {
    let splits;
    try {
      splits = (await this.load("splits")).splits || [];
    } catch {
      splits = []; // no catalog routes: no tasks to pick
    }
    this.ui.fieldset.hidden = splits.length === 0;
    if (splits.length === 0) return;
    this.ui.split.replaceChildren(...splits.map((name) => element("option", { value: name }, name)));
    await this.showSplit(splits[0]);
  }

  // The lists of two splits chosen in quick succession may arrive in either
  // order; the one chosen last is shown, and the task select is aria-busy
  // until every list asked for has come back.
  async showSplit(split) {
    const asked = ++this.asked;
    this.setPending(+1);
    try {
      const page = await this.load(`tasks?split=${encodeURIComponent(split)}&limit=${PAGE}`);
      if (asked !== this.asked) return;
      const tasks = page.tasks || [];
      const more = page.total > tasks.length ? ` (the first ${tasks.length} of ${page.total})` : "";
      this.showTasks(tasks, `${page.total} tasks in ${split}${more}`);
    } catch (problem) {
      if (asked === this.asked) this.showTasks([], `Could not list the tasks of ${split}: ${problem.message}`);
    } finally {
      this.setPending(-1);
    }
  }

  setPending(change) {
    this.pending += change;
    this.ui.task.setAttribute("aria-busy", String(this.pending > 0));
  }

  showTasks(tasks, count) {
    this.tasks = tasks;
    const none = element("option", { value: "" }, "(none: the environment chooses)");
    const options = tasks.map((task, index) =>
      element("option", { value: String(index) }, task.id ?? `task ${index}`),
    );
    this.ui.task.replaceChildren(none, ...options);
    this.ui.count.textContent = count;
  }

  // The task to reset with, or undefined.
  chosen() {
    const value = this.ui.task.value;
    return value === "" ? undefined : this.tasks[Number(value)];
  }

  showPrompt(text) {
    this.ui.prompt.textContent = text || "";
    this.ui.prompt.hidden = !text;
  }
}
