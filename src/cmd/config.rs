//! `likes config`: the effective configuration and topology, after every override, as TOML
//! (secrets as `***`: config.rs `redacted`).

use crate::error::{Error, Result};
use crate::ops::Ctx;

/// The text `likes config` prints.
pub fn show(ctx: &Ctx) -> Result<String> {
    let toml = |what: &str, r: std::result::Result<String, toml::ser::Error>| {
        r.map_err(|e| Error::Config(format!("printing the {what}: {e}")))
    };
    Ok(format!(
        "# effective configuration\n{}\n# effective topology\n{}",
        toml("configuration", toml::to_string(&ctx.settings))?,
        toml("topology", toml::to_string(&ctx.topology))?
    ))
}
