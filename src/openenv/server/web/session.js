// One WebSocket session speaking openenv's wire protocol (v1).
//
// Each request carries an "id"; its reply carries the same one. Frames with no
// id, and fatal replies, are the server's last word before it closes the socket
// (at capacity, idle timeout, shutdown, a step past its timeout): they are kept
// and handed to onclose.

export const CAPACITY_REACHED = "CAPACITY_REACHED";
const TRY_AGAIN_LATER = 1013;

export class SessionClosed extends Error {}

export class Session {
  constructor(url, { protocols = [], onopen = () => {}, onclose = () => {} } = {}) {
    this.pending = new Map();
    this.nextId = 1;
    this.opened = false;
    this.finalError = null;
    this.socket = new WebSocket(url, protocols);
    this.socket.addEventListener("open", () => {
      this.opened = true;
      onopen();
    });
    this.socket.addEventListener("message", (event) => this.receive(event.data));
    this.socket.addEventListener("close", (event) => {
      const error = new SessionClosed("the connection closed");
      for (const { reject } of this.pending.values()) reject(error);
      this.pending.clear();
      onclose({
        code: event.code,
        reason: event.reason,
        opened: this.opened,
        error: this.finalError,
        atCapacity:
          event.code === TRY_AGAIN_LATER || this.finalError?.code === CAPACITY_REACHED,
      });
    });
  }

  get open() {
    return this.socket.readyState === WebSocket.OPEN;
  }

  // Send one request; resolve with the reply frame ({type, data}), whatever its type.
  request(type, data) {
    if (!this.open) return Promise.reject(new SessionClosed("not connected"));
    const id = this.nextId++;
    const frame = data === undefined ? { type, id } : { type, data, id };
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.socket.send(JSON.stringify(frame));
    });
  }

  receive(text) {
    let frame;
    try {
      frame = JSON.parse(text);
    } catch {
      return; // the server only sends JSON; ignore anything else rather than crash the page
    }
    const waiter = frame.id === undefined ? undefined : this.pending.get(frame.id);
    if (waiter) {
      this.pending.delete(frame.id);
      waiter.resolve(frame);
    }
    // A fatal reply (a step past step_timeout) is also why the socket closes next.
    if (frame.type === "error" && (!waiter || frame.data?.fatal)) this.finalError = frame.data;
  }

  close() {
    this.socket.close(1000);
  }
}
