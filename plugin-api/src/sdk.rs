//! The plugin-author SDK: implement [`Plugin`] with plain Rust and export it with
//! [`export_plugin!`](crate::export_plugin). Every entry point runs inside `catch_unwind`, so
//! a panicking plugin returns an error to the daemon instead of taking it down.

use std::panic::{catch_unwind, AssertUnwindSafe};

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RResult, RStr, RString};
use serde_json::Value;

use crate::json::{LaunchPlan, PlanContext, PluginInfo, RenderInput};
use crate::{PluginModule, PluginModuleRef, CONTRACT_VERSION};

/// A plugin, written as ordinary Rust.
pub trait Plugin {
    /// The plugin and its tools.
    fn describe() -> PluginInfo;
    /// Turns one call into a launch plan, or refuses its arguments with a message.
    fn plan(tool: &str, args: Value, ctx: PlanContext) -> Result<LaunchPlan, String>;
    /// The text the model sees for a finished task; the default keeps the output as it is.
    fn render(_result: RenderInput) -> String {
        String::new()
    }
}

/// Builds the root module for `P`. Used by [`export_plugin!`](crate::export_plugin).
pub fn module<P: Plugin>() -> PluginModuleRef {
    PluginModule {
        contract_version,
        describe: describe::<P>,
        plan: plan::<P>,
        render: render::<P>,
    }
    .leak_into_prefix()
}

extern "C" fn contract_version() -> u32 {
    CONTRACT_VERSION
}

extern "C" fn describe<P: Plugin>() -> RResult<RString, RString> {
    guard("describe", || {
        serde_json::to_string(&P::describe()).map_err(|e| format!("describe: {e}"))
    })
}

extern "C" fn plan<P: Plugin>(
    tool: RStr<'_>,
    args: RStr<'_>,
    context: RStr<'_>,
) -> RResult<RString, RString> {
    guard("plan", || {
        let args: Value =
            serde_json::from_str(args.as_str()).map_err(|e| format!("arguments: {e}"))?;
        let ctx: PlanContext =
            serde_json::from_str(context.as_str()).map_err(|e| format!("plan context: {e}"))?;
        let plan = P::plan(tool.as_str(), args, ctx)?;
        serde_json::to_string(&plan).map_err(|e| format!("plan: {e}"))
    })
}

extern "C" fn render<P: Plugin>(result: RStr<'_>) -> RResult<RString, RString> {
    guard("render", || {
        let input: RenderInput =
            serde_json::from_str(result.as_str()).map_err(|e| format!("render input: {e}"))?;
        Ok(P::render(input))
    })
}

std::thread_local! {
    /// Where the last panic in this plugin happened (`file:line`), set by the quiet hook.
    static PANIC_AT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// A plugin carries its own copy of `std`, so its panics go through its own hook: replace the
/// default one (which prints a raw message and backtrace on the daemon's stderr) with one that
/// only records where the panic happened. The daemon logs the error the guard returns, in
/// the daemon's log format.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()));
            PANIC_AT.with(|p| *p.borrow_mut() = at);
        }));
    });
}

/// Runs `f`, turning a panic into an error that names the entry point.
fn guard(entry: &str, f: impl FnOnce() -> Result<String, String>) -> RResult<RString, RString> {
    quiet_panics();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(s)) => RResult::ROk(s.into()),
        Ok(Err(e)) => RResult::RErr(e.into()),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string payload".into());
            let at = PANIC_AT
                .with(|p| p.borrow_mut().take())
                .map(|at| format!(" (at {at})"))
                .unwrap_or_default();
            RResult::RErr(format!("the plugin panicked in {entry}: {what}{at}").into())
        }
    }
}

/// Exports `$plugin` (a type implementing [`Plugin`]) as this library's root module. The
/// plugin crate must also depend on `abi_stable` (the attribute this expands to names it).
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        #[$crate::abi_stable::export_root_module]
        pub fn sidejob_plugin_root_module() -> $crate::PluginModuleRef {
            $crate::sdk::module::<$plugin>()
        }
    };
}
