// sidejob's opencode plugin: hands the session the background jobs that finished after the
// model ended its turn (opencode shows the model no MCP notification). It asks `sidejob hook`,
// which acks what it hands over, so each completion reaches the model once.
// `sidejob integrate opencode` writes this file with the line below naming its binary.
const SIDEJOB = process.env.SIDEJOB_BIN || "sidejob"

async function take(directory, kind) {
  const proc = Bun.spawn([SIDEJOB, "hook", kind, "--json", "--workspace", directory], {
    stdout: "pipe",
    stderr: "ignore",
  })
  const out = await new Response(proc.stdout).text()
  await proc.exited
  try {
    return JSON.parse(out).text || ""
  } catch {
    return ""
  }
}

export const SidejobPlugin = async ({ client, directory }) => ({
  event: async ({ event }) => {
    if (event.type !== "session.idle") return
    const text = await take(directory, "wait")
    if (!text) return
    await client.session.prompt({
      path: { id: event.properties.sessionID },
      body: { parts: [{ type: "text", text }] },
    })
  },
})
