// Readable views of an observation, drawn above its raw JSON.
//
// - Scalar fields (a message, a count, a flag) become a list of facts, so a
//   short message such as wordle's "not in the word list" is seen at once.
// - A nested object (coding_env's `execution`) becomes a table of its fields,
//   multi-line text (stdout, stderr) kept as text.
// - A list of records becomes a table, a row per record; when each record
//   pairs a word with a mark per letter (wordle's board: `guess` and
//   `letters`), the list is drawn as a board of coloured tiles.
// - A list of equal-length lists becomes a grid.

const MAX_ROWS = 200;

// Text past this many characters is shown cut: laying out megabytes of text
// (a page's HTML, a long log) freezes the tab for seconds a copy. The reply's
// row in History and Export JSONL keep it whole.
export const SHOWN_CHARS = 1_000_000;

export function shown(text) {
  if (text.length <= SHOWN_CHARS) return text;
  const rest = (text.length - SHOWN_CHARS).toLocaleString("en");
  return `${text.slice(0, SHOWN_CHARS)}\n… ${rest} more characters (the whole reply: its row in History, or Export JSONL)`;
}

function isRecord(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

const isScalar = (value) => value === null || typeof value !== "object";

function cellText(value) {
  if (value === undefined) return "";
  if (Array.isArray(value) && value.every(isScalar)) return shown(value.join(" "));
  return shown(isScalar(value) ? String(value) : JSON.stringify(value));
}

function make(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// The marks a tile is coloured for (views.css). Only these make a board: any
// other list of short strings as long as a word ({name: "ann", cards: ["2H",
// "3D", "KS"]}) is data of its own, better read in a table.
const MARKS = new Set(["correct", "present", "absent", "G", "Y", "-", "hit", "miss"]);

// A record that spells a word with one mark per letter: {guess: "crane", letters: ["absent", ...]}.
// The names of its word and marks fields, or null.
function tileFields(record) {
  const entries = Object.entries(record);
  for (const [word, text] of entries) {
    if (typeof text !== "string" || text.length === 0 || text.length > 16) continue;
    for (const [marks, list] of entries) {
      if (Array.isArray(list) && list.length === text.length && list.every((mark) => MARKS.has(mark))) {
        return { word, marks };
      }
    }
  }
  return null;
}

// The board's tile fields when every row of a list shares them, else null.
function boardOf(rows) {
  const first = tileFields(rows[0]);
  if (!first) return null;
  const same = rows.every((row) => {
    const found = tileFields(row);
    return found && found.word === first.word && found.marks === first.marks;
  });
  return same ? first : null;
}

function captioned(name, className) {
  const table = make("table", `view ${className}`);
  table.createCaption().textContent = name;
  return table;
}

function headRow(table, columns) {
  const head = table.createTHead().insertRow();
  for (const column of columns) {
    const th = make("th", "", column);
    th.scope = "col";
    head.append(th);
  }
}

// Rows of coloured tiles, one per letter, then the record's other fields.
function renderBoard(name, rows, { word, marks }) {
  const table = captioned(name, "board");
  const others = [...new Set(rows.flatMap((row) => Object.keys(row)))].filter(
    (key) => key !== word && key !== marks,
  );
  const body = table.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    const tiles = tr.insertCell();
    tiles.className = "tiles";
    [...row[word]].forEach((letter, index) => {
      const mark = row[marks][index];
      const tile = make("span", "tile", letter);
      tile.dataset.mark = mark;
      tile.title = mark;
      tile.setAttribute("aria-label", `${letter} ${mark}`);
      tiles.append(tile);
    });
    for (const key of others) tr.insertCell().textContent = cellText(row[key]);
  }
  return table;
}

function renderRecords(name, rows) {
  const board = boardOf(rows);
  if (board) return renderBoard(name, rows, board);
  const columns = [...new Set(rows.flatMap((row) => Object.keys(row)))];
  const table = captioned(name, "records");
  headRow(table, columns);
  const body = table.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    for (const column of columns) tr.insertCell().textContent = cellText(row[column]);
  }
  return table;
}

