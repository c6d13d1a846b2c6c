//! A small seeded RNG (SplitMix64 from `rlx_runtime::synthetic`) with the draws the trainer needs.

pub struct Rng {
    inner: rlx_runtime::synthetic::Rng,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng {
            inner: rlx_runtime::synthetic::Rng::new(seed),
        }
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.inner.uniform()
    }

    /// Uniform integer in [low, high].
    pub fn int(&mut self, low: usize, high: usize) -> usize {
        self.inner.int(low, high)
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// An independent stream for a sub-task (deterministic in the parent's state).
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.inner.next_u64())
    }
}
