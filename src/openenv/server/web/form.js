// A form generated from an action's JSON Schema, as pydantic v2 emits it.
//
// Strings, numbers, integers and booleans get their own inputs (a text area for
// text that spans lines), enums and consts a select; arrays, nested objects and unions a JSON text area that is
// checked in the browser before anything is sent. "$ref" into "$defs" and
// "anyOf: [X, {type: null}]" (pydantic's Optional[X]) are resolved first.

// -- schema helpers ------------------------------------------------------------

function lookup(root, ref) {
  if (!ref.startsWith("#/")) return {};
  let node = root;
  for (const raw of ref.slice(2).split("/")) {
    const key = raw.replaceAll("~1", "/").replaceAll("~0", "~");
    node = node && typeof node === "object" ? node[key] : undefined;
  }
  return node && typeof node === "object" ? node : {};
}

// Inline "$ref" and one-element "allOf" (older pydantic); the referring
// schema's own keys (default, description) win over the target's.
export function resolve(schema, root, seen = new Set()) {
  let node = { ...(schema || {}) };
  for (;;) {
    if (typeof node.$ref === "string") {
      const ref = node.$ref;
      delete node.$ref;
      if (seen.has(ref)) break; // a recursive model: stop here, the field becomes JSON
      seen.add(ref);
      node = { ...lookup(root, ref), ...node };
    } else if (Array.isArray(node.allOf) && node.allOf.length === 1) {
      const [inner] = node.allOf;
      delete node.allOf;
      node = { ...resolve(inner, root, seen), ...node };
    } else {
      return node;
    }
  }
  return node;
}

const isNull = (schema) => schema.type === "null";

// Split "X or null" into X and a nullable flag.
export function unwrapNullable(schema, root) {
  const node = resolve(schema, root);
  const variants = node.anyOf || node.oneOf;
  if (Array.isArray(variants)) {
    const resolved = variants.map((v) => resolve(v, root));
    const rest = resolved.filter((v) => !isNull(v));
    const nullable = rest.length < resolved.length;
    if (nullable && rest.length === 1) {
      const { anyOf, oneOf, ...outer } = node;
      return { schema: { ...rest[0], ...outer }, nullable };
    }
    return { schema: node, nullable };
  }
  if (Array.isArray(node.type)) {
    const types = node.type.filter((t) => t !== "null");
    const nullable = types.length < node.type.length;
    return { schema: { ...node, type: types.length === 1 ? types[0] : types }, nullable };
  }
  return { schema: node, nullable: false };
}

// Text that spans lines (a program, a document): a text area instead of one line.
// Said by the schema (`contentMediaType: "text/..."`, `format: "textarea"`) or
// implied by a large `maxLength`.
function multiline(schema) {
  const media = schema.contentMediaType;
  return (
    schema.format === "textarea" ||
    (typeof media === "string" && media.startsWith("text/")) ||
    (typeof schema.maxLength === "number" && schema.maxLength > 1000)
  );
}

function kindOf(schema, nullable) {
  if (Array.isArray(schema.enum) || "const" in schema) return "select";
  switch (schema.type) {
    case "boolean":
      return nullable ? "select" : "checkbox";
    case "integer":
    case "number":
      return schema.type;
    case "string":
      return multiline(schema) ? "multiline" : "text";
    default:
      return "json"; // arrays, objects, unions, anything without a single simple type
  }
}

function humanize(name) {
  const words = name.replace(/([a-z0-9])([A-Z])/g, "$1 $2").replaceAll("_", " ").trim();
  return words.charAt(0).toUpperCase() + words.slice(1);
}

function describeType(schema, kind) {
  const bounds = [];
  if (schema.minimum !== undefined) bounds.push(`≥ ${schema.minimum}`);
  if (schema.exclusiveMinimum !== undefined) bounds.push(`> ${schema.exclusiveMinimum}`);
  if (schema.maximum !== undefined) bounds.push(`≤ ${schema.maximum}`);
  if (schema.exclusiveMaximum !== undefined) bounds.push(`< ${schema.exclusiveMaximum}`);
  if (schema.minLength !== undefined) bounds.push(`at least ${schema.minLength} characters`);
  if (schema.maxLength !== undefined) bounds.push(`at most ${schema.maxLength} characters`);
  let base = kind;
  if (kind === "json") {
    base = schema.type === "array" ? "JSON array" : schema.type === "object" ? "JSON object" : "JSON";
  } else if (kind === "select") {
    base = "choice";
  } else if (kind === "checkbox") {
    base = "boolean";
  } else if (kind === "text") {
    base = "string";
  } else if (kind === "multiline") {
    base = "text";
  }
  return [base, ...bounds].join(", ");
}

const hasValue = (value) => value !== undefined && value !== null;

// A choice as it is shown: a string as itself, other values as JSON, and the
// empty string as "" (an empty option would read as no choice at all).
export const choiceText = (value) => (typeof value === "string" && value !== "" ? value : JSON.stringify(value));

