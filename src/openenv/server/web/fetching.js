// GETs of the page's own server, with the tab's API key, and the address of its
// WebSocket.

import { apiKey } from "./apikey.js";

// A GET the server never answers (a task listing that hangs, say) fails like any
// other failed GET after this long, so what waits on it (Reset waits on the task
// list and the queue check) is not held for good.
const LOAD_TIMEOUT_MS = 10_000;

export function endpoint(path, websocket = false) {
  const url = new URL(path, document.baseURI);
  if (websocket) url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

export const loadJSON = (path) => load(path, { Accept: "application/json" }, (r) => r.json());

export const loadText = (path) => load(path, {}, (r) => r.text());

async function load(path, headers, read) {
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), LOAD_TIMEOUT_MS);
  try {
    const response = await fetch(endpoint(path), { headers, signal: abort.signal });
    if (response.status === 401) {
      throw new Error("this server needs an API key: open the page as /web?api_key=KEY");
    }
    if (!response.ok) throw new Error(`GET ${path} answered ${response.status}`);
    return await read(response); // the body too may never come
  } catch (problem) {
    if (abort.signal.aborted) throw new Error(`GET ${path} had no answer in ${LOAD_TIMEOUT_MS / 1000} s`);
    throw problem;
  } finally {
    clearTimeout(timer);
  }
}
