//! `outbox_lease`: which relay drains each outbox shard for now (issue 43, item 7c).
//!
//! Every API pod runs a relay by default, and each used to publish every deferred entry:
//! after an outage the same flips reached stage 1 once per relay. A relay now drains a
//! shard only while it holds the shard's lease. The lease is a row written by
//! compare-and-set with a TTL, so a relay that dies lets its shards go within the TTL.
//!
//! The lease is for efficiency, not exactness: a relay paused past its lease may still
//! publish an entry another relay publishes too, and stage 1 drops the copy by op_id
//! (docs/exactness.md, "The relay").

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::{not_applied, prepare};
use crate::error::Result;

pub struct Leases {
    session: Arc<Session>,
    read: PreparedStatement,
    take: PreparedStatement,
    renew: PreparedStatement,
    release: PreparedStatement,
    /// This relay's name in the table: host, pid and a random part, so a restarted process
    /// never takes itself for the one that held the lease before.
    owner: String,
    /// The region whose entries this relay publishes ("" without home regions): the outbox
    /// is shared by every region, so each region's relays hold leases of their own.
    region: String,
    ttl_s: i32,
}

/// What a relay may do with a shard this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Mine,
    Others,
}

impl Leases {
    pub async fn prepare(
        session: Arc<Session>,
        ks: &str,
        region: Option<&str>,
        ttl: Duration,
    ) -> Result<Self> {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "relay".into());
        Ok(Self {
            read: prepare(
                &session,
                format!(
                    "SELECT shard, owner, TTL(owner) FROM {ks}.outbox_lease \
                     WHERE region = ? AND shard IN ?"
                ),
            )
            .await?,
            take: prepare(
                &session,
                format!(
                    "INSERT INTO {ks}.outbox_lease (region, shard, owner) VALUES (?, ?, ?) \
                     IF NOT EXISTS USING TTL ?"
                ),
            )
            .await?,
            renew: prepare(
                &session,
                format!(
                    "UPDATE {ks}.outbox_lease USING TTL ? SET owner = ? \
                     WHERE region = ? AND shard = ? IF owner = ?"
                ),
            )
            .await?,
            release: prepare(
                &session,
                format!(
                    "DELETE FROM {ks}.outbox_lease WHERE region = ? AND shard = ? IF owner = ?"
                ),
            )
            .await?,
            owner: format!(
                "{host}-{}-{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ),
            region: region.unwrap_or_default().to_string(),
            ttl_s: ttl.as_secs().max(1) as i32,
            session,
        })
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The shards this relay may drain this pass, of `shards`: those it holds (renewed once
    /// half their TTL is gone) and those no relay holds (taken). One plain read for all of
    /// them; a compare-and-set only to take or renew.
    pub async fn hold(&self, shards: impl Iterator<Item = i32>) -> Result<HashMap<i32, Held>> {
        let shards: Vec<i32> = shards.collect();
        let rows = self
            .session
            .execute_unpaged(&self.read, (&self.region, &shards))
            .await?
            .into_rows_result()?;
        let mut now: HashMap<i32, (String, i32)> = HashMap::new();
        for row in rows.rows::<(i32, Option<String>, Option<i32>)>()? {
            let (shard, owner, ttl) = row?;
            if let Some(owner) = owner {
                now.insert(shard, (owner, ttl.unwrap_or(0)));
            }
        }
        let mut held = HashMap::new();
        for &shard in &shards {
            let state = match now.get(&shard) {
                Some((owner, left)) if *owner == self.owner => {
                    if *left * 2 > self.ttl_s || self.renew(shard).await? {
                        Held::Mine
                    } else {
                        Held::Others
                    }
                }
                Some(_) => Held::Others,
                None => {
                    if self.take(shard).await? {
                        Held::Mine
                    } else {
                        Held::Others
                    }
                }
            };
            held.insert(shard, state);
        }
        Ok(held)
    }

    async fn take(&self, shard: i32) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(&self.take, (&self.region, shard, &self.owner, self.ttl_s))
            .await?;
        Ok(not_applied(r)?.is_none())
    }

    async fn renew(&self, shard: i32) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(
                &self.renew,
                (self.ttl_s, &self.owner, &self.region, shard, &self.owner),
            )
            .await?;
        Ok(not_applied(r)?.is_none())
    }

    /// Lets a shard go at once (a pass that could not drain it, a relay stopping), so another
    /// relay takes it without waiting out the TTL.
    pub async fn release(&self, shard: i32) -> Result<()> {
        self.session
            .execute_unpaged(&self.release, (&self.region, shard, &self.owner))
            .await?;
        Ok(())
    }
}