// A browser's numbers hold integers exactly up to 2^53 only: a larger one typed
// in (a 64-bit seed, an id) would be sent rounded, a different number, unseen.
// Refuse it instead. Not a whole number (1.5) goes as typed, for the server to judge.
export function exactInteger(text) {
  const value = Number(text);
  if (Number.isInteger(value) && !Number.isSafeInteger(value)) {
    throw new Error(`Too large for the page to send exactly (at most ${Number.MAX_SAFE_INTEGER} either side of 0).`);
  }
  return value;
}

// -- the form ------------------------------------------------------------------

export function element(tag, attributes = {}, text = "") {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text) node.textContent = text;
  return node;
}

// An id unique in the whole page, its "-help" and "-error" ids included: a
// field named "heading" would otherwise share "action-heading" with the page's
// own heading, and its label would point at that heading instead of the field.
function safeId(name, taken, prefix) {
  const ids = (id) => [id, `${id}-help`, `${id}-error`];
  let id = `${prefix}${name.replace(/[^A-Za-z0-9_-]/g, "_")}`;
  while (ids(id).some((one) => taken.has(one) || document.getElementById(one))) id += "_";
  for (const one of ids(id)) taken.add(one);
  return id;
}

export class ActionForm {
  // `prefix` keeps the inputs' ids apart when the page holds several forms.
  constructor(container, schema, prefix = "action-") {
    this.container = container;
    this.fields = new Map();
    container.replaceChildren();
    const root = resolve(schema, schema);
    const required = new Set(root.required || []);
    const properties = Object.entries(root.properties || {});
    if (properties.length === 0) {
      const text = prefix === "action-" ? "This action has no fields." : "No arguments.";
      container.append(element("p", { class: "muted" }, text));
    }
    const taken = new Set();
    for (const [name, property] of properties) {
      const id = safeId(name, taken, prefix);
      const field = this.buildField(name, property, schema, required.has(name), id);
      this.fields.set(name, field);
      container.append(field.wrapper);
    }
  }

  buildField(name, property, root, required, id) {
    const { schema, nullable } = unwrapNullable(property, root);
    const kind = kindOf(schema, nullable);
    const field = { name, schema, nullable, required, kind, id };
    const wrapper = element("div", { class: `field field-${kind}` });
    const label = element("label", { for: id }, property.title || humanize(name));
    const typeHint = describeType(schema, kind) + (nullable ? ", or empty for null" : "");
    label.append(" ", element("span", { class: "hint" }, required ? `${typeHint} · required` : typeHint));
    const help = element("p", { class: "help", id: `${id}-help` }, schema.description || "");
    help.hidden = !schema.description;
    const error = element("p", { class: "field-error", id: `${id}-error` });
    error.hidden = true;
    const input = this.buildInput(field);
    input.id = id;
    input.name = name;
    input.setAttribute("aria-describedby", `${id}-help ${id}-error`);
    if (required) input.setAttribute("aria-required", "true");
    if (kind === "checkbox") {
      const row = element("div", { class: "checkbox-row" });
      row.append(input, label);
      wrapper.append(row, help, error);
    } else {
      wrapper.append(label, input, help, error);
    }
    // Editing a field clears the error it showed.
    input.addEventListener("input", () => {
      field.edited = true;
      this.setError(field, null);
    });
    Object.assign(field, { wrapper, input, error });
    return field;
  }

  buildInput(field) {
    const { schema, kind, nullable, required } = field;
    const preset = schema.default;
    if (kind === "select") {
      const options = Array.isArray(schema.enum) ? schema.enum : "const" in schema ? [schema.const] : [true, false];
      field.options = options;
      const select = element("select");
      if (!(hasValue(preset) && !nullable)) {
        const blank = nullable ? "— null —" : required ? "— choose —" : "— not set —";
        select.append(element("option", { value: "" }, blank));
      }
      options.forEach((option, index) => {
        select.append(element("option", { value: String(index) }, choiceText(option)));
      });
      const chosen = options.findIndex((option) => JSON.stringify(option) === JSON.stringify(preset));
      select.value = hasValue(preset) && chosen >= 0 ? String(chosen) : "";
      return select;
    }
    if (kind === "checkbox") {
      const box = element("input", { type: "checkbox" });
      box.checked = preset === true;
      return box;
    }
    if (kind === "integer" || kind === "number") {
      const input = element("input", { type: "number", step: kind === "integer" ? "1" : "any" });
      if (schema.minimum !== undefined) input.min = String(schema.minimum);
      if (schema.maximum !== undefined) input.max = String(schema.maximum);
      if (hasValue(preset)) input.value = String(preset);
      return input;
    }
    if (kind === "text") {
      const input = element("input", { type: "text", autocomplete: "off" });
      if (hasValue(preset)) input.value = String(preset);
      return input;
    }
    if (kind === "multiline") {
      const area = element("textarea", { rows: "8", spellcheck: "false", class: "code" });
      if (hasValue(preset)) area.value = String(preset);
      return area;
    }
    const area = element("textarea", { rows: "3", spellcheck: "false" });
    area.placeholder = schema.type === "array" ? "[ ]" : schema.type === "object" ? "{ }" : "JSON";
    if (hasValue(preset)) area.value = JSON.stringify(preset);
    return area;
  }

