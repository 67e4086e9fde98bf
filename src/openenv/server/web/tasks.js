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

  async showSplit(split) {
    const page = await this.load(`tasks?split=${encodeURIComponent(split)}&limit=${PAGE}`);
    this.tasks = page.tasks || [];
    const none = element("option", { value: "" }, "(none: the environment chooses)");
    const options = this.tasks.map((task, index) =>
      element("option", { value: String(index) }, task.id ?? `task ${index}`),
    );
    this.ui.task.replaceChildren(none, ...options);
    const more = page.total > this.tasks.length ? ` (the first ${this.tasks.length} of ${page.total})` : "";
    this.ui.count.textContent = `${page.total} tasks in ${split}${more}`;
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
