//! `likes reconcile`: the command (its flags, and which items: a scope, or the recount
//! queue). The correction itself, sent through the pipeline and fenced, is [`correct`]'s;
//! the recount queue (ops/dead_letters.rs) uses it too, which is why the two live apart.

pub mod correct;

pub use correct::{run, run_after, ReconcileReport, Sent};

use crate::error::Result;
use crate::ops::cut::Pipeline;

/// Correct drift through the pipeline: each item's difference at a cut goes to
/// likes.deltas as a Correction that stage 2 applies once, through the fence.
///
/// Safe to re-run and to kill after sending: a correction is applied at most once.
///
/// Examples:
///   likes reconcile --item i-42 --dry-run
///   likes reconcile --all --reason "after incident 123"
///   likes reconcile --dead-letters --push http://pushgateway:9091   # the recount queue
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub scope: crate::ops::drift::ScopeArgs,
    /// Print the corrections without sending them.
    #[arg(long)]
    pub dry_run: bool,
    /// Recorded on each correction and logged by stage 2.
    #[arg(long, default_value = "reconcile")]
    pub reason: String,
    /// With --dead-letters: where the run's gauges go (the alerts watch the queue drained).
    #[command(flatten)]
    pub gauges: crate::ops::gauges::Outputs,
}

/// `likes reconcile`. Items left unsettled after every attempt fail the run (exit 1): the
/// same command run again settles them.
pub async fn command(args: Args, ctx: &crate::ops::Ctx) -> Result<crate::ops::Done> {
    let scope = args.scope.scope()?;
    let wait = ctx.settings.ops.wait_timeout;
    let connect = || Pipeline::connect(&ctx.settings, &ctx.topology);
    if let crate::ops::drift::Scope::DeadLetters = scope {
        let run = crate::ops::retrying("reconcile", wait, || async {
            crate::ops::dead_letters::recount(&connect().await?, args.dry_run, &args.reason).await
        })
        .await?;
        let published = if args.dry_run {
            Ok(())
        } else {
            args.gauges.publish("likes_recount", &run.gauges()).await
        };
        return Ok(crate::ops::Done::report(run).failing_on(published));
    }
    if args.gauges.metrics_file.is_some() || args.gauges.push.is_some() {
        return Err(crate::error::Error::Input(
            "--metrics-file and --push go with --dead-letters (drift's gauges: `likes drift`)"
                .into(),
        ));
    }
    let report = crate::ops::retrying("reconcile", wait, || async {
        let p = connect().await?;
        let items = crate::ops::drift::items_of(&p, &scope).await?;
        run(&p, items, args.dry_run, &args.reason).await
    })
    .await?;
    let unsettled = !report.in_flight.is_empty();
    Ok(crate::ops::Done::report(report).failing_if(
        unsettled,
        "some items are not reconciled (see above); run the same command again",
    ))
}
