// sidejob code-mode prelude (JavaScript): `tools` talks to the run's bridge ($SIDEJOB_BRIDGE),
// newline-delimited JSON-RPC 2.0 scoped to this session. Every call returns a Promise; the
// script runs inside an async function, so use `await`.
const __net = require("net");
class ToolError extends Error {
  constructor(message, error) { super(message); this.error = error || {}; }
}
const __bridge = (() => {
  let sock = null, buf = "", nextId = 0;
  const pending = new Map();
  function conn() {
    if (sock) return sock;
    const path = process.env.SIDEJOB_BRIDGE;
    if (!path) throw new ToolError("no bridge: SIDEJOB_BRIDGE is not set");
    sock = __net.createConnection(path);
    sock.setEncoding("utf8");
    sock.on("data", (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        const msg = JSON.parse(buf.slice(0, i));
        buf = buf.slice(i + 1);
        const p = pending.get(msg.id);
        if (!p) continue;
        pending.delete(msg.id);
        if (msg.error) p.reject(new ToolError(msg.error.message, msg.error));
        else p.resolve(msg.result);
      }
    });
    // A lost connection (the daemon restarted) fails the calls in flight; the next call
    // connects again.
    const fail = (e) => { sock = null; buf = ""; for (const p of pending.values()) p.reject(e); pending.clear(); };
    sock.on("error", fail);
    sock.on("close", () => fail(new ToolError("the bridge closed the connection")));
    return sock;
  }
  return {
    call(method, params) {
      return new Promise((resolve, reject) => {
        const id = ++nextId;
        pending.set(id, { resolve, reject });
        conn().write(JSON.stringify({ jsonrpc: "2.0", id, method, params: params || {} }) + "\n");
      });
    },
    close() { if (sock) sock.end(); },
  };
})();
const tools = {
  ToolError,
  call: (name, args, options) => __bridge.call("tool.call", Object.assign({ tool: name, args: args || {} }, options || {})),
  bash: (command, options) => {
    const o = Object.assign({}, options || {});
    const args = { command };
    for (const k of ["workdir", "description"]) if (k in o) { args[k] = o[k]; delete o[k]; }
    return tools.call("bash", args, o);
  },
  request_input: async (schema, prompt) => (await __bridge.call("task.request_input", { schema, prompt })).answer,
  rpc: (method, params) => __bridge.call(method, params),
  jobs: {
    list: async (states) => (await __bridge.call("task.list", states ? { states } : {})).tasks,
    get: (task_id) => __bridge.call("task.get", { task_id }),
    output: async (task_id) => {
      let out = "", offset = 0;
      for (;;) {
        const page = await __bridge.call("task.output", { task_id, offset });
        out += page.data;
        if (page.next_offset >= page.size) return out;
        offset = page.next_offset;
      }
    },
    wait: (task_id, timeout_ms) => __bridge.call("task.wait", { task_id, timeout_ms: timeout_ms || 3600000 }),
    stop: (task_id) => __bridge.call("task.cancel", { task_id }),
  },
};
