// The tools panel: one form per @tool, built from its JSON Schema, called over the session.
//
// A call is a `call_tool` request on the page's own session, exactly as an
// agent makes it; its result (text, JSON, images, reward, whether it ended the
// episode) is shown under the tool's form.

import { ActionForm, element } from "./form.js";
import { rewardOf } from "./history.js";
import { shown } from "./views.js";

// Render a tool result's content blocks: text as text, JSON as JSON, images as images.
function renderContent(output) {
  const nodes = [];
  for (const block of output.content || []) {
    if (block.type === "text") nodes.push(element("pre", { class: "json" }, shown(String(block.text ?? ""))));
    else if (block.type === "image" && block.data) {
      const image = element("img", { alt: "tool result image", class: "frame" });
      image.src = `data:${block.mime_type || block.mimeType || "image/png"};base64,${block.data}`;
      nodes.push(image);
    } else nodes.push(element("pre", { class: "json" }, shown(JSON.stringify(block.data ?? block, null, 2))));
  }
  if (nodes.length === 0) nodes.push(element("p", { class: "muted" }, "(no content)"));
  return nodes;
}

export class ToolsPanel {
  // `section`: the panel; `list`: where the tool forms go; `call(name, args)`: the
  // session's call_tool, resolving with the reply frame (null if no call was made);
  // `onResult(name, args, frame)`.
  constructor(section, list, call, onResult) {
    this.section = section;
    this.list = list;
    this.call = call;
    this.onResult = onResult;
    this.tools = [];
    this.enabled = false;
  }

  show(tools) {
    this.tools = tools;
    this.section.hidden = tools.length === 0;
    this.list.replaceChildren();
    for (const tool of tools) this.list.append(this.toolCard(tool));
    this.setEnabled(this.enabled);
  }

  setEnabled(enabled) {
    this.enabled = enabled;
    for (const button of this.list.querySelectorAll("button.call")) button.disabled = !enabled;
  }

  toolCard(tool) {
    const card = element("form", { class: "tool", "aria-label": `Tool ${tool.name}` });
    card.noValidate = true;
    const title = element("h3", {}, tool.name);
    const about = element("p", { class: "help" }, tool.description || "");
    const fields = element("div");
    const form = new ActionForm(fields, tool.input_schema || { type: "object" }, `tool-${tool.name}-`);
    const button = element("button", { type: "submit", class: "call" }, `Call ${tool.name}`);
    const result = element("div", { class: "tool-result", role: "status", "aria-live": "polite" });
    card.append(title, about, fields, button, result);
    card.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (button.disabled) return;
      form.clearErrors();
      const { values, errors } = form.read();
      if (errors.length) return form.showErrors(errors);
      button.disabled = true;
      try {
        const reply = await this.call(tool.name, values);
        if (reply === null) return; // not made: the session was busy or gone
        result.replaceChildren(...this.describe(reply, form));
        this.onResult(tool.name, values, reply);
      } finally {
        button.disabled = !this.enabled;
      }
    });
    return card;
  }

  describe(reply, form) {
    if (reply.type === "error") {
      const data = reply.data || {};
      if (data.code === "VALIDATION_ERROR" && Array.isArray(data.errors)) {
        form.showErrors(
          data.errors.map((e) => ({ name: String((e.loc || [])[0] ?? ""), message: e.msg })),
        );
      }
      return [element("p", { class: "field-error" }, `${data.code}: ${data.message}`)];
    }
    const output = reply.data || {};
    const facts = [];
    const reward = rewardOf(output.reward);
    if (typeof reward === "number") facts.push(`reward ${reward}`);
    if (output.finished) facts.push("episode finished");
    const summary = element("p", { class: "tool-facts" }, facts.join(" · ") || "done");
    return [summary, ...renderContent(output)];
  }
}
