//! The built-in open-ended task (`task.kind = "decompose"`, docs/experiments.md): write a target
//! number as `a OP b`. The prompt `17=` asks for any `a+b` equal to 17 with `0 ≤ a, b ≤ max_operand`;
//! `9+8`, `17+0` and `0+17` are all correct, so a prompt has many distinct good answers and the exact
//! validity check needs no learned judge. The semantic partition is exact too: two completions share a
//! class when they are the same tokens (the same answer, since an answer is written one way only: no
//! leading zeros, no spaces). The warm start imitates answers drawn uniformly from each target's valid
//! ones, so the policy starts diverse; what RL does to that diversity is the experiment.
//!
//! It fills `score` and `quality` (1 for a valid answer, else 0) and `cluster` (the response's
//! partition class within its group, numbered by first occurrence) — the inputs of `recipes/grpo.rlx`,
//! `recipes/darling.rlx` and `recipes/darling_additive.rlx`. Every `hold_out_every`-th target is held
//! out of training (its prompts and warm-start examples) and is the evaluation's prompt set.

use serde::{Deserialize, Serialize};

use crate::rng::Rng;
use crate::task::{check_counts, Examples, Prompt, Task, Tokenizer, EOS};

/// `[task]` with `kind = "decompose"` (everything but `kind`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecomposeConfig {
    /// The operator of every answer: `+`, `-` or `*`.
    #[serde(default = "default_op")]
    pub op: String,
    /// Targets are the integers `min_target..=max_target`.
    #[serde(default = "default_min_target")]
    pub min_target: i64,
    #[serde(default = "default_max_target")]
    pub max_target: i64,
    /// Operands are `0..=max_operand`.
    #[serde(default = "default_max_operand")]
    pub max_operand: i64,
    /// Every this many-th target (from `min_target`) is held out of training and evaluated; 0 = none
    /// held out (the evaluation then uses every target).
    #[serde(default = "default_hold_out_every")]
    pub hold_out_every: usize,
}

fn default_op() -> String {
    "+".into()
}
fn default_min_target() -> i64 {
    10
}
fn default_max_target() -> i64 {
    49
}
fn default_max_operand() -> i64 {
    49
}
fn default_hold_out_every() -> usize {
    5
}

impl Default for DecomposeConfig {
    fn default() -> Self {
        DecomposeConfig {
            op: default_op(),
            min_target: default_min_target(),
            max_target: default_max_target(),
            max_operand: default_max_operand(),
            hold_out_every: default_hold_out_every(),
        }
    }
}

/// The task: its settings, each target's valid answers, and the targets split into training and
/// held-out ones.
pub struct Decompose {
    pub config: DecomposeConfig,
    op: char,
    /// (target, its valid answers as operand pairs, sorted), for every target: the one statement of
    /// the task's rule (validity looks answers up here).
    answers: Vec<(i64, Vec<(i64, i64)>)>,
    /// Indices into `answers`.
    train: Vec<usize>,
    held_out: Vec<usize>,
}

/// The largest operand the task accepts (answers stay a few characters long).
const MAX_OPERAND: i64 = 999;
/// The most targets (each keeps its valid answers: at most 2·MAX_OPERAND + 1 pairs).
const MAX_TARGETS: i64 = 1_000;

