// Readable views of an observation's nested fields: a list of records becomes a table.
//
// A wordle board (a list of {guess, pattern, letters}), a list of moves, a
// grid of rows: each such field is drawn as a table above the raw JSON, which
// stays for everything else.

const MAX_ROWS = 200;

function isRecord(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function cellText(value) {
  if (Array.isArray(value) && value.every((v) => typeof v !== "object" || v === null)) {
    return value.join(" ");
  }
  return typeof value === "object" && value !== null ? JSON.stringify(value) : String(value);
}

// The fields worth a table: non-empty lists of records (or of equal-length lists).
export function tabular(observation) {
  const tables = [];
  for (const [name, value] of Object.entries(observation || {})) {
    if (!Array.isArray(value) || value.length === 0 || value.length > MAX_ROWS) continue;
    if (value.every(isRecord)) {
      const columns = [...new Set(value.flatMap((row) => Object.keys(row)))];
      tables.push({ name, columns, rows: value.map((row) => columns.map((c) => row[c])) });
    } else if (value.every(Array.isArray) && value.every((row) => row.length === value[0].length)) {
      const columns = value[0].map((_, index) => String(index));
      if (columns.length > 0 && columns.length <= 32) tables.push({ name, columns, rows: value });
    }
  }
  return tables;
}

export function renderTables(container, observation) {
  const tables = tabular(observation);
  container.replaceChildren(
    ...tables.map(({ name, columns, rows }) => {
      const table = document.createElement("table");
      table.className = "view";
      const caption = table.createCaption();
      caption.textContent = name;
      const head = table.createTHead().insertRow();
      for (const column of columns) {
        const th = document.createElement("th");
        th.scope = "col";
        th.textContent = column;
        head.append(th);
      }
      const body = table.createTBody();
      for (const row of rows) {
        const tr = body.insertRow();
        for (const value of row) tr.insertCell().textContent = value === undefined ? "" : cellText(value);
      }
      return table;
    }),
  );
  container.hidden = tables.length === 0;
}
