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
    /// With --dead-letters: write the run's gauges here (Prometheus text format; the alerts
    /// watch the queue drained).
    // Refused beside every other scope: clap's `requires = "dead_letters"` is met by a
    // flag's implicit `false`, so it would let `--all --push` through.
    #[arg(long, conflicts_with_all = OTHER_SCOPES)]
    pub metrics_file: Option<std::path::PathBuf>,
    /// With --dead-letters: PUT the run's gauges to this Pushgateway (http://host:port).
    #[arg(long, conflicts_with_all = OTHER_SCOPES, value_parser = crate::ops::gauges::gateway_arg)]
    pub push: Option<String>,
}

/// The scopes of `ScopeArgs` other than `--dead-letters`: drift's gauges are `likes drift`'s.
const OTHER_SCOPES: [&str; 4] = ["items", "sample", "all", "items_from"];

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
        let gauges = crate::ops::gauges::Outputs {
            metrics_file: args.metrics_file,
            push: args.push,
        };
        let published = if args.dry_run {
            Ok(())
        } else {
            gauges.publish("likes_recount", &run.gauges()).await
        };
        return Ok(crate::ops::Done::report(run).failing_on(published));
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

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Reconcile {
        #[command(flatten)]
        args: super::Args,
    }

    /// The recount queue's gauges go with `--dead-letters` alone; drift's are `likes drift`'s.
    #[test]
    fn the_gauges_flags_go_with_the_recount_queue_only() {
        let parse = |argv: &[&str]| Reconcile::try_parse_from(argv).map(|r| r.args);
        let queue = parse(&["r", "--dead-letters", "--push", "http://gw:9091"]).unwrap();
        assert_eq!(queue.push.as_deref(), Some("http://gw:9091"));
        assert!(parse(&["r", "--dead-letters", "--metrics-file", "/tmp/g.prom"]).is_ok());
        for other in [&["--all"][..], &["--item", "i-1"], &["--sample", "10"]] {
            let mut argv = vec!["r"];
            argv.extend_from_slice(other);
            argv.extend_from_slice(&["--push", "http://gw:9091"]);
            assert!(parse(&argv).is_err(), "{argv:?} accepted");
        }
        assert!(parse(&["r", "--dead-letters", "--push", "https://gw"]).is_err());
    }
}
