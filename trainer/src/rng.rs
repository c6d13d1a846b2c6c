//! A small seeded RNG (SplitMix64, the same sequence as `rlx_runtime::synthetic::Rng`) with the draws the
//! trainer needs, and its state for checkpoints.

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng {
            state: seed ^ 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// The generator at a state saved with [`Rng::state`].
    pub fn from_state(state: u64) -> Rng {
        Rng { state }
    }

    /// The whole state (restoring it with [`Rng::from_state`] continues the same sequence).
    pub fn state(&self) -> u64 {
        self.state
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in [low, high].
    pub fn int(&mut self, low: usize, high: usize) -> usize {
        low + (self.next_u64() % (high - low + 1) as u64) as usize
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Shuffles `items` in place (Fisher–Yates), deterministic in the stream's state.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.int(0, i));
        }
    }

    /// An independent stream for a sub-task (deterministic in the parent's state).
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn the_sequence_is_the_runtimes_splitmix64_and_a_saved_state_continues_it() {
        let mut ours = Rng::new(42);
        let mut theirs = rlx_runtime::synthetic::Rng::new(42);
        for _ in 0..100 {
            assert_eq!(ours.next_u64(), theirs.next_u64());
        }
        let mut resumed = Rng::from_state(ours.state());
        for _ in 0..100 {
            assert_eq!(ours.next_u64(), resumed.next_u64());
        }
    }
}
