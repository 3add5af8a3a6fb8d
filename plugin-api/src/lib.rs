//! The stable interface between the sidejob daemon and its tool plugins (docs/plugins.md).
//!
//! A plugin is a `cdylib` that exports one [`abi_stable`] root module, [`PluginModule`]. The
//! module is a prefix type with four entry points, and it is frozen: every value that crosses
//! it is a JSON document in an `RString`, so new behaviour arrives as new JSON keys, never as
//! new fields or methods. The JSON shapes live in [`json`]; the SDK in [`sdk`] exports a plugin
//! from plain Rust functions with every entry point wrapped in `catch_unwind`.
//!
//! Plugins are planners: they describe their tools, turn a call's arguments into a launch
//! plan, and render a finished result. They never start processes; the daemon runs every plan
//! through its one sandbox path.

pub mod json;
pub mod sdk;

pub use abi_stable;

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RResult, RStr, RString};
use abi_stable::{declare_root_module_statics, package_version_strings, StableAbi};

/// The version of the JSON contract carried by the root module. It only changes if the
/// meaning of an existing key changes (never, within plugin-api 1.x).
pub const CONTRACT_VERSION: u32 = 1;

/// The root module every plugin exports. Frozen: do not add, remove or reorder fields.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
#[sabi(missing_field(panic))]
pub struct PluginModule {
    /// The [`CONTRACT_VERSION`] the plugin was built against.
    pub contract_version: extern "C" fn() -> u32,
    /// `Ok(`[`json::PluginInfo`]`)` as JSON.
    pub describe: extern "C" fn() -> RResult<RString, RString>,
    /// `plan(tool, args_json, context_json)`: `Ok(`[`json::LaunchPlan`]`)` as JSON, or
    /// `Err(message)` when the arguments are refused (shown to the host as invalid params).
    pub plan: extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> RResult<RString, RString>,
    /// `render(result_json)`: the text the model sees for a finished task
    /// ([`json::RenderInput`]); an empty string means "use the output as it is".
    #[sabi(last_prefix_field)]
    pub render: extern "C" fn(RStr<'_>) -> RResult<RString, RString>,
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "sidejob_plugin";
    const NAME: &'static str = "sidejob-plugin-api";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// The version of this crate, which abi_stable compares at load time (same major required).
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");