impl Decompose {
    pub fn new(config: DecomposeConfig) -> Result<Decompose, String> {
        let op = match config.op.as_str() {
            "+" => '+',
            "-" => '-',
            "*" => '*',
            other => {
                return Err(format!(
                    "task.op = {other:?}: use one of \"+\", \"-\", \"*\""
                ))
            }
        };
        if !(0..=MAX_OPERAND).contains(&config.max_operand) {
            return Err(format!(
                "task.max_operand = {} must be in 0..={MAX_OPERAND}",
                config.max_operand
            ));
        }
        if config.min_target > config.max_target {
            return Err(format!(
                "task.min_target = {} is larger than task.max_target = {}",
                config.min_target, config.max_target
            ));
        }
        let m = config.max_operand;
        let (lowest, highest) = match op {
            '+' => (0, 2 * m),
            '-' => (-m, m),
            _ => (0, m * m),
        };
        if config.min_target < lowest || config.max_target > highest {
            return Err(format!(
                "task.min_target..=task.max_target = {}..={} is outside {lowest}..={highest}, the values of a{op}b with operands in 0..=task.max_operand = {m}",
                config.min_target, config.max_target
            ));
        }
        let targets = config.max_target - config.min_target + 1;
        if targets > MAX_TARGETS {
            return Err(format!(
                "task.min_target..=task.max_target holds {targets} targets (at most {MAX_TARGETS})"
            ));
        }
        let mut answers = Vec::new();
        for target in config.min_target..=config.max_target {
            let valid: Vec<(i64, i64)> = (0..=m)
                .flat_map(|a| -> Vec<(i64, i64)> {
                    match op {
                        '+' => vec![(a, target - a)],
                        '-' => vec![(a, a - target)],
                        _ if a == 0 && target == 0 => (0..=m).map(|b| (0, b)).collect(),
                        _ if a == 0 => Vec::new(),
                        _ if target % a == 0 => vec![(a, target / a)],
                        _ => Vec::new(),
                    }
                })
                .filter(|(_, b)| (0..=m).contains(b))
                .collect();
            // `validity` binary-searches this list.
            debug_assert!(valid.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
            if valid.is_empty() {
                return Err(format!(
                    "task: the target {target} has no answer a{op}b with operands in 0..=task.max_operand = {m}; narrow task.min_target..=task.max_target"
                ));
            }
            answers.push((target, valid));
        }
        let (mut train, mut held_out) = (Vec::new(), Vec::new());
        for k in 0..answers.len() {
            if config.hold_out_every > 0 && k % config.hold_out_every == config.hold_out_every - 1 {
                held_out.push(k);
            } else {
                train.push(k);
            }
        }
        if train.is_empty() {
            return Err(format!(
                "task.hold_out_every = {} holds out every target of {}..={}: nothing is left to train on",
                config.hold_out_every, config.min_target, config.max_target
            ));
        }
        if held_out.is_empty() {
            if config.hold_out_every > 0 {
                return Err(format!(
                    "task.hold_out_every = {} holds out no target of {}..={} ({} targets); set it to at most {} or to 0 (evaluate on the training targets)",
                    config.hold_out_every,
                    config.min_target,
                    config.max_target,
                    answers.len(),
                    answers.len()
                ));
            }
            held_out = train.clone();
        }
        Ok(Decompose {
            config,
            op,
            answers,
            train,
            held_out,
        })
    }

    /// The targets trained on and the targets evaluated (the same when nothing is held out).
    pub fn targets(&self) -> (Vec<i64>, Vec<i64>) {
        let pick = |ks: &[usize]| ks.iter().map(|&k| self.answers[k].0).collect();
        (pick(&self.train), pick(&self.held_out))
    }

    /// The number of valid answers of each evaluated target.
    pub fn held_out_answers(&self) -> Vec<usize> {
        self.held_out
            .iter()
            .map(|&k| self.answers[k].1.len())
            .collect()
    }

    /// The longest answer, in characters.
    pub fn max_answer_chars(&self) -> usize {
        2 * self.config.max_operand.to_string().len() + 1
    }

    fn prompt(&self, k: usize) -> Result<Prompt, String> {
        let text = format!("{}=", self.answers[k].0);
        Ok(Prompt {
            ids: Tokenizer.encode(&text)?,
            text,
            answer: None,
            key: k,
        })
    }

    /// The valid answers of the target a prompt asks for (from its key, the index of its target;
    /// checked against its text).
    fn answers_of(&self, prompt: &Prompt) -> Result<&[(i64, i64)], String> {
        self.answers
            .get(prompt.key)
            .filter(|(target, _)| format!("{target}=") == prompt.text)
            .map(|(_, valid)| valid.as_slice())
            .ok_or_else(|| format!("prompt {:?} is not one of this task's", prompt.text))
    }

    /// 1 when `completion` is exactly a valid answer followed by `<eos>`: `a OP b` with `a` and `b`
    /// decimal numbers without leading zeros in `0..=max_operand` and `a OP b` equal to the target;
    /// else 0.
    pub fn validity(&self, prompt: &Prompt, completion: &[u32]) -> Result<f64, String> {
        let valid = self.answers_of(prompt)?;
        if !completion.contains(&EOS) {
            return Ok(0.0);
        }
        let text = Tokenizer.decode(completion);
        // Decimal digits without leading zeros: each answer has one spelling.
        let operand = |s: &str| -> Option<i64> {
            let canonical = !s.is_empty()
                && s.bytes().all(|c| c.is_ascii_digit())
                && (s == "0" || !s.starts_with('0'));
            if canonical {
                s.parse().ok()
            } else {
                None
            }
        };
        let found = text
            .split_once(self.op)
            .and_then(|(a, b)| Some((operand(a)?, operand(b)?)))
            .is_some_and(|pair| valid.binary_search(&pair).is_ok());
        Ok(if found { 1.0 } else { 0.0 })
    }
}

/// The partition class of each completion within its group of `n` (the first completion of a class
/// numbers it: 0, 1, 2, …): two completions share a class when their tokens up to and including the
/// first `<eos>` are the same.
pub fn classes(completions: &[Vec<u32>], n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(completions.len());
    for group in completions.chunks(n.max(1)) {
        let mut seen: Vec<&[u32]> = Vec::new();
        for c in group {
            let key = answer_tokens(c);
            let class = match seen.iter().position(|s| *s == key) {
                Some(i) => i,
                None => {
                    seen.push(key);
                    seen.len() - 1
                }
            };
            out.push(class as f64);
        }
    }
    out
}

/// A completion's tokens up to and including the first `<eos>` (what identifies its answer).
fn answer_tokens(completion: &[u32]) -> &[u32] {
    match completion.iter().position(|&t| t == EOS) {
        Some(i) => &completion[..=i],
        None => completion,
    }
}

impl Task for Decompose {
    fn name(&self) -> String {
        let (train, held) = self.targets();
        format!(
            "decompose (N = a{}b, N in {}..={}, operands 0..={}; {} targets trained, {} evaluated)",
            self.op,
            self.config.min_target,
            self.config.max_target,
            self.config.max_operand,
            train.len(),
            held.len()
        )
    }

