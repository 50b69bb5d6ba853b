//! `likes token`: a session token signed with `api.session_key`, for development and tests
//! (production tokens come from the identity service; docs/architecture.md).

use crate::error::Result;
use crate::ops::{Ctx, Done};

/// Print a session token for a user, signed with api.session_key (for development and
/// tests; production tokens come from the identity service).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The user the token acts for.
    #[arg(long, value_parser = crate::write::id_arg)]
    pub user: String,
    /// How long the token is valid, e.g. 1h.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub ttl: std::time::Duration,
}

/// `likes token`.
pub fn command(args: Args, ctx: &Ctx) -> Result<Done> {
    let signer = crate::api::auth::Signer::from_session_key(&ctx.settings.api.session_key)?;
    let expires = crate::runtime::clock::now_ms() / 1000 + args.ttl.as_secs() as i64;
    Ok(Done::report(signer.sign(&args.user, expires)))
}
