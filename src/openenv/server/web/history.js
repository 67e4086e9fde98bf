// The episode's history: a row per step or tool call, each opening to its whole
// reply, and the exchanges exported as JSON Lines.

// A reward JSON has no number for comes as "NaN", "Infinity" or "-Infinity".
export const rewardOf = (value) =>
  typeof value === "string" && /^(NaN|-?Infinity)$/.test(value) ? Number(value) : value;
// Twelve significant digits hide float noise (0.1 + 0.2 reads 0.3); a number
// with more digits before the point is shown whole, never rounded to a
// different one (123456789012345 is not 123456789012000).
export const formatNumber = (value) => {
  const number = rewardOf(value);
  if (typeof number !== "number") return "–";
  return String(Math.abs(number) < 1e12 ? Number(number.toPrecision(12)) : number);
};
const pretty = (value) => JSON.stringify(value, null, 2);

// One row per step, or per tool call (its row says "tool", its action is name(arguments)).
export function addHistory(body, action, data, label) {
  const row = document.createElement("tr");
  const step = document.createElement("th");
  step.scope = "row";
  step.textContent = label;
  const done = data.done || data.finished;
  const cells = [
    typeof action === "string" ? action : JSON.stringify(action),
    formatNumber(data.reward),
    done ? "yes" : "no",
  ].map(
    (text, index) => {
      const cell = document.createElement("td");
      if (index === 0) {
        const code = document.createElement("code");
        code.textContent = text;
        cell.append(code);
      } else {
        cell.textContent = text;
      }
      return cell;
    },
  );
  // The step number is a button that opens the whole reply under the row.
  const toggle = document.createElement("button");
  toggle.type = "button";
  toggle.className = "link";
  toggle.textContent = label;
  toggle.setAttribute("aria-expanded", "false");
  step.replaceChildren(toggle);
  const detail = document.createElement("tr");
  detail.className = "detail";
  detail.hidden = true;
  const cell = detail.insertCell();
  cell.colSpan = 4;
  // The reply is written out when first opened: a long episode of large
  // observations would otherwise hold a second, pretty-printed copy of every
  // reply in the page (the log keeps the replies themselves, for Export).
  toggle.addEventListener("click", () => {
    if (!cell.firstChild) {
      const reply = document.createElement("pre");
      reply.className = "json";
      reply.textContent = pretty(data);
      cell.append(reply);
    }
    detail.hidden = !detail.hidden;
    toggle.setAttribute("aria-expanded", String(!detail.hidden));
  });
  row.append(step, ...cells);
  body.append(row, detail);
  row.scrollIntoView({ block: "nearest" });
}

// Save the episode's exchanges (`log`: {type, request, reply} each) as a JSONL file.
export function exportHistory(log, name) {
  const text = log.map((entry) => JSON.stringify(entry)).join("\n") + "\n";
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([text], { type: "application/x-ndjson" }));
  link.download = `${name || "episode"}-episode.jsonl`;
  link.click();
  URL.revokeObjectURL(link.href);
}
