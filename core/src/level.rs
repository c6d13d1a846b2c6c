//! How finely a value varies over a batch.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How finely a value varies: one per batch, per group (prompt), per response, per token, or per
/// ordered pair of distinct responses of a group.
///
/// Ordered coarse → fine, so `max` of two levels is the level both broadcast to; `pair` comes last
/// (after `tok`) so that no pair value fits a slot of another level. The levels form a tree: `tok`
/// and `pair` are both below `resp`, and neither is below the other ([`Level::broadcasts_to`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Batch,
    Group,
    Resp,
    Tok,
    /// Ordered pairs (i, j ≠ i) of the responses of one group: a pair input (`f32[pair]`,
    /// `bool[pair]`), or what is computed from one (inside `… over others`).
    Pair,
}

impl Level {
    /// Every level, coarse → fine.
    pub const ALL: [Level; 5] = [
        Level::Batch,
        Level::Group,
        Level::Resp,
        Level::Tok,
        Level::Pair,
    ];

    /// The level as a type writes it (`resp` in `f32[resp]`).
    pub fn name(self) -> &'static str {
        match self {
            Level::Batch => "batch",
            Level::Group => "group",
            Level::Resp => "resp",
            Level::Tok => "tok",
            Level::Pair => "pair",
        }
    }

    /// The level a type names (`None` for any other word).
    pub fn from_name(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|level| level.name() == name)
    }

    /// Whether values at `self` broadcast to `finer`: a coarser level to a finer one along the tree
    /// batch → group → resp → {tok, pair}; `tok` and `pair` never to each other.
    pub fn broadcasts_to(self, finer: Level) -> bool {
        match (self, finer) {
            (a, b) if a == b => true,
            (Level::Tok | Level::Pair, _) => false,
            (a, b) => a < b,
        }
    }

    /// The level one step coarser (what a reduction over this level's axis yields).
    pub fn coarser(self) -> Level {
        match self {
            Level::Tok | Level::Pair => Level::Resp,
            Level::Resp => Level::Group,
            Level::Group | Level::Batch => Level::Batch,
        }
    }
}

/// The level a `keep` filter drops at: whole groups (prompts) or single responses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeepLevel {
    Group,
    Resp,
}

impl KeepLevel {
    /// The level of the condition's values (one per group, or one per response).
    pub fn level(self) -> Level {
        match self {
            KeepLevel::Group => Level::Group,
            KeepLevel::Resp => Level::Resp,
        }
    }

    /// As a recipe writes it (`keep group when …`).
    pub fn name(self) -> &'static str {
        self.level().name()
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for level in Level::ALL {
            assert_eq!(Level::from_name(level.name()), Some(level));
            assert_eq!(level.to_string(), level.name());
        }
        assert_eq!(Level::from_name("token"), None);
    }

    #[test]
    fn levels_broadcast_down_the_tree_only() {
        use Level::*;
        let below = |a: Level, b: Level| a.broadcasts_to(b);
        for fine in [Group, Resp, Tok, Pair] {
            assert!(below(Batch, fine));
            assert!(!below(fine, Batch));
        }
        assert!(below(Group, Tok) && below(Resp, Pair) && below(Group, Pair));
        assert!(!below(Tok, Pair) && !below(Pair, Tok));
        assert!(!below(Tok, Resp) && !below(Pair, Resp));
        assert!(Level::ALL.into_iter().all(|l| below(l, l)));
        assert_eq!(Pair.coarser(), Resp);
        assert_eq!(Tok.coarser(), Resp);
        assert_eq!(Resp.coarser(), Group);
        assert_eq!(Batch.coarser(), Batch);
        assert_eq!(KeepLevel::Group.level(), Group);
        assert_eq!(KeepLevel::Resp.name(), "resp");
    }

    #[test]
    fn serde_names_are_the_type_names() {
        // What `.rlxc` artifacts and `--emit ir-json` hold.
        for level in Level::ALL {
            let json = serde_json::to_string(&level).expect("serializes");
            assert_eq!(json, format!("\"{level}\""));
            assert_eq!(serde_json::from_str::<Level>(&json).expect("parses"), level);
        }
    }
}
