// The API key of a server started with one, whose page is opened as
// /web?api_key=KEY: fetches send it as a Bearer token, the WebSocket as a
// subprotocol (browsers cannot set headers).
export const apiKey = takeApiKey();

// The key leaves the address bar as soon as it is read, so it stays out of the
// browser's history and of any link copied from the page; this tab keeps it
// (sessionStorage), so a reload still has it.
function takeApiKey() {
  const stored = "openenv.api_key";
  const address = new URL(window.location.href);
  const given = address.searchParams.get("api_key");
  if (given === null) {
    try {
      return window.sessionStorage.getItem(stored);
    } catch {
      return null; // storage disabled: the key must be given again
    }
  }
  address.searchParams.delete("api_key");
  window.history.replaceState(window.history.state, "", address.href);
  try {
    window.sessionStorage.setItem(stored, given);
  } catch {
    // storage disabled: this load has the key, a reload will not
  }
  return given;
}

// A subprotocol must be an HTTP token: a key with '/' or '=' (base64) in it
// would make the browser refuse to open the socket, so it goes in the URL.
export const keyIsToken = Boolean(apiKey) && /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(apiKey);
