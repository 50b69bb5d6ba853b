//! A source row made into the edge the write path would have left (docs/adoption.md, "What an
//! imported edge looks like"), or the reason it cannot be one.

use super::source::Value;
use crate::store::imported::ImportedEdge;

/// A source time this far past the import's clock is refused (a unit mistake: µs as ms).
pub const FUTURE_SLACK_MS: i64 = 5 * 60_000;

/// What the import knows when it shapes rows.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub buckets: u32,
    /// The latest `updated_at` an imported like is stored with: past stage 1's dedupe horizon
    /// when the import began, and then some. Stage 1 never saw the import's op 1, so the
    /// edge's first live flip (op 2) finds its baseline only in the previous flip's time
    /// being past the horizon (`dedupe::rule`): "counted and forgotten". An imported like
    /// stamped inside the horizon would make that unlike count 0 instead of −1.
    pub like_floor_ms: i64,
    /// The import's clock at its start: later source times are refused.
    pub now_ms: i64,
    /// The file has no liked column: a table of current likes.
    pub all_liked: bool,
}

impl Shape {
    pub fn new(buckets: u32, dedupe_ttl_ms: i64, now_ms: i64, all_liked: bool) -> Shape {
        // A margin as long as the horizon again: a later, longer horizon (up to twice this
        // one) still sees imported likes as forgotten.
        Shape {
            buckets,
            like_floor_ms: now_ms - 2 * dedupe_ttl_ms - 86_400_000,
            now_ms,
            all_liked,
        }
    }

    /// The edge of a row's values, or why not.
    pub fn edge(&self, values: &[Value; 4]) -> Result<ImportedEdge, String> {
        let [item, user, liked, time] = values;
        let item = id("item", item)?;
        let user = id("user", user)?;
        // No liked column (--all-liked): every row is a like.
        let liked = self.all_liked || liked_of(liked)?;
        let source_ms = time_of(time)?;
        if source_ms > self.now_ms + FUTURE_SLACK_MS {
            return Err(format!(
                "time {source_ms} ms is in the future (the time column must be Unix ms, or RFC 3339)"
            ));
        }
        let bucket = crate::hash::bucket_of(&user, self.buckets) as i32;
        Ok(ImportedEdge {
            updated_at_ms: liked.then_some(source_ms.min(self.like_floor_ms)),
            item,
            bucket,
            user,
            liked,
            source_ms,
        })
    }
}

fn id(what: &str, v: &Value) -> Result<String, String> {
    let s = match v {
        Value::Missing => return Err(format!("no {what}")),
        Value::Text(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        other => return Err(format!("{what} {other:?} is not an id")),
    };
    if crate::write::valid_id(&s) {
        Ok(s)
    } else {
        Err(format!(
            "{what} {s:?} is not 1-128 characters of A-Z a-z 0-9 _ - :"
        ))
    }
}

fn liked_of(v: &Value) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        Value::Text(s) => match s.to_ascii_lowercase().as_str() {
            "true" | "1" | "t" | "yes" | "y" | "like" | "liked" => Ok(true),
            "false" | "0" | "f" | "no" | "n" | "unlike" | "unliked" => Ok(false),
            _ => Err(format!("liked {s:?} is not true/false, 1/0, liked/unliked")),
        },
        Value::Missing => Err("no liked value".into()),
        other => Err(format!(
            "liked {other:?} is not true/false, 1/0, liked/unliked"
        )),
    }
}

fn time_of(v: &Value) -> Result<i64, String> {
    let ms = match v {
        Value::Missing => return Err("no time".into()),
        Value::Int(ms) | Value::TimeMs(ms) => *ms,
        Value::Text(s) => crate::ops::replay::parse_time(s)
            .map_err(|_| format!("time {s:?} is neither Unix ms nor RFC 3339"))?,
        other => return Err(format!("time {other:?} is neither Unix ms nor RFC 3339")),
    };
    if ms <= 0 {
        return Err(format!("time {ms} is not after 1970"));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000;

    fn t(s: &str) -> Value {
        Value::Text(s.into())
    }

    #[test]
    fn rows_become_edges_with_likes_stamped_past_the_horizon() {
        let now = 1_800_000_000_000;
        let shape = Shape::new(64, 7 * DAY, now, false);
        let e = shape
            .edge(&[t("i1"), t("u1"), t("true"), Value::Int(now - DAY)])
            .unwrap();
        assert!(e.liked && e.source_ms == now - DAY);
        // Inside the horizon at import: stored past it, so a live unlike finds its baseline.
        assert_eq!(e.updated_at_ms, Some(now - 15 * DAY));
        assert!(crate::dedupe::rule::expired(
            e.updated_at_ms.unwrap(),
            now,
            7 * DAY
        ));
        let old = shape
            .edge(&[
                t("i1"),
                t("u1"),
                Value::Bool(true),
                Value::Int(now - 400 * DAY),
            ])
            .unwrap();
        assert_eq!(old.updated_at_ms, Some(now - 400 * DAY));
        let un = shape
            .edge(&[t("i1"), t("u1"), t("unliked"), t("2024-01-02T03:04:05Z")])
            .unwrap();
        assert!(!un.liked && un.updated_at_ms.is_none() && un.op_id() == 0);
        assert_eq!(un.bucket as u32, crate::hash::bucket_of("u1", 64));
    }

    #[test]
    fn bad_rows_say_why() {
        let shape = Shape::new(64, 7 * DAY, 1_800_000_000_000, false);
        let why = |v: [Value; 4]| shape.edge(&v).unwrap_err();
        assert!(why([Value::Missing, t("u"), t("1"), Value::Int(5)]).contains("no item"));
        assert!(why([t("i 1"), t("u"), t("1"), Value::Int(5)]).contains("not 1-128"));
        assert!(why([t("i"), t("u"), t("maybe"), Value::Int(5)]).contains("liked \"maybe\""));
        assert!(why([t("i"), t("u"), t("1"), t("yesterday")]).contains("neither"));
        assert!(
            why([t("i"), t("u"), t("1"), Value::Int(1_800_000_000_000_000)]).contains("future")
        );
        assert!(why([t("i"), t("u"), t("1"), Value::Int(0)]).contains("1970"));
    }
}