function renderGrid(name, rows) {
  const table = captioned(name, "grid");
  const body = table.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    for (const value of row) tr.insertCell().textContent = cellText(value);
  }
  return table;
}

// A value as text; multi-line text in a block that keeps its lines.
function valueNode(value) {
  if (typeof value === "string" && value.includes("\n")) return make("pre", "text", shown(value));
  if (value === "") return make("span", "muted", "(empty)");
  return make("span", "", typeof value === "string" ? shown(value) : cellText(value));
}

// A nested object: a row per field.
function renderObject(name, record) {
  const table = captioned(name, "object");
  const body = table.createTBody();
  for (const [key, value] of Object.entries(record)) {
    const tr = body.insertRow();
    const th = make("th", "", key);
    th.scope = "row";
    tr.append(th);
    tr.insertCell().append(valueNode(value));
  }
  return table;
}

function renderFacts(facts) {
  const list = make("dl", "facts");
  list.setAttribute("aria-label", "Observation fields");
  for (const [name, value] of facts) {
    const item = make("div", typeof value === "string" && value.length > 40 ? "wide" : "");
    item.dataset.field = name;
    const dd = make("dd");
    dd.append(valueNode(value));
    item.append(make("dt", "", name), dd);
    list.append(item);
  }
  return list;
}

function isGrid(value) {
  return (
    value.every(Array.isArray) &&
    value.every((row) => row.length === value[0].length && row.every(isScalar)) &&
    value[0].length > 0 &&
    value[0].length <= 32
  );
}

// Draw `observation` (its fields without reward and done) into `container`.
export function renderViews(container, observation) {
  const facts = [];
  const blocks = [];
  for (const [name, value] of Object.entries(observation || {})) {
    if (isScalar(value)) {
      facts.push([name, value]);
    } else if (Array.isArray(value)) {
      if (value.length > 0 && value.length <= MAX_ROWS && value.every(isRecord)) {
        blocks.push(renderRecords(name, value));
      } else if (value.length > 0 && value.length <= MAX_ROWS && isGrid(value)) {
        blocks.push(renderGrid(name, value));
      } else if (value.every(isScalar) && value.length <= 64) {
        facts.push([name, value.length ? value.map((v) => JSON.stringify(v)).join(", ") : "(none)"]);
      }
    } else if (Object.keys(value).length > 0 && Object.values(value).every(isScalar)) {
      blocks.push(renderObject(name, value));
    }
  }
  const nodes = facts.length ? [renderFacts(facts), ...blocks] : blocks;
  container.replaceChildren(...nodes);
  container.hidden = nodes.length === 0;
}

// The observation's own short message, if it has one (a field named `message`
// or ending in `_message`), to show next to the Step button.
export function messageOf(observation) {
  for (const [name, value] of Object.entries(observation || {})) {
    if ((name === "message" || name.endsWith("_message")) && typeof value === "string" && value) {
      return value.length > 300 ? `${value.slice(0, 300)}…` : value;
    }
  }
  return "";
}

// Split an observation's image fields (PNG/JPEG/GIF/WebP data URLs, such as a
// Gymnasium `frame`) from the rest: the images are drawn in `container`, and
// the other fields are returned for the views and the JSON.
export function renderFrames(container, observation) {
  const fields = Object.create(null); // so a field named "__proto__" is kept like any other
  const images = [];
  for (const [name, value] of Object.entries(observation || {})) {
    if (typeof value === "string" && /^data:image\/(png|jpeg|gif|webp);base64,/.test(value)) {
      const image = make("img", "frame");
      image.alt = `${name} (rendered)`;
      image.src = value;
      images.push(image);
    } else {
      fields[name] = value;
    }
  }
  container.replaceChildren(...images);
  container.hidden = images.length === 0;
  return fields;
}