  // When the action is one small discrete choice (a Discrete space, an enum, a
  // Literal, a bool), its field's name and values: the page offers a button each.
  choices(limit = 10) {
    if (this.fields.size !== 1) return null;
    const [field] = this.fields.values();
    const { schema, kind } = field;
    let values = null;
    if (kind === "integer" && Number.isInteger(schema.minimum) && Number.isInteger(schema.maximum)) {
      const count = schema.maximum - schema.minimum + 1;
      if (count >= 1 && count <= limit) values = Array.from({ length: count }, (_, i) => schema.minimum + i);
    } else if (kind === "select" && field.options.length <= limit) {
      values = field.options;
    } else if (kind === "checkbox") {
      values = [true, false];
    }
    return values === null ? null : { name: field.name, values };
  }

  // Put a value in a field, as if typed or chosen.
  set(name, value) {
    const field = this.fields.get(name);
    if (field.kind === "select") {
      field.input.value = String(field.options.findIndex((o) => JSON.stringify(o) === JSON.stringify(value)));
    } else if (field.kind === "checkbox") {
      field.input.checked = value === true;
    } else {
      field.input.value = String(value);
    }
    this.setError(field, null);
  }

  // The action to send, or the per-field errors found in the browser.
  read() {
    // No prototype: a field named "__proto__" is then a key like any other,
    // where on a plain object setting it would change the object's prototype.
    const values = Object.create(null);
    const errors = [];
    for (const field of this.fields.values()) {
      try {
        const value = this.readField(field);
        if (value !== undefined) values[field.name] = value;
      } catch (problem) {
        errors.push({ name: field.name, message: problem.message });
      }
    }
    return { values, errors };
  }

  // What an empty control sends: null for an Optional field, "" for a string
  // (as the hint says); a number, choice or JSON field has no empty value.
  // undefined means "leave it out": the server applies the field's default,
  // which is also what happens when the empty value is that default. Leaving
  // out a field whose default is not empty would send the default instead
  // (`limit: int | None = 5` cleared must be None, not 5).
  emptyValue(field) {
    const { kind, schema, nullable } = field;
    const value = nullable ? null : kind === "text" || kind === "multiline" ? "" : undefined;
    if (value === undefined || ("default" in schema && schema.default === value)) return undefined;
    return value;
  }

  readField(field) {
    const { input, kind, schema, nullable } = field;
    const empty = () => this.emptyValue(field);
    switch (kind) {
      case "checkbox":
        return input.checked;
      case "select":
        return input.value === "" ? empty() : field.options[Number(input.value)];
      case "integer":
      case "number":
        if (input.validity.badInput) throw new Error("Enter a number.");
        if (input.value === "") return empty();
        return kind === "integer" ? exactInteger(input.value) : Number(input.value);
      case "text":
      case "multiline":
        // An Optional string whose default is "" shows it as an empty box, as it
        // shows null: untouched, it is the default, left to the server.
        if (input.value === "" && !field.edited && schema.default === "") return undefined;
        return input.value === "" ? empty() : input.value;
      default: {
        const text = input.value.trim();
        if (text === "") return empty();
        let value;
        try {
          value = JSON.parse(text);
        } catch (problem) {
          throw new Error(`Not valid JSON: ${problem.message}`);
        }
        if (value === null && nullable) return null;
        if (schema.type === "array" && !Array.isArray(value)) throw new Error("Expected a JSON array, like [1, 2].");
        if (schema.type === "object" && (value === null || typeof value !== "object" || Array.isArray(value))) {
          throw new Error('Expected a JSON object, like {"key": 1}.');
        }
        return value;
      }
    }
  }

  setError(field, message) {
    field.error.textContent = message || "";
    field.error.hidden = !message;
    field.wrapper.classList.toggle("invalid", Boolean(message));
    if (message) field.input.setAttribute("aria-invalid", "true");
    else field.input.removeAttribute("aria-invalid");
  }

  clearErrors() {
    for (const field of this.fields.values()) this.setError(field, null);
  }

  // Show errors on their fields; return the ones that name no field here.
  showErrors(errors) {
    const unplaced = [];
    const messages = new Map();
    for (const { name, message } of errors) {
      if (this.fields.has(name)) messages.set(name, [...(messages.get(name) || []), message]);
      else unplaced.push({ name, message });
    }
    for (const [name, list] of messages) this.setError(this.fields.get(name), list.join(" "));
    const first = [...this.fields.values()].find((field) => messages.has(field.name));
    if (first) first.input.focus();
    return unplaced;
  }
}
