//! A plugin that claims a contract version the daemon does not speak, built by hand (not
//! with the SDK) to show how the loader reports the mismatch.

use sidejob_plugin_api::abi_stable::prefix_type::PrefixTypeTrait;
use sidejob_plugin_api::abi_stable::std_types::{RResult, RStr, RString};
use sidejob_plugin_api::{PluginModule, PluginModuleRef};

extern "C" fn contract_version() -> u32 {
    99
}

extern "C" fn describe() -> RResult<RString, RString> {
    RResult::ROk(r#"{"name":"wrong-contract","version":"0","tools":[]}"#.into())
}

extern "C" fn plan(_: RStr<'_>, _: RStr<'_>, _: RStr<'_>) -> RResult<RString, RString> {
    RResult::RErr("unsupported".into())
}

extern "C" fn render(_: RStr<'_>) -> RResult<RString, RString> {
    RResult::ROk(RString::new())
}

#[sidejob_plugin_api::abi_stable::export_root_module]
pub fn root_module() -> PluginModuleRef {
    PluginModule {
        contract_version,
        describe,
        plan,
        render,
    }
    .leak_into_prefix()
}
