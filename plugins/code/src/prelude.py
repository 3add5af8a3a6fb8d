# sidejob code-mode prelude (Python): `tools` talks to the run's bridge ($SIDEJOB_BRIDGE),
# newline-delimited JSON-RPC 2.0 scoped to this session.
import json as _json, os as _os, socket as _socket


class ToolError(Exception):
    """A bridge call failed; `.error` is the JSON-RPC error object."""

    def __init__(self, message, error=None):
        super().__init__(message)
        self.error = error or {}


class _Bridge:
    def __init__(self):
        self._sock = None
        self._buf = b""
        self._id = 0

    def call(self, method, params=None):
        try:
            return self._call(method, params)
        except (OSError, ToolError) as e:
            if isinstance(e, ToolError) and e.error:
                raise
            # The connection is gone (the daemon restarted): the next call connects again.
            self._sock, self._buf = None, b""
            raise ToolError(str(e) or "the bridge closed the connection")

    def _call(self, method, params):
        if self._sock is None:
            path = _os.environ.get("SIDEJOB_BRIDGE")
            if not path:
                raise ToolError("no bridge: SIDEJOB_BRIDGE is not set")
            self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            self._sock.connect(path)
        self._id += 1
        req = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": params or {}}
        self._sock.sendall((_json.dumps(req) + "\n").encode())
        while True:
            while b"\n" not in self._buf:
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise ToolError("the bridge closed the connection")
                self._buf += chunk
            line, self._buf = self._buf.split(b"\n", 1)
            msg = _json.loads(line)
            if msg.get("id") != self._id:
                continue
            if "error" in msg:
                raise ToolError(msg["error"].get("message", "error"), msg["error"])
            return msg["result"]


_bridge = _Bridge()


class _Jobs:
    def list(self, states=None):
        return _bridge.call("task.list", {"states": states} if states else {})["tasks"]

    def get(self, task_id):
        return _bridge.call("task.get", {"task_id": task_id})

    def output(self, task_id):
        out, offset = "", 0
        while True:
            page = _bridge.call("task.output", {"task_id": task_id, "offset": offset})
            out += page["data"]
            if page["next_offset"] >= page["size"]:
                return out
            offset = page["next_offset"]

    def wait(self, task_id, timeout_ms=3600000):
        return _bridge.call("task.wait", {"task_id": task_id, "timeout_ms": timeout_ms})

    def stop(self, task_id):
        return _bridge.call("task.cancel", {"task_id": task_id})


class _Tools:
    ToolError = ToolError
    jobs = _Jobs()

    def call(self, name, args=None, **options):
        """tool.call: options are yield_after_ms, background, timeout_ms, service."""
        return _bridge.call("tool.call", dict(tool=name, args=args or {}, **options))

    def bash(self, command, options=None):
        """Runs a shell command; options: workdir, description, background, yield_after_ms,
        timeout_ms, service."""
        options = dict(options or {})
        args = {"command": command}
        for key in ("workdir", "description"):
            if key in options:
                args[key] = options.pop(key)
        return self.call("bash", args, **options)

    def request_input(self, schema, prompt):
        """Asks the host; blocks until it answers with task.answer, returns the answer."""
        return _bridge.call("task.request_input", {"schema": schema, "prompt": prompt})["answer"]

    def rpc(self, method, params=None):
        """A raw bridge call."""
        return _bridge.call(method, params)


tools = _Tools()