    fn stop_tokens(&self) -> Vec<u32> {
        vec![EOS]
    }

    fn signals(&self) -> Vec<String> {
        vec!["score".into(), "quality".into(), "cluster".into()]
    }

    fn prompts(&self, rng: &mut Rng, count: usize) -> Result<Vec<Prompt>, String> {
        (0..count)
            .map(|_| self.prompt(self.train[rng.int(0, self.train.len() - 1)]))
            .collect()
    }

    fn signal(
        &self,
        name: &str,
        prompts: &[Prompt],
        completions: &[Vec<u32>],
        n: usize,
    ) -> Result<Vec<f64>, String> {
        check_counts(prompts, completions, n)?;
        match name {
            "score" | "quality" => completions
                .iter()
                .enumerate()
                .map(|(r, c)| self.validity(&prompts[r / n], c))
                .collect(),
            "cluster" => Ok(classes(completions, n)),
            _ => Err(format!(
                "the decompose task has no signal `{name}` (it fills `score`, `quality` and `cluster`)"
            )),
        }
    }

    fn correct(&self, prompt: &Prompt, completion: &[u32]) -> Option<f64> {
        self.validity(prompt, completion).ok()
    }

    fn answer_class(&self, _prompt: &Prompt, completion: &[u32]) -> Option<Vec<u32>> {
        Some(answer_tokens(completion).to_vec())
    }

    fn is_class(&self, name: &str) -> bool {
        name == "cluster"
    }

    fn eval_prompts(&self, _seed: u64) -> Result<Vec<Prompt>, String> {
        self.held_out.iter().map(|&k| self.prompt(k)).collect()
    }

    fn supervised(&self, rng: &mut Rng, count: usize) -> Result<Option<Examples>, String> {
        let mut examples = Vec::with_capacity(count);
        for _ in 0..count {
            let k = self.train[rng.int(0, self.train.len() - 1)];
            let valid = &self.answers[k].1;
            let (a, b) = valid[rng.int(0, valid.len() - 1)];
            let mut target = Tokenizer.encode(&format!("{a}{}{b}", self.op))?;
            target.push(EOS);
            examples.push((self.prompt(k)?.ids, target));
        }
        Ok(Some(examples))
    }

    fn max_prompt_tokens(&self) -> usize {
        let chars = |t: i64| t.to_string().len();
        chars(self.config.min_target).max(chars(self.config.max_target)) + 1
    }

    fn decode(&self, ids: &[u32]) -> String {
        Tokenizer.decode(ids)
    }
}
