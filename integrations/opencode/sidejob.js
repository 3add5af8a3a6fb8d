// sidejob for opencode: a background job's completion reaches the model even after its turn
// ended. Install it as .opencode/plugin/sidejob.js (or ~/.config/opencode/plugin/sidejob.js);
// `sidejob integrate opencode` does that and adds the MCP server to opencode.json.
//
// - When a session goes idle while this workspace's sidejob session still has background jobs,
//   `sidejob hook wait` waits for them to settle and the plugin prompts the session with their
//   completion text: the TUI and `opencode serve` carry on with the result.
// - When a message starts a turn (`opencode run` included), completions nobody has read yet
//   (`sidejob hook unread`) are added to it, so the next `opencode run` hears of what the last
//   one ended on.
// Both commands ack what they print, so each completion reaches the model once.

const SIDEJOB = process.env.SIDEJOB_BIN || "sidejob"

// `opencode run` exits as its session goes idle, without waiting for plugins: a `hook wait`
// started then would take (and ack) a completion that no prompt can carry any more. So under
// `run` the plugin leaves completions unread for the next run, and any hook still going when
// opencode exits ends with it.
const ONE_SHOT = process.argv.slice(2).find((a) => !a.startsWith("-")) === "run"

const running = {
  procs: new Set(),
  add(proc) {
    this.procs.add(proc)
    proc.exited.then(() => this.procs.delete(proc))
    return proc
  },
}
process.on("exit", () => {
  for (const p of running.procs) p.kill()
})

// `sidejob hook wait|unread --json` for this workspace: the completions' text, or "".
async function hook(kind, directory) {
  try {
    const proc = running.add(Bun.spawn([SIDEJOB, "hook", kind, "--workspace", directory, "--json"], {
      stdin: "ignore",
      stdout: "pipe",
      stderr: "ignore",
    }))
    const out = await new Response(proc.stdout).text()
    await proc.exited
    if (!out.trim()) return ""
    return JSON.parse(out).text || ""
  } catch {
    // No sidejob here, or no daemon: nothing to deliver.
    return ""
  }
}

export const Sidejob = async ({ client, directory }) => {
  // Sessions being prompted with a completion: one wait at a time per session.
  const waiting = new Set()
  return {
    "chat.message": async (input, output) => {
      const text = await hook("unread", directory)
      if (!text) return
      const first = output.parts[0] || {}
      output.parts.push({
        ...first,
        id: first.id ? first.id + "sidejob" : undefined,
        type: "text",
        text,
        synthetic: true,
      })
    },
    event: async ({ event }) => {
      if (event.type !== "session.idle" || ONE_SHOT) return
      const sessionID = event.properties.sessionID
      if (waiting.has(sessionID)) return
      waiting.add(sessionID)
      try {
        const text = await hook("wait", directory)
        if (!text) return
        // The plugin's client is the v1 SDK: path and body apart.
        await client.session.prompt({ path: { id: sessionID }, body: { parts: [{ type: "text", text }] } })
      } finally {
        waiting.delete(sessionID)
      }
    },
  }
}
