// The task picker: an environment's splits and tasks (GET /splits, /tasks), for Reset.
//
// A chosen task is sent with the reset as `task`, as an agent's client sends
// it; after the reset the page asks the session for the task's prompt.

import { element } from "./form.js";

const PAGE = 200; // tasks listed per split; the rest are reachable by their number

export class TaskPicker {
  // `ui`: the fieldset, its split and task selects, and the prompt's element;
  // `load(path)`: a JSON GET relative to the page; `onBusy()`: called when `busy` changes.
  constructor(ui, load, onBusy = () => {}) {
    this.ui = ui;
    this.load = load;
    this.onBusy = onBusy;
    this.tasks = [];
    this.split = null; // the split whose tasks are listed, and how many it has
    this.total = 0;
    this.asked = 0; // lists asked for so far: only the latest may be shown
    this.pending = 0; // lists asked for and not yet answered
    this.starting = true; // the splits, then the first split's list, not in yet
    ui.split.addEventListener("change", () => this.showSplit(ui.split.value));
    // A task is chosen by name or by number, not both: choosing one clears the other.
    ui.task.addEventListener("change", () => {
      ui.number.value = "";
      this.setNumberError("");
    });
    ui.number.addEventListener("input", () => {
      ui.task.value = "";
      this.setNumberError("");
    });
  }

  // Until a list is in, the picker may still grow (its fieldset, the number box)
  // and move what follows it, the Reset button among them; a choice made meanwhile
  // would be of the list being replaced.
  get busy() {
    return this.starting || this.pending > 0;
  }

  async start() {
    try {
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
    } finally {
      this.starting = false;
      this.onBusy();
    }
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
      this.showTasks(tasks, `${page.total} tasks in ${split}${more}`, split, page.total);
    } catch (problem) {
      if (asked === this.asked) this.showTasks([], `Could not list the tasks of ${split}: ${problem.message}`, null, 0);
    } finally {
      this.setPending(-1);
    }
  }

  setPending(change) {
    this.pending += change;
    this.ui.task.setAttribute("aria-busy", String(this.pending > 0));
    this.onBusy();
  }

  // A split longer than the list also offers a number box: any of its tasks,
  // fetched by its index when the episode is reset.
  showTasks(tasks, count, split, total) {
    this.tasks = tasks;
    this.split = split;
    this.total = total;
    const { number, numberField, numberHint } = this.ui;
    numberField.hidden = !(total > tasks.length);
    number.value = "";
    number.max = String(Math.max(total - 1, 0));
    numberHint.textContent = `0–${total - 1}`;
    this.setNumberError("");
    const none = element("option", { value: "" }, "(none: the environment chooses)");
    const options = tasks.map((task, index) =>
      element("option", { value: String(index) }, task.id ?? `task ${index}`),
    );
    this.ui.task.replaceChildren(none, ...options);
    this.ui.count.textContent = count;
  }

  // The task to reset with: undefined for none, null when the number typed
  // names no task (which is then said next to it).
  async chosen() {
    const { number, numberField } = this.ui;
    if (numberField.hidden || (number.value === "" && !number.validity.badInput)) {
      const value = this.ui.task.value;
      return value === "" ? undefined : this.tasks[Number(value)];
    }
    const index = Number(number.value);
    if (number.validity.badInput || !Number.isInteger(index) || index < 0 || index >= this.total) {
      this.setNumberError(`Enter a whole number from 0 to ${this.total - 1}.`);
      return null;
    }
    try {
      const page = await this.load(`tasks?split=${encodeURIComponent(this.split)}&offset=${index}&limit=1`);
      if (page.tasks && page.tasks.length === 1) return page.tasks[0];
      this.setNumberError(`${this.split} has no task ${index} now.`);
    } catch (problem) {
      this.setNumberError(`Could not load task ${index}: ${problem.message}`);
    }
    return null;
  }

  setNumberError(message) {
    const { number, numberError } = this.ui;
    numberError.textContent = message;
    numberError.hidden = !message;
    if (message) {
      number.setAttribute("aria-invalid", "true");
      number.focus();
    } else {
      number.removeAttribute("aria-invalid");
    }
  }

  showPrompt(text) {
    this.ui.prompt.textContent = text || "";
    this.ui.prompt.hidden = !text;
  }
}
