//! Issue 32, item 10: one MCP tool call with more than 1 MiB of arguments dropped `sidejob
//! mcp`'s connection to the daemon (which closes a connection whose line is over its
//! limit), and every later call failed until the server was restarted.

use serde_json::json;
use sidejob_tests::Daemon;

use crate::mcp::{text_of, Mcp};

#[test]
fn attack_an_oversized_mcp_call_cut_every_later_call_off() {
    let d = Daemon::start();
    let mut m = Mcp::start(&d);
    m.init();
    let big = "x".repeat(1_200_000);
    let connections = || d.log().matches(": connected").count();
    let before = connections();
    let r = m.call("bash", json!({"command": format!("echo {big}")}));
    let text = text_of(&r);
    assert!(
        r["isError"] == true && text.contains("at most 1024 KiB"),
        "{}",
        &text[..text.len().min(300)]
    );
    // Host side: the daemon was not even connected to for it, so it cut no connection off.
    assert_eq!(
        connections(),
        before,
        "the oversized call reached the daemon"
    );
    // Control: the same server's next call runs.
    let r = m.call("bash", json!({"command": "echo still-connected"}));
    assert_eq!(text_of(&r), "still-connected\n", "{r}");
    assert!(connections() > before, "the count above sees connections");
}
