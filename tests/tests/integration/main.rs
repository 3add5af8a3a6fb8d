//! Integration tests: the real daemon over its real socket. One module per area.

// A test that cannot go on should stop with a message saying why; that is what `expect` does.
#![allow(clippy::expect_used, clippy::unwrap_used)]
// The attacks and host-side checks make raw system calls on purpose (each block says why it
// is sound); the workspace denies `unsafe` everywhere else outside `runner/src/sys/`.
#![allow(unsafe_code)]

mod agents;
mod attacks;
mod bridge;
mod cancel;
mod cli;
mod cli_call;
mod cli_grants;
mod cli_more;
mod cli_streams;
mod cli_wakes;
mod code;
mod containment;
mod containment_daemon;
mod containment_limits;
mod containment_net;
mod containment_process;
mod delivery;
mod deploy;
mod deploy_health;
mod deploy_image;
mod deploy_systemd;
mod deploy_toolchain;
mod failures;
mod faults;
mod inbox;
mod isolation;
mod mcp;
mod mcp_hooks;
mod mcp_sdk;
mod mcp_wakes;
mod netns;
mod network;
mod network_attacks;
mod network_daemon;
mod oneshot;
mod output;
mod plugin_trust;
mod plugins;
mod profiles;
mod protocol;
mod protocol_errors;
mod registry;
mod restart;
mod restart_cases;
mod run_dirs;
mod schedule_triggers;
mod schedules;
mod serve;
mod sessions;
mod shared_daemon;
mod shares;
mod smoke;
mod spawner;
mod stdin;
mod subagent;
mod subagent_claude;
mod subagent_net;
mod toolchains;
mod upgrade;
mod wakes;
mod yielding;
