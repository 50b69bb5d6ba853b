//! The operations jobs an on-call engineer runs: `erase`, `drift`, `reconcile`, `rebuild`.
//! Each is safe to run twice and to kill halfway, and says what it is doing.

pub mod cut;
pub mod dead_letters;
pub mod drift;
pub mod erase;
pub mod progress;
pub mod rebuild;
pub mod reconcile;
